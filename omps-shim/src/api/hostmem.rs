//! Host memory and copies between any two kinds of memory.
//!
//! Page-locked allocations (cuMemHostAlloc, cuMemAllocHost) are memfds shared with the
//! server, which maps each at the same address and registers it with the GPU: copies to
//! and from them are DMA with no staging, asynchronous copies really are asynchronous,
//! and kernels reach them through the same pointer (zero-copy). If the server cannot map
//! an allocation at the client's address, it falls back to private memory that copies
//! stage and kernels cannot reach (cuMemHostGetDevicePointer then says NOT_SUPPORTED).
//! cuMemHostRegister of the program's own memory is bookkeeping; copies from it stage.

pub use super::copy_any::Memcpy3D;
use super::copy_any::{copy_any, copy_linear_3d, MEMORYTYPE_DEVICE, MEMORYTYPE_HOST};
use crate::cuda::*;
use crate::state::entry::{entry, live, out};
use crate::state::host_ranges::*;
use crate::state::ranges::range_info;
use crate::state::streams::CUstream;
use omps_ring::shm::{self, Mapping};
use omps_ring::wire::hostmem;
use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{AsFd, AsRawFd};

/// # Safety
/// `pp` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    entry(|| {
        crate::state::capture::unsafe_call_allowed()?;
        // SAFETY: the caller's pointer.
        unsafe { out(pp, host_alloc(size, flags)?) }
    })
}

/// # Safety
/// `pp` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuMemHostAlloc(pp, size, 0) }
}

/// # Safety
/// `p` came from cuMemHostAlloc / cuMemAllocHost.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    entry(|| {
        if p.is_null() {
            return Ok(());
        }
        free_host(p as usize, false)
    })
}

/// # Safety
/// `flags` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> CUresult {
    entry(|| {
        let (_, r) = host_range(p as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's pointer.
        unsafe { out(flags, r.flags) }
    })
}

/// Shared allocations are mapped at the same address in the server, so the device
/// pointer is the host pointer, as under unified addressing.
///
/// # Safety
/// `d` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    d: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    entry(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (start, r) = host_range(p as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if r.kind == Kind::Registered {
            // A piece of the program's pages: a mirror the server reaches.
            let alloc = |n: usize| {
                let m = host_alloc(n, 0).ok()? as usize;
                if is_shared(m as u64, n) {
                    Some(m)
                } else {
                    let _ = free_host(m, false);
                    None
                }
            };
            // SAFETY: [start, start+len) is registered, the program's memory while it is.
            let m = unsafe {
                crate::state::host_mirror::device_pointer(start, r.len, p as usize, alloc)
            };
            if let Some(m) = m {
                // SAFETY: the caller's pointer.
                return unsafe { out(d, m) };
            }
        }
        if r.kind != Kind::Shared {
            if crate::trace_enabled() {
                eprintln!(
                    "omps trace: cuMemHostGetDevicePointer({p:?}): in {:?} range {start:#x}+{:#x}, which the server cannot reach",
                    r.kind, r.len
                );
            }
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        // SAFETY: the caller's pointer.
        unsafe { out(d, p as u64) }
    })
}

/// Registers the program's own memory. A page-aligned range is moved, in place and with
/// its contents, onto a memfd shared with the server, which maps and registers it at the
/// same address: copies are DMA and kernels reach it (zero-copy), as with the driver. Other
/// ranges are bookkeeping only (copies stage; no device pointer): their pages hold other
/// objects of the program, which must not be moved under its feet.
#[no_mangle]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: c_uint) -> CUresult {
    const HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
    entry(|| {
        live()?;
        if p.is_null() || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::state::capture::unsafe_call_allowed()?;
        if host_range(p as usize).is_some() || host_range(p as usize + size - 1).is_some() {
            return Err(HOST_MEMORY_ALREADY_REGISTERED);
        }
        let kind = if share_in_place(p as usize, size) {
            Kind::Shared
        } else {
            Kind::Registered
        };
        if crate::trace_enabled() {
            eprintln!(
                "omps trace: cuMemHostRegister({p:?}, {size:#x}, flags {flags:#x}): {kind:?}"
            );
        }
        HOST.lock().unwrap_or_else(|e| e.into_inner()).insert(
            p as usize,
            HostRange {
                len: size,
                flags,
                kind,
            },
        );
        Ok(())
    })
}

