//! Memory pools shared between processes, as NVIDIA's streamOrderedAllocationIPC sample
//! shares them: cuMemPoolExportToShareableHandle gives a POSIX descriptor for a pool made
//! exportable, another process imports the pool by it, and then imports single
//! allocations of the pool by the 64 bytes cuMemPoolExportPointer wrote.
//!
//! The descriptor is a small memfd holding the server's token for the pool, as VMM
//! handles are shared (vmm_share.rs). The server checks every step
//! (omps-server/src/session/pool_share.rs): a pool is imported only by its token, an
//! allocation only through the pool it was exported from. An imported allocation is the
//! exporter's own device pointer; freeing it (cuMemFree or cuMemFreeAsync) gives up this
//! process's hold, and the exporter's free leaves the memory to the last importer.

use super::pool::{new_pool, pool, CUmemoryPool, Pool, Share};
use super::vmm::call_raw;
use super::vmm_share::{read_descriptor, write_descriptor, POSIX_FD};
use crate::cuda::*;
use crate::state::entry::{entry, out};
use omps_ring::wire::vmm;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

const POOL_MAGIC: [u8; 8] = *b"omps-pol";
const PTR_MAGIC: [u8; 8] = *b"omps-ppt";

/// # Safety
/// `handle` is null or a writable int.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolExportToShareableHandle(
    handle: *mut c_void,
    p: CUmemoryPool,
    ty: c_uint,
    flags: c_ulonglong,
) -> CUresult {
    entry(|| {
        let pl = pool(p)?;
        if handle.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Only as the pool was made exportable, and only the pool's owner exports it.
        if ty != POSIX_FD || pl.share.handle_types & ty == 0 || pl.share.imported.is_some() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let [lo, hi, key]: [u64; 3] = call_raw(pl.dev, vmm::POOL_EXPORT, pl.share.number, [0; 3])?;
        *pl.share.exported.lock().unwrap_or_else(|e| e.into_inner()) = Some(key);
        let mut token = [0u8; 16];
        token[..8].copy_from_slice(&lo.to_le_bytes());
        token[8..].copy_from_slice(&hi.to_le_bytes());
        let fd = write_descriptor(POOL_MAGIC, pl.dev, &token)?;
        // SAFETY: checked non-null; the caller's int.
        unsafe { out(handle as *mut c_int, fd) }
    })
}

/// # Safety
/// `out_pool` is null or writable; `handle` is a descriptor, passed as a pointer-sized
/// value.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolImportFromShareableHandle(
    out_pool: *mut CUmemoryPool,
    handle: *mut c_void,
    ty: c_uint,
    flags: c_ulonglong,
) -> CUresult {
    entry(|| {
        if out_pool.is_null() || flags != 0 || ty != POSIX_FD {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (dev, [lo, hi]) = read_descriptor(handle as usize as c_int, POOL_MAGIC)?;
        let [key, ..]: [u64; 3] = call_raw(dev, vmm::POOL_IMPORT, 0, [lo, hi, 0])?;
        let share = Share {
            handle_types: ty,
            imported: Some(key),
            ..Default::default()
        };
        let pl = new_pool(dev, false, share);
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(out_pool, pl as *const Pool as CUmemoryPool) }
    })
}

/// CUmemPoolPtrExportData: 64 opaque bytes. omps writes a magic, the server's token for
/// the allocation, its size and its device.
#[repr(C)]
pub struct PtrExportData {
    pub reserved: [u8; 64],
}

/// # Safety
/// `data` is null or writable for 64 bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolExportPointer(data: *mut PtrExportData, ptr: u64) -> CUresult {
    entry(|| {
        let owner = super::pool::pool_of(ptr);
        if data.is_null() || owner == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let pl = pool(owner as CUmemoryPool)?;
        if !pl.share.exportable() || pl.share.imported.is_some() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let [lo, hi, size]: [u64; 3] =
            call_raw(pl.dev, vmm::POOL_EXPORT_PTR, pl.share.number, [ptr, 0, 0])?;
        let mut d = PtrExportData { reserved: [0; 64] };
        d.reserved[..8].copy_from_slice(&PTR_MAGIC);
        d.reserved[8..16].copy_from_slice(&lo.to_le_bytes());
        d.reserved[16..24].copy_from_slice(&hi.to_le_bytes());
        d.reserved[24..32].copy_from_slice(&size.to_le_bytes());
        d.reserved[32..40].copy_from_slice(&(pl.dev as u64).to_le_bytes());
        // SAFETY: checked non-null; the caller's 64 bytes.
        unsafe { out(data, d) }
    })
}

/// # Safety
/// `ptr` is null or writable; `data` is null or 64 readable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolImportPointer(
    ptr: *mut u64,
    p: CUmemoryPool,
    data: *const PtrExportData,
) -> CUresult {
    entry(|| {
        let pl = pool(p)?;
        let key = pl.share.imported.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if ptr.is_null() || data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null; the caller's 64 bytes.
        let d = unsafe { &(*data).reserved };
        let word = |at: usize| u64::from_le_bytes(d[at..at + 8].try_into().expect("8 bytes"));
        if d[..8] != PTR_MAGIC || word(32) != pl.dev as u64 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let [p, size, _]: [u64; 3] =
            call_raw(pl.dev, vmm::POOL_IMPORT_PTR, 0, [key, word(8), word(16)])?;
        let mut m = crate::state::blocks::IMPORTED
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let n = m
            .get_or_insert_with(HashMap::new)
            .entry(p)
            .or_insert((pl.dev, 0));
        if n.1 == 0 {
            // Copies and kernels of this process may use it from now on.
            crate::state::ranges::add_range(p, size, pl.dev, false);
        }
        n.1 += 1;
        drop(m);
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(ptr, p) }
    })
}
