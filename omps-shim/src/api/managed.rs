//! Managed memory: one pointer valid on the client's CPU and on the GPU.
//!
//! The driver's managed memory would be the server's, at addresses the client cannot
//! reach. omps makes it from the memory page-locked allocations use (hostmem.rs): a memfd
//! mapped at the same address in the client and the server and registered with the GPU,
//! and also one of the client's device ranges, so copies, memsets and kernels take it as
//! device memory. The pages stay in host memory: the GPU reads and writes them over the
//! bus where the driver would migrate them (docs/benchmarks.md has the cost), so a
//! prefetch has nothing to move and the CPU and the GPU may touch the memory at once (as
//! on a device with concurrent managed access). Advice and prefetch locations are kept per
//! 4 KiB page and read back by cuMemRangeGetAttribute(s) as the driver answers them.
//! `__managed__` variables of modules are not supported (docs/design.md, section 13).

use crate::cuda::*;
use crate::state::entry::{entry, out};
use crate::state::host_ranges::{free_host, host_alloc, managed_range, MANAGED};
use crate::state::ranges::{add_range, remove_range};
use crate::state::streams::{stream_of, CUstream};
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{LazyLock, Mutex};

const PAGE: usize = 4096;

/// CUmemLocation.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MemLocation {
    pub ty: c_uint,
    pub id: c_int,
}

/// CUmemLocationType values.
const LOC_INVALID: c_uint = 0;
const LOC_DEVICE: c_uint = 1;
const LOC_HOST: c_uint = 2;
const LOC_HOST_NUMA: c_uint = 3;
const LOC_HOST_NUMA_CURRENT: c_uint = 4;
/// CU_DEVICE_CPU and CU_DEVICE_INVALID.
const DEVICE_CPU: c_int = -1;
const DEVICE_INVALID: c_int = -2;
const NOWHERE: MemLocation = MemLocation {
    ty: LOC_INVALID,
    id: 0,
};

/// What the program said of one page.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Page {
    read_mostly: bool,
    preferred: MemLocation,
    /// Devices (bit per ordinal) the page is advised to be accessed by.
    accessed_by: u64,
    last_prefetch: MemLocation,
}

const UNADVISED: Page = Page {
    read_mostly: false,
    preferred: NOWHERE,
    accessed_by: 0,
    last_prefetch: NOWHERE,
};

/// Managed allocation start -> its pages' advice (made at the first advice or prefetch).
static PAGES: LazyLock<Mutex<HashMap<usize, Vec<Page>>>> = LazyLock::new(Default::default);

fn pages() -> std::sync::MutexGuard<'static, HashMap<usize, Vec<Page>>> {
    PAGES.lock().unwrap_or_else(|e| e.into_inner())
}

