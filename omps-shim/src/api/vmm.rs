//! Virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap, ...), as
//! PyTorch's `expandable_segments:True` allocator uses it. The server does the work in the
//! shared context and keeps each client's reservations and handles apart; the shim keeps
//! what the program may ask back (properties, which handle backs an address, reference
//! counts) and the mapped ranges, so copies into them are checked like any allocation.
//! Access may be set for the process's other devices too (NCCL's cuMem transport): the
//! server checks and grants it for whole mappings (omps-server/src/session/vmm.rs).

use crate::cuda::*;
use crate::state::entry::{entry, live, out};
use crate::state::ranges::{add_range, range_info, remove_range};
use omps_ring::wire::{self, vmm, Op};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_uint, c_ulonglong};
use std::sync::Mutex;

/// The fields of CUmemAllocationProp (CUDA 13: 32 bytes) that omps reads.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct AllocProp {
    kind: c_uint,
    handle_types: c_uint,
    location_type: c_uint,
    location_id: c_int,
    win32: u64,
    compression: u8,
    rdma: u8,
    usage: u16,
    reserved: [u8; 4],
}

/// CUmemAccessDesc: a location and access flags.
#[repr(C)]
pub struct AccessDesc {
    pub(crate) location_type: c_uint,
    pub(crate) location_id: c_int,
    pub(crate) flags: c_uint,
}

const PINNED: c_uint = 1;
/// CU_MEM_ALLOCATION_COMP_GENERIC: compressible memory.
const COMP_GENERIC: u8 = 1;
const LOCATION_DEVICE: c_uint = 1;
const ACCESS_READWRITE: c_uint = 3;

#[derive(Default)]
pub(crate) struct Books {
    /// Program handle -> (device, size, references, requested handle types, granted
    /// compression type).
    pub(crate) handles: HashMap<u64, (usize, u64, u32, c_uint, u8)>,
    /// Mapping start -> (size, program handle, devices with read-write access, bit per
    /// device).
    mappings: BTreeMap<u64, (u64, u64, u64)>,
    /// Imported handles whose memory lives on another device than the one whose session
    /// holds them: handle -> that device.
    pub(crate) homes: HashMap<u64, usize>,
    /// Reservation start -> the device whose worker holds it.
    reservations: BTreeMap<u64, usize>,
}

static BOOKS: Mutex<Option<Books>> = Mutex::new(None);

pub(crate) fn books<R>(f: impl FnOnce(&mut Books) -> R) -> R {
    f(BOOKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(Books::default))
}

fn call(dev: usize, kind: u32, handle: u32, args: [u64; 3]) -> Result<u64, CUresult> {
    call_raw::<wire::U64Reply>(dev, kind, handle, args).map(|r| r.value)
}

/// A VMM call whose answer is a `T`.
pub(crate) fn call_raw<T: bytemuck::Pod>(
    dev: usize,
    kind: u32,
    handle: u32,
    args: [u64; 3],
) -> Result<T, CUresult> {
    call_on(live()?, dev, kind, handle, args)
}

/// A VMM call on connection `c` whose answer is a `T` (the tests' raw connections too).
pub fn call_on<T: bytemuck::Pod>(
    c: &crate::conn::Conn,
    dev: usize,
    kind: u32,
    handle: u32,
    args: [u64; 3],
) -> Result<T, CUresult> {
    let mut ch = c.channel();
    ch.call(dev, Op::Vmm, |call| {
        bytemuck::bytes_of(&wire::Vmm {
            call,
            kind,
            handle,
            args,
        })
        .to_vec()
    })?;
    Ok(ch.reply::<T>())
}