fn share_in_place(p: usize, len: usize) -> bool {
    const PAGE: usize = 4096;
    if !p.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
        return false;
    }
    let Ok(c) = live() else { return false };
    let Ok(fd) = shm::create_segment("omps-registered", len) else {
        return false;
    };
    let Ok(staging) = Mapping::map(fd.as_fd(), len) else {
        return false;
    };
    // SAFETY: the program registered p..p+len, which must be its readable memory; staging
    // is a fresh mapping of the same length.
    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, staging.as_ptr(), len) };
    // SAFETY: MAP_FIXED replaces exactly the program's registered pages (whole pages of
    // its own buffer) with the shared file now holding the same bytes.
    let m = unsafe {
        libc::mmap(
            p as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            0,
        )
    };
    if m != p as *mut c_void {
        return false;
    }
    drop(staging);
    c.host_request(hostmem::PIN, p as u64, len as u64, Some(fd.as_raw_fd()))
        .is_ok()
}

#[no_mangle]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    const HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
    entry(|| {
        let r = {
            let mut h = HOST.lock().unwrap_or_else(|e| e.into_inner());
            let ours = |r: &HostRange| {
                r.kind == Kind::Registered
                    || (r.kind == Kind::Shared && !allocated_here(p as usize))
            };
            match h.get(&(p as usize)) {
                Some(r) if ours(r) => h.remove(&(p as usize)).expect("present"),
                _ => return Err(HOST_MEMORY_NOT_REGISTERED),
            }
        };
        if let Some(m) = crate::state::host_mirror::forget(p as usize) {
            free_host(m, false)?;
        }
        // The pages stay shared (the program keeps its memory and contents); the server
        // lets go of them once this client's queued work is done.
        if r.kind == Kind::Shared {
            live()?.host_request(hostmem::UNPIN, p as u64, r.len as u64, None)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    entry(|| copy_any(dst, src, n, std::ptr::null_mut(), true))
}

#[no_mangle]
pub extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    entry(|| copy_any(dst, src, n, s, false))
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memcpy2D {
    pub src_x: usize,
    pub src_y: usize,
    pub src_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub src_pitch: usize,
    pub dst_x: usize,
    pub dst_y: usize,
    pub dst_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub dst_pitch: usize,
    pub width: usize,
    pub height: usize,
}

/// A 2D or 3D copy: through the array code where either side is an array.
pub(crate) fn copy_3d(c: &Memcpy3D, s: CUstream, sync: bool) -> Result<(), CUresult> {
    if super::array::involves_array(c) {
        return super::array::copy(c, s, sync);
    }
    copy_linear_3d(c, s, sync)
}

fn from_2d(c: &Memcpy2D) -> Memcpy3D {
    Memcpy3D {
        src_x: c.src_x,
        src_y: c.src_y,
        src_z: 0,
        src_lod: 0,
        src_type: c.src_type,
        src_host: c.src_host,
        src_device: c.src_device,
        src_array: c.src_array,
        reserved0: std::ptr::null_mut(),
        src_pitch: c.src_pitch,
        src_height: 0,
        dst_x: c.dst_x,
        dst_y: c.dst_y,
        dst_z: 0,
        dst_lod: 0,
        dst_type: c.dst_type,
        dst_host: c.dst_host,
        dst_device: c.dst_device,
        dst_array: c.dst_array,
        reserved1: std::ptr::null_mut(),
        dst_pitch: c.dst_pitch,
        dst_height: 0,
        width: c.width,
        height: c.height,
        depth: 1,
    }
}

/// Runs a 2D or 3D copy description (converted to the 3D form).
///
/// # Safety
/// `c` is null or points at a copy description whose memory is valid, as CUDA requires.
unsafe fn copy_desc<T>(
    c: *const T,
    conv: impl FnOnce(&T) -> Memcpy3D,
    s: CUstream,
    sync: bool,
) -> CUresult {
    entry(|| {
        if c.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's description, non-null.
        copy_3d(&conv(unsafe { &*c }), s, sync)
    })
}

/// # Safety
/// `c` points at a valid copy description.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(c: *const Memcpy2D, s: CUstream) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { copy_desc(c, from_2d, s, false) }
}

/// # Safety
/// `c` points at a valid copy description.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DAsync_v2(c: *const Memcpy3D, s: CUstream) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { copy_desc(c, |c| *c, s, false) }
}