/// The managed allocation holding all of `[p, p+len)` and the pages the range touches:
/// (start, allocation length, first page, end page).
fn span(p: u64, len: usize) -> Result<(usize, usize, usize, usize), CUresult> {
    let (start, n) = managed_range(p as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let end = (p as usize)
        .checked_add(len)
        .filter(|&e| len > 0 && e <= start + n)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok((
        start,
        n,
        (p as usize - start) / PAGE,
        (end - start).div_ceil(PAGE),
    ))
}

fn edit(p: u64, len: usize, f: impl Fn(&mut Page)) -> Result<(), CUresult> {
    let (start, n, first, end) = span(p, len)?;
    let mut all = pages();
    let v = all
        .entry(start)
        .or_insert_with(|| vec![UNADVISED; n.div_ceil(PAGE)]);
    v[first..end].iter_mut().for_each(f);
    Ok(())
}

fn read(p: u64, len: usize) -> Result<Vec<Page>, CUresult> {
    let (start, _, first, end) = span(p, len)?;
    Ok(match pages().get(&start) {
        Some(v) => v[first..end].to_vec(),
        None => vec![UNADVISED; end - first],
    })
}

/// A location the program names for advice or a prefetch: a device of this client's, or
/// the host.
fn check_location(l: MemLocation) -> Result<MemLocation, CUresult> {
    match l.ty {
        LOC_DEVICE => crate::state::device::device(l.id).map(|_| l),
        LOC_HOST | LOC_HOST_NUMA | LOC_HOST_NUMA_CURRENT => Ok(l),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// The location a legacy device argument names (CU_DEVICE_CPU: the host).
fn legacy_location(dev: c_int) -> MemLocation {
    if dev == DEVICE_CPU {
        MemLocation {
            ty: LOC_HOST,
            id: 0,
        }
    } else {
        MemLocation {
            ty: LOC_DEVICE,
            id: dev,
        }
    }
}

/// The legacy form of a location: a device ordinal, CU_DEVICE_CPU, or CU_DEVICE_INVALID.
fn legacy_id(l: MemLocation) -> c_int {
    match l.ty {
        LOC_DEVICE => l.id,
        LOC_HOST | LOC_HOST_NUMA | LOC_HOST_NUMA_CURRENT => DEVICE_CPU,
        _ => DEVICE_INVALID,
    }
}

/// # Safety
/// `dptr` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> CUresult {
    const ATTACH_GLOBAL: c_uint = 1;
    const ATTACH_HOST: c_uint = 2;
    entry(|| {
        if dptr.is_null() || size == 0 || !matches!(flags, ATTACH_GLOBAL | ATTACH_HOST) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = crate::state::ctx::current_dev()?;
        let p = host_alloc(size, MANAGED)? as u64;
        // A device range too (not freeable as device memory: cuMemFree comes here).
        let len = size.next_multiple_of(PAGE) as u64;
        add_range(p, len, dev, false);
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(dptr, p) }
    })
}

/// cuMemFree of managed memory: Some(result), or None for other memory.
pub(crate) fn free(p: u64) -> Option<Result<(), CUresult>> {
    match managed_range(p as usize) {
        Some((start, _)) if start == p as usize => {
            pages().remove(&start);
            remove_range(p);
            Some(free_host(start, true))
        }
        Some(_) => Some(Err(CUDA_ERROR_INVALID_VALUE)),
        None => None,
    }
}

/// A prefetch moves nothing (the pages stay where both sides reach them); it is checked
/// and ordered as the driver's, and its location is what the range reports afterwards.
fn prefetch(
    p: u64,
    len: usize,
    to: MemLocation,
    flags: c_uint,
    s: CUstream,
) -> Result<(), CUresult> {
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let to = check_location(to)?;
    stream_of(s)?;
    span(p, len)?;
    edit(p, len, |pg| pg.last_prefetch = to)
}

#[no_mangle]
pub extern "C" fn cuMemPrefetchAsync_v2(
    p: CUdeviceptr,
    len: usize,
    to: MemLocation,
    flags: c_uint,
    s: CUstream,
) -> CUresult {
    entry(|| prefetch(p, len, to, flags, s))
}

#[no_mangle]
pub extern "C" fn cuMemPrefetchAsync(
    p: CUdeviceptr,
    len: usize,
    dev: c_int,
    s: CUstream,
) -> CUresult {
    entry(|| prefetch(p, len, legacy_location(dev), 0, s))
}

/// CUmem_advise values.
const SET_READ_MOSTLY: c_uint = 1;
const UNSET_READ_MOSTLY: c_uint = 2;
const SET_PREFERRED_LOCATION: c_uint = 3;
const UNSET_PREFERRED_LOCATION: c_uint = 4;
const SET_ACCESSED_BY: c_uint = 5;
const UNSET_ACCESSED_BY: c_uint = 6;

fn advise(p: u64, len: usize, advice: c_uint, at: MemLocation) -> Result<(), CUresult> {
    let device_bit = || -> Result<u64, CUresult> {
        // Accessed-by names a device, never the host.
        match check_location(at)? {
            MemLocation { ty: LOC_DEVICE, id } if (0..64).contains(&id) => Ok(1 << id),
            _ => Err(CUDA_ERROR_INVALID_DEVICE),
        }
    };
    match advice {
        SET_READ_MOSTLY => edit(p, len, |pg| pg.read_mostly = true),
        UNSET_READ_MOSTLY => edit(p, len, |pg| pg.read_mostly = false),
        SET_PREFERRED_LOCATION => {
            let at = check_location(at)?;
            edit(p, len, |pg| pg.preferred = at)
        }
        UNSET_PREFERRED_LOCATION => edit(p, len, |pg| pg.preferred = NOWHERE),
        SET_ACCESSED_BY => {
            let bit = device_bit()?;
            edit(p, len, |pg| pg.accessed_by |= bit)
        }
        UNSET_ACCESSED_BY => {
            let bit = device_bit()?;
            edit(p, len, |pg| pg.accessed_by &= !bit)
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

#[no_mangle]
pub extern "C" fn cuMemAdvise_v2(
    p: CUdeviceptr,
    len: usize,
    advice: c_uint,
    at: MemLocation,
) -> CUresult {
    entry(|| advise(p, len, advice, at))
}

#[no_mangle]
pub extern "C" fn cuMemAdvise(p: CUdeviceptr, len: usize, advice: c_uint, dev: c_int) -> CUresult {
    entry(|| advise(p, len, advice, legacy_location(dev)))
}

/// Attaching decides which streams may touch the memory on devices without concurrent
/// managed access; here the CPU and the GPU always may, so the call is checked and
/// changes nothing, as on such a device natively.
#[no_mangle]
pub extern "C" fn cuStreamAttachMemAsync(
    s: CUstream,
    p: CUdeviceptr,
    len: usize,
    flags: c_uint,
) -> CUresult {
    const GLOBAL: c_uint = 1;
    const HOST: c_uint = 2;
    const SINGLE: c_uint = 4;
    entry(|| {
        if !matches!(flags, GLOBAL | HOST | SINGLE) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        stream_of(s)?;
        let (start, n) = managed_range(p as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // Length 0 or the whole allocation, from its start.
        if p as usize != start || (len != 0 && len.next_multiple_of(PAGE) != n) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    })
}

/// CUmem_range_attribute values.
const RA_READ_MOSTLY: c_uint = 1;
const RA_PREFERRED_LOCATION: c_uint = 2;
const RA_ACCESSED_BY: c_uint = 3;
const RA_LAST_PREFETCH_LOCATION: c_uint = 4;
const RA_PREFERRED_LOCATION_TYPE: c_uint = 5;
const RA_PREFERRED_LOCATION_ID: c_uint = 6;
const RA_LAST_PREFETCH_LOCATION_TYPE: c_uint = 7;
const RA_LAST_PREFETCH_LOCATION_ID: c_uint = 8;

/// One location the whole range shares, or none.
fn common(v: &[Page], f: impl Fn(&Page) -> MemLocation) -> MemLocation {
    let first = f(&v[0]);
    if v.iter().all(|pg| f(pg) == first) {
        first
    } else {
        NOWHERE
    }
}

/// One attribute of the range, as the int values the driver writes.
fn range_attribute(attr: c_uint, room: usize, v: &[Page]) -> Result<Vec<c_int>, CUresult> {
    let one = |x: c_int| -> Result<Vec<c_int>, CUresult> {
        if room != 4 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(vec![x])
    };
    let preferred = common(v, |pg| pg.preferred);
    let prefetched = common(v, |pg| pg.last_prefetch);
    match attr {
        RA_READ_MOSTLY => one(c_int::from(v.iter().all(|pg| pg.read_mostly))),
        RA_PREFERRED_LOCATION => one(legacy_id(preferred)),
        RA_PREFERRED_LOCATION_TYPE => one(preferred.ty as c_int),
        RA_PREFERRED_LOCATION_ID => one(preferred.id),
        RA_LAST_PREFETCH_LOCATION => one(legacy_id(prefetched)),
        RA_LAST_PREFETCH_LOCATION_TYPE => one(prefetched.ty as c_int),
        RA_LAST_PREFETCH_LOCATION_ID => one(prefetched.id),
        RA_ACCESSED_BY => {
            if room == 0 || !room.is_multiple_of(4) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let all = v.iter().fold(u64::MAX, |m, pg| m & pg.accessed_by);
            let mut out: Vec<c_int> = (0..64).filter(|d| all & (1 << d) != 0).collect();
            out.resize(room / 4, DEVICE_INVALID);
            out.truncate(room / 4);
            Ok(out)
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// # Safety
/// `data` is null or writable for `size` bytes.
unsafe fn write_attribute(
    data: *mut c_void,
    size: usize,
    attr: c_uint,
    v: &[Page],
) -> Result<(), CUresult> {
    if data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let vals = range_attribute(attr, size, v)?;
    // SAFETY: the caller's buffer of `size` bytes; vals holds size / 4 ints.
    unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), data as *mut c_int, vals.len()) };
    Ok(())
}

/// # Safety
/// `data` is null or writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemRangeGetAttribute(
    data: *mut c_void,
    size: usize,
    attr: c_uint,
    p: CUdeviceptr,
    len: usize,
) -> CUresult {
    entry(|| {
        let v = read(p, len)?;
        // SAFETY: forwarded contract.
        unsafe { write_attribute(data, size, attr, &v) }
    })
}

/// # Safety
/// `data`, `sizes` and `attrs` are null or hold `n` entries; each `data[i]` is writable
/// for `sizes[i]` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemRangeGetAttributes(
    data: *mut *mut c_void,
    sizes: *const usize,
    attrs: *const c_uint,
    n: usize,
    p: CUdeviceptr,
    len: usize,
) -> CUresult {
    entry(|| {
        if n == 0 || data.is_null() || sizes.is_null() || attrs.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = read(p, len)?;
        for i in 0..n {
            // SAFETY: n entries each, per the contract.
            let (d, size, attr) = unsafe { (*data.add(i), *sizes.add(i), *attrs.add(i)) };
            // SAFETY: forwarded contract.
            unsafe { write_attribute(d, size, attr, &v) }?;
        }
        Ok(())
    })
}
