//! A memory pool's attributes (cuMemPoolSetAttribute, cuMemPoolGetAttribute) and other
//! devices' access to it (cuMemPoolSetAccess, cuMemPoolGetAccess): the pool's settings,
//! apart from allocating and freeing in it (pool.rs).

use super::pool::{lock, pool, trim, CUmemoryPool, LOCATION_DEVICE};
use crate::cuda::*;
use crate::state::entry::{entry, out};
use std::ffi::{c_int, c_uint, c_void};

const ATTR_RELEASE_THRESHOLD: c_int = 4;
const ATTR_RESERVED_CURRENT: c_int = 5;
const ATTR_RESERVED_HIGH: c_int = 6;
const ATTR_USED_CURRENT: c_int = 7;
const ATTR_USED_HIGH: c_int = 8;

/// # Safety
/// `v` is null or points at an int (attributes 1-3) or a u64 (4-8).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    p: CUmemoryPool,
    attr: c_int,
    v: *const c_void,
) -> CUresult {
    entry(|| {
        let pl = pool(p)?;
        if v.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut st = lock(&pl.state);
        // SAFETY: non-null; the attribute says the value's type.
        unsafe {
            match attr {
                1..=3 => st.reuse[attr as usize - 1] = *(v as *const c_int),
                ATTR_RELEASE_THRESHOLD => st.release_threshold = *(v as *const u64),
                // Only resetting a high watermark (to 0) is allowed, as with the driver.
                ATTR_RESERVED_HIGH if *(v as *const u64) == 0 => st.reserved_high = st.reserved(),
                ATTR_USED_HIGH if *(v as *const u64) == 0 => st.used_high = st.used,
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
        }
        let threshold = st.release_threshold;
        drop(st);
        trim(pl, threshold);
        Ok(())
    })
}

/// # Safety
/// `v` is null or points at room for an int (attributes 1-3) or a u64 (4-8).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    p: CUmemoryPool,
    attr: c_int,
    v: *mut c_void,
) -> CUresult {
    entry(|| {
        let st = lock(&pool(p)?.state);
        if v.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let value = match attr {
            1..=3 => {
                // SAFETY: non-null; an int attribute.
                unsafe { *(v as *mut c_int) = st.reuse[attr as usize - 1] };
                return Ok(());
            }
            ATTR_RELEASE_THRESHOLD => st.release_threshold,
            ATTR_RESERVED_CURRENT => st.reserved(),
            ATTR_RESERVED_HIGH => st.reserved_high,
            ATTR_USED_CURRENT => st.used,
            ATTR_USED_HIGH => st.used_high,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: non-null; a u64 attribute.
        unsafe { *(v as *mut u64) = value };
        Ok(())
    })
}

/// Access to a pool's memory from another device. Its blocks are the server's allocations
/// on the pool's GPU, which another GPU's kernels reach once the server's context there
/// has peer access to it: so access is asked as cuCtxEnablePeerAccess asks it, and from
/// then on what the process frees waits for its work on every GPU (R14). Read-only access
/// and taking access away are not built.
///
/// # Safety
/// `map` is null or `count` access descriptors.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    p: CUmemoryPool,
    map: *const super::vmm::AccessDesc,
    count: usize,
) -> CUresult {
    entry(|| {
        let pl = pool(p)?;
        if count == 0 {
            return Ok(());
        }
        if map.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null; `count` descriptors, per the contract.
        let descs = unsafe { std::slice::from_raw_parts(map, count) };
        let mut peers = Vec::new();
        for d in descs {
            if d.location_type != LOCATION_DEVICE {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            crate::state::device::device(d.location_id)?;
            let dev = d.location_id as usize;
            match (dev == pl.dev, d.flags) {
                (true, 3) => {}
                // The pool's own device keeps its access, as natively.
                (true, _) => return Err(CUDA_ERROR_INVALID_VALUE),
                (false, 3) if crate::state::copies::can_reach(dev, pl.dev) => peers.push(dev),
                (false, 3) => return Err(CUDA_ERROR_INVALID_DEVICE),
                (false, _) => return Err(crate::unsupported::unsupported(
                    "cuMemPoolSetAccess other than read-write (read-only, or taking access away)",
                )),
            }
        }
        for dev in peers {
            crate::state::copies::ask_server(dev, pl.dev)?;
            lock(&pl.state).peers |= 1 << dev;
        }
        Ok(())
    })
}

/// A pool's own device has read-write access, and the devices cuMemPoolSetAccess gave it.
///
/// # Safety
/// `flags` is null or writable; `loc` is null or a CUmemLocation.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAccess(
    flags: *mut c_uint,
    p: CUmemoryPool,
    loc: *const [c_int; 2],
) -> CUresult {
    entry(|| {
        let pl = pool(p)?;
        if loc.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null; the caller's CUmemLocation {type, id}.
        let [ty, id] = unsafe { *loc };
        let peers = lock(&pl.state).peers;
        let has = ty == LOCATION_DEVICE as c_int
            && (id as usize == pl.dev || ((0..64).contains(&id) && peers & (1 << id) != 0));
        // SAFETY: the caller's pointer. CU_MEM_ACCESS_FLAGS_PROT_READWRITE is 3.
        unsafe { out(flags, if has { 3 } else { 0 }) }
    })
}