/// # Safety
/// `c` points at a valid copy description.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2(c: *const Memcpy2D) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { copy_desc(c, from_2d, std::ptr::null_mut(), true) }
}

/// # Safety
/// `c` points at a valid copy description.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(c: *const Memcpy2D) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { copy_desc(c, from_2d, std::ptr::null_mut(), true) }
}

/// # Safety
/// `c` points at a valid copy description.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3D_v2(c: *const Memcpy3D) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { copy_desc(c, |c| *c, std::ptr::null_mut(), true) }
}

/// # Safety
/// `base` and `size` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    b: *mut CUdeviceptr,
    size: *mut usize,
    p: CUdeviceptr,
) -> CUresult {
    entry(|| {
        let (start, len, _) = range_info(p).ok_or(CUDA_ERROR_NOT_FOUND)?;
        // SAFETY: the caller's pointers; either may be null.
        unsafe {
            if !b.is_null() {
                b.write(start);
            }
            if !size.is_null() {
                size.write(len as usize);
            }
        }
        Ok(())
    })
}

/// # Safety
/// `data` is writable for the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: c_int,
    p: CUdeviceptr,
) -> CUresult {
    const CONTEXT: c_int = 1;
    const MEMORY_TYPE: c_int = 2;
    const DEVICE_POINTER: c_int = 3;
    const HOST_POINTER: c_int = 4;
    const IS_MANAGED: c_int = 8;
    const DEVICE_ORDINAL: c_int = 9;
    const RANGE_START_ADDR: c_int = 11;
    const RANGE_SIZE: c_int = 12;
    const MAPPED: c_int = 13;
    const SYNC_MEMOPS: c_int = 6;
    const BUFFER_ID: c_int = 7;
    const LEGACY_IPC: c_int = 10;
    const HANDLE_TYPES: c_int = 14;
    const RDMA_CAPABLE: c_int = 15;
    const ACCESS_FLAGS: c_int = 16;
    const MEMPOOL: c_int = 17;
    const MAPPING_SIZE: c_int = 18;
    const MAPPING_BASE: c_int = 19;
    const BLOCK_ID: c_int = 20;
    entry(|| {
        if data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = range_info(p);
        let host = host_range(p as usize);
        if dev.is_none() && host.is_none() {
            if crate::trace_enabled() {
                eprintln!("omps trace: cuPointerGetAttribute({attr}, {p:#x}): unknown pointer");
            }
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: data is writable for the attribute's type, per the API.
        unsafe {
            match (attr, dev, host) {
                (CONTEXT, Some((_, _, d)), _) => out(
                    data as *mut *mut c_void,
                    crate::state::ctx::primary_handle(d),
                ),
                (MEMORY_TYPE, Some(_), _) => out(data as *mut c_uint, MEMORYTYPE_DEVICE),
                (MEMORY_TYPE, None, Some(_)) => out(data as *mut c_uint, MEMORYTYPE_HOST),
                (DEVICE_POINTER, Some(_), _) => out(data as *mut u64, p),
                (DEVICE_POINTER, None, Some((_, r))) if r.kind == Kind::Shared => {
                    out(data as *mut u64, p)
                }
                (HOST_POINTER, None, Some(_)) => out(data as *mut u64, p),
                (HOST_POINTER, Some(_), Some((_, r))) if r.flags & MANAGED != 0 => {
                    out(data as *mut u64, p)
                }
                (IS_MANAGED, _, h) => out(
                    data as *mut c_uint,
                    c_uint::from(h.is_some_and(|(_, r)| r.flags & MANAGED != 0)),
                ),
                (DEVICE_ORDINAL, Some((_, _, d)), _) => out(data as *mut c_int, d as c_int),
                (RANGE_START_ADDR, Some((s, _, _)), _) => out(data as *mut u64, s),
                (RANGE_START_ADDR, None, Some((s, _))) => out(data as *mut u64, s as u64),
                (RANGE_SIZE, Some((_, n, _)), _) => out(data as *mut usize, n as usize),
                (RANGE_SIZE, None, Some((_, r))) => out(data as *mut usize, r.len),
                (MAPPED, Some(_), _) => out(data as *mut c_uint, 1),
                (MAPPED, None, Some((_, r))) => {
                    out(data as *mut c_uint, c_uint::from(r.kind == Kind::Shared))
                }
                // Device memory's other facts: not synchronous memops, no IPC or RDMA
                // export (omps offers neither), read-write, and ids that are unique while
                // the allocation lives (its start).
                (SYNC_MEMOPS | LEGACY_IPC | RDMA_CAPABLE, Some(_), _) => {
                    out(data as *mut c_uint, 0)
                }
                (HANDLE_TYPES, Some(_), _) => out(data as *mut u64, 0),
                (ACCESS_FLAGS, Some(_), _) => out(data as *mut c_uint, 3),
                (BUFFER_ID | BLOCK_ID, Some((s, _, _)), _) => out(data as *mut u64, s),
                (MAPPING_BASE, Some((s, _, _)), _) => out(data as *mut u64, s),
                (MAPPING_SIZE, Some((_, n, _)), _) => out(data as *mut usize, n as usize),
                (MEMPOOL, Some((s, _, _)), _) => out(data as *mut usize, super::pool::pool_of(s)),
                _ => {
                    if crate::trace_enabled() {
                        eprintln!("omps trace: cuPointerGetAttribute({attr}, {p:#x}): no answer");
                    }
                    Err(CUDA_ERROR_INVALID_VALUE)
                }
            }
        }
    })
}

/// # Safety
/// `attrs` and `data` hold `n` entries, as cuPointerGetAttributes requires.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: c_uint,
    attrs: *const c_int,
    data: *mut *mut c_void,
    p: CUdeviceptr,
) -> CUresult {
    const CONTEXT: c_int = 1;
    const MEMORY_TYPE: c_int = 2;
    const DEVICE_POINTER: c_int = 3;
    const HOST_POINTER: c_int = 4;
    const P2P_TOKENS: c_int = 5;
    const DEVICE_ORDINAL: c_int = 9;
    entry(|| {
        if attrs.is_null() || data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let known = range_info(p).is_some() || host_range(p as usize).is_some();
        for i in 0..n as usize {
            // SAFETY: n entries each, per the contract.
            let (a, d) = unsafe { (*attrs.add(i), *data.add(i)) };
            if d.is_null() {
                continue;
            }
            // SAFETY: d is writable for attribute a.
            if unsafe { cuPointerGetAttribute(d, a, p) } == CUDA_SUCCESS {
                continue;
            }
            // Unlike the single query, what does not apply is not an error here: the
            // driver answers memory the program did not register as host memory unknown
            // to CUDA (type 0, device -2, host pointer itself) and zero for the rest.
            // SAFETY: d is writable for attribute a, whose size these cases follow.
            unsafe {
                match a {
                    MEMORY_TYPE => (d as *mut u32).write(0),
                    DEVICE_ORDINAL => (d as *mut i32).write(if known { 0 } else { -2 }),
                    HOST_POINTER => (d as *mut u64).write(if known { 0 } else { p }),
                    CONTEXT | DEVICE_POINTER | 7 | 11 | 12 | 17..=20 => (d as *mut u64).write(0),
                    P2P_TOKENS => (d as *mut [u64; 2]).write([0; 2]),
                    _ => (d as *mut u32).write(0),
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn retry_hints_are_aligned_spread_and_inside_their_window() {
        let hints: std::collections::BTreeSet<usize> =
            (0..1000).map(|_| super::random_hint()).collect();
        assert!(
            hints.len() > 990,
            "hints repeat: {} distinct of 1000",
            hints.len()
        );
        for h in hints {
            assert!(
                (16usize << 40..80usize << 40).contains(&h),
                "{h:#x} outside 16..80 TiB"
            );
            assert_eq!(h % (2 << 20), 0, "{h:#x} not 2 MiB aligned");
        }
    }
}