/// The device a property block names, refusing what omps cannot give.
///
/// # Safety
/// `prop` is null or a CUmemAllocationProp.
unsafe fn prop_device(prop: *const AllocProp) -> Result<usize, CUresult> {
    if prop.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null; the caller's property block.
    let p = unsafe { *prop };
    if p.kind != PINNED || p.location_type != LOCATION_DEVICE {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // CU_MEM_ALLOCATION_COMP_GENERIC is passed to the driver, which grants it or not
    // (the server checks the value too).
    if p.compression > COMP_GENERIC {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Shareable handle types may be asked for: POSIX descriptors are shared between this
    // server's clients (vmm_share.rs). Fabric handles are refused as the driver refuses
    // them where no fabric is set up (NOT_PERMITTED): PyTorch's expandable segments try
    // them first and then fall back to POSIX descriptors.
    const FABRIC: c_uint = 8;
    const NOT_PERMITTED: CUresult = 800;
    if p.handle_types & FABRIC != 0 {
        return Err(NOT_PERMITTED);
    }
    crate::state::device::device(p.location_id)?;
    Ok(p.location_id as usize)
}

/// # Safety
/// `ptr` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    align: usize,
    hint: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    entry(|| {
        if flags != 0 || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // A reservation is of the address space all devices share; the server keeps it on
        // the current device's worker.
        let dev = crate::state::ctx::current_dev()?;
        let p = call(dev, vmm::RESERVE, 0, [size as u64, align as u64, hint])?;
        books(|b| b.reservations.insert(p, dev));
        // SAFETY: the caller's pointer.
        unsafe { out(ptr, p) }
    })
}

fn reservation_dev(addr: u64) -> Result<usize, CUresult> {
    books(|b| b.reservations.range(..=addr).next_back().map(|(_, &d)| d))
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

#[no_mangle]
pub extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    entry(|| {
        let dev = reservation_dev(ptr)?;
        call(dev, vmm::ADDRESS_FREE, 0, [ptr, size as u64, 0])?;
        books(|b| b.reservations.remove(&ptr));
        Ok(())
    })
}

/// # Safety
/// `handle` is null or writable; `prop` is null or a CUmemAllocationProp.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const AllocProp,
    flags: c_ulonglong,
) -> CUresult {
    entry(|| {
        // SAFETY: forwarded contract.
        let dev = unsafe { prop_device(prop)? };
        if flags != 0 || size == 0 || handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked by prop_device.
        let p = unsafe { *prop };
        let [id, granted]: [u64; 2] =
            call_raw(dev, vmm::CREATE, 0, [size as u64, p.compression as u64, 0])?;
        // The device rides in the high half, so the handle names its worker.
        let h = ((dev as u64 + 1) << 32) | id;
        let entry = (dev, size as u64, 1, p.handle_types, granted as u8);
        books(|b| b.handles.insert(h, entry));
        // SAFETY: the caller's pointer, non-null.
        unsafe { out(handle, h) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemRelease(h: u64) -> CUresult {
    entry(|| {
        let gone = books(|b| {
            let e = b.handles.get_mut(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            e.2 -= 1;
            let dev = e.0;
            if e.2 == 0 {
                b.handles.remove(&h);
                b.homes.remove(&h);
            }
            Ok::<_, CUresult>((dev, !b.handles.contains_key(&h)))
        })?;
        match gone {
            (dev, true) => call(dev, vmm::RELEASE, h as u32, [0; 3]).map(drop),
            _ => Ok(()),
        }
    })
}

#[no_mangle]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    h: u64,
    flags: c_ulonglong,
) -> CUresult {
    entry(|| {
        let dev = books(|b| b.handles.get(&h).map(|e| e.0)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Each device's session keeps its own reservations and handles: a handle made (or
        // imported) while one device was current maps only into a reservation made while
        // the same one was. NCCL and PyTorch keep to one device per pair.
        if reservation_dev(ptr).is_ok_and(|r| r != dev) {
            return Err(crate::unsupported::unsupported(
                "cuMemMap of a handle into a reservation made while another device was current",
            ));
        }
        call(dev, vmm::MAP, h as u32, [ptr, size as u64, offset as u64])?;
        books(|b| b.mappings.insert(ptr, (size as u64, h, 0)));
        add_range(ptr, size as u64, dev, false);
        Ok(())
    })
}

/// The mappings `[ptr, ptr+size)` consists of, whole: (start, size, handle).
fn whole_mappings(ptr: u64, size: u64) -> Result<Vec<(u64, u64, u64)>, CUresult> {
    books(|b| {
        let parts: Vec<_> = b
            .mappings
            .range(ptr..ptr.saturating_add(size))
            .map(|(&s, &(n, h, _))| (s, n, h))
            .collect();
        let covered: u64 = parts.iter().map(|p| p.1).sum();
        match parts.first() {
            Some(&(s, _, _)) if s == ptr && covered == size => Ok(parts),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    })
}

#[no_mangle]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    entry(|| {
        for (s, n, h) in whole_mappings(ptr, size as u64)? {
            let dev = books(|b| b.handles.get(&h).map(|e| e.0))
                .map_or_else(|| range_info(s).map(|r| r.2), Some)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            call(dev, vmm::UNMAP, 0, [s, n, 0])?;
            books(|b| b.mappings.remove(&s));
            remove_range(s);
        }
        Ok(())
    })
}

/// Read-write access for any of the process's devices (the memory's own, or another the
/// server's GPUs reach it from, as NCCL asks for its peers); read-only access and taking
/// access away are not built. Access for another device is granted for whole mappings.
///
/// # Safety
/// `desc` is null or `count` access descriptors.
#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const AccessDesc,
    count: usize,
) -> CUresult {
    entry(|| {
        if desc.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (_, _, dev) = range_info(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: non-null; `count` descriptors, per the contract.
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        let mut mask = 0u64;
        for d in descs {
            if d.location_type != LOCATION_DEVICE {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            crate::state::device::device(d.location_id)?;
            if d.flags != ACCESS_READWRITE {
                return Err(crate::unsupported::unsupported(
                    "cuMemSetAccess other than read-write (read-only, or taking access away)",
                ));
            }
            mask |= 1 << d.location_id;
        }
        // Its own device alone is the server's default (0).
        let asked = if mask == 1 << dev { 0 } else { mask };
        call(dev, vmm::SET_ACCESS, 0, [ptr, size as u64, asked])?;
        books(|b| {
            for (_, m) in b.mappings.range_mut(ptr..ptr.saturating_add(size as u64)) {
                m.2 |= mask;
            }
        });
        Ok(())
    })
}

/// # Safety
/// `flags` is null or writable; `loc` is null or a CUmemLocation.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut c_ulonglong,
    loc: *const [c_int; 2],
    ptr: CUdeviceptr,
) -> CUresult {
    entry(|| {
        if loc.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null; the caller's CUmemLocation.
        let [ty, id] = unsafe { *loc };
        let (start, _, _) = range_info(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let set = books(|b| b.mappings.get(&start).map(|m| m.2)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let has =
            ty == LOCATION_DEVICE as c_int && (0..64).contains(&id) && set & (1u64 << id) != 0;
        // SAFETY: the caller's pointer.
        unsafe { out(flags, if has { ACCESS_READWRITE as u64 } else { 0 }) }
    })
}

/// # Safety
/// `g` is null or writable; `prop` is null or a CUmemAllocationProp.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    g: *mut usize,
    prop: *const AllocProp,
    option: c_uint,
) -> CUresult {
    entry(|| {
        // SAFETY: forwarded contract.
        let dev = unsafe { prop_device(prop)? };
        if option > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked by prop_device.
        let comp = unsafe { (*prop).compression };
        let v = call(dev, vmm::GRANULARITY, 0, [option as u64, comp as u64, 0])?;
        // SAFETY: the caller's pointer.
        unsafe { out(g, v as usize) }
    })
}

/// # Safety
/// `prop` is null or writable for a CUmemAllocationProp.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut AllocProp,
    h: u64,
) -> CUresult {
    entry(|| {
        let ((dev, _, _, types, compression), home) =
            books(|b| Some((*b.handles.get(&h)?, b.homes.get(&h).copied())))
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // What the driver granted, which may be less than was asked; where the memory
        // lives (an imported handle's may be another device than its session's).
        let p = AllocProp {
            kind: PINNED,
            handle_types: types,
            location_type: LOCATION_DEVICE,
            location_id: home.unwrap_or(dev) as c_int,
            compression,
            ..Default::default()
        };
        // SAFETY: the caller's pointer.
        unsafe { out(prop, p) }
    })
}

/// The handle backing a mapped address, with one more reference (released with
/// cuMemRelease, as natively).
///
/// # Safety
/// `h` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    h: *mut u64,
    addr: *mut std::ffi::c_void,
) -> CUresult {
    entry(|| {
        let a = addr as u64;
        let handle = books(|b| {
            let (&s, &(n, handle, _)) = b.mappings.range(..=a).next_back()?;
            (a < s + n).then_some(handle)
        })
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        books(|b| b.handles.get_mut(&handle).map(|e| e.2 += 1)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's pointer.
        unsafe { out(h, handle) }
    })
}
