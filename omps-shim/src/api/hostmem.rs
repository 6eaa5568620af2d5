//! Host memory and copies between any two kinds of memory.
//!
//! Page-locked host allocations are ordinary page-aligned memory of the client for now:
//! copies from and to them go through the staging chunks like pageable copies (correct,
//! not zero-copy). Mapped access from kernels needs the memory registered in the server,
//! so cuMemHostGetDevicePointer says CUDA_ERROR_NOT_SUPPORTED rather than hand out an
//! address the GPU cannot reach.

use super::exec::CUstream;
use super::mem::{copy_dtod, copy_dtoh, copy_htod, range_info};
use super::{entry, live, out};
use crate::cuda::*;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

/// Start -> (length, flags, allocated by us rather than registered).
static HOST: Mutex<BTreeMap<usize, (usize, u32, bool)>> = Mutex::new(BTreeMap::new());

fn host_range(p: usize) -> Option<(usize, usize, u32, bool)> {
    let h = HOST.lock().unwrap_or_else(|e| e.into_inner());
    let (&s, &(n, f, ours)) = h.range(..=p).next_back()?;
    (p < s + n).then_some((s, n, f, ours))
}

/// With unified addressing every page-locked allocation is mapped: the driver reports
/// CU_MEMHOSTALLOC_DEVICEMAP whether or not it was asked for.
const DEVICEMAP: u32 = 2;

fn host_alloc(size: usize, flags: u32) -> Result<*mut c_void, CUresult> {
    live()?;
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let layout =
        std::alloc::Layout::from_size_align(size, 4096).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    HOST.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p as usize, (size, flags | DEVICEMAP, true));
    Ok(p as *mut c_void)
}

/// # Safety
/// `pp` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(pp, host_alloc(size, flags)?) })
}

/// # Safety
/// `pp` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(pp, host_alloc(size, 0)?) })
}

/// # Safety
/// `p` came from cuMemHostAlloc / cuMemAllocHost.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    entry(|| {
        let mut h = HOST.lock().unwrap_or_else(|e| e.into_inner());
        match h.get(&(p as usize)) {
            Some(&(n, _, true)) => {
                h.remove(&(p as usize));
                // SAFETY: allocated by host_alloc with this size and alignment.
                unsafe {
                    std::alloc::dealloc(
                        p as *mut u8,
                        std::alloc::Layout::from_size_align_unchecked(n, 4096),
                    )
                };
                Ok(())
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    })
}

/// # Safety
/// `flags` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> CUresult {
    entry(|| {
        let (_, _, f, _) = host_range(p as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's pointer.
        unsafe { out(flags, f) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemHostGetDevicePointer_v2(
    _d: *mut CUdeviceptr,
    p: *mut c_void,
    _flags: c_uint,
) -> CUresult {
    entry(|| {
        host_range(p as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        Err(CUDA_ERROR_NOT_SUPPORTED)
    })
}

/// Registration is bookkeeping: copies from registered memory are staged as pageable ones.
/// Mapping it for kernels (CU_MEMHOSTREGISTER_DEVICEMAP alone is fine to ask for) is not
/// available, see cuMemHostGetDevicePointer.
#[no_mangle]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: c_uint) -> CUresult {
    entry(|| {
        live()?;
        if p.is_null() || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        const HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
        if host_range(p as usize).is_some() || host_range(p as usize + size - 1).is_some() {
            return Err(HOST_MEMORY_ALREADY_REGISTERED);
        }
        HOST.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p as usize, (size, flags, false));
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    const HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
    entry(|| {
        let mut h = HOST.lock().unwrap_or_else(|e| e.into_inner());
        match h.get(&(p as usize)) {
            Some(&(_, _, false)) => {
                h.remove(&(p as usize));
                Ok(())
            }
            _ => Err(HOST_MEMORY_NOT_REGISTERED),
        }
    })
}

/// With unified addressing a pointer says what it is: the client's device ranges, or host.
fn is_device(p: u64) -> bool {
    range_info(p).is_some()
}

fn copy_any(dst: u64, src: u64, len: usize, s: CUstream) -> Result<(), CUresult> {
    match (is_device(dst), is_device(src)) {
        (true, true) => copy_dtod(dst, src, len, s),
        (true, false) => copy_htod(dst, src as *const u8, len, s),
        (false, true) => copy_dtoh(dst as *mut u8, src, len, s),
        (false, false) => {
            if len > 0 {
                // SAFETY: both are host memory of len bytes, per cuMemcpy's contract.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
            }
            Ok(())
        }
    }
}

#[no_mangle]
pub extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    entry(|| copy_any(dst, src, n, std::ptr::null_mut()))
}

#[no_mangle]
pub extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    entry(|| copy_any(dst, src, n, s))
}

const MEMORYTYPE_HOST: c_uint = 1;
const MEMORYTYPE_DEVICE: c_uint = 2;
const MEMORYTYPE_UNIFIED: c_uint = 4;

/// CUDA_MEMCPY3D as cuda.h lays it out; CUDA_MEMCPY2D is read into the same shape.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memcpy3D {
    pub src_x: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub reserved0: *mut c_void,
    pub src_pitch: usize,
    pub src_height: usize,
    pub dst_x: usize,
    pub dst_y: usize,
    pub dst_z: usize,
    pub dst_lod: usize,
    pub dst_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub reserved1: *mut c_void,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
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

fn base(kind: c_uint, host: usize, dev: u64) -> Result<u64, CUresult> {
    match kind {
        MEMORYTYPE_HOST => Ok(host as u64),
        MEMORYTYPE_DEVICE | MEMORYTYPE_UNIFIED => Ok(dev),
        // CUDA arrays are not supported yet.
        _ => Err(CUDA_ERROR_NOT_SUPPORTED),
    }
}

/// A pitched copy as rows of plain copies; one copy when both sides are contiguous.
fn copy_3d(c: &Memcpy3D, s: CUstream) -> Result<(), CUresult> {
    if c.src_lod != 0 || c.dst_lod != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let src = base(c.src_type, c.src_host as usize, c.src_device)?;
    let dst = base(c.dst_type, c.dst_host as usize, c.dst_device)?;
    let (sp, dp) = (c.src_pitch.max(c.width), c.dst_pitch.max(c.width));
    let (sh, dh) = (c.src_height.max(c.height), c.dst_height.max(c.height));
    let depth = c.depth.max(1);
    let at = |b: u64, x: usize, y: usize, z: usize, pitch: usize, h: usize| {
        b + (x + (y + z * h) * pitch) as u64
    };
    if c.width == sp
        && c.width == dp
        && c.src_x == 0
        && c.dst_x == 0
        && sh == c.height
        && dh == c.height
    {
        let n = c.width * c.height * depth;
        return copy_any(
            at(dst, 0, c.dst_y, c.dst_z, dp, dh),
            at(src, 0, c.src_y, c.src_z, sp, sh),
            n,
            s,
        );
    }
    for z in 0..depth {
        for y in 0..c.height {
            copy_any(
                at(dst, c.dst_x, c.dst_y + y, c.dst_z + z, dp, dh),
                at(src, c.src_x, c.src_y + y, c.src_z + z, sp, sh),
                c.width,
                s,
            )?;
        }
    }
    Ok(())
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

macro_rules! copies_2d_3d {
    ($($name:ident($t:ty, $conv:expr, $stream:ident));* $(;)?) => {$(
        /// # Safety
        /// `c` points at a copy description whose memory is valid, as CUDA requires.
        #[no_mangle]
        pub unsafe extern "C" fn $name(c: *const $t, $stream: CUstream) -> CUresult {
            entry(|| {
                if c.is_null() {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                // SAFETY: the caller's description.
                let d = $conv(unsafe { &*c });
                copy_3d(&d, $stream)
            })
        }
    )*};
}

copies_2d_3d! {
    cuMemcpy2DAsync_v2(Memcpy2D, from_2d, s);
    cuMemcpy3DAsync_v2(Memcpy3D, |c: &Memcpy3D| *c, s);
}

/// # Safety
/// As cuMemcpy2DAsync_v2.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2(c: *const Memcpy2D) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuMemcpy2DAsync_v2(c, std::ptr::null_mut()) }
}

/// # Safety
/// As cuMemcpy2DAsync_v2.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(c: *const Memcpy2D) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuMemcpy2DAsync_v2(c, std::ptr::null_mut()) }
}

/// # Safety
/// As cuMemcpy3DAsync_v2.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3D_v2(c: *const Memcpy3D) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuMemcpy3DAsync_v2(c, std::ptr::null_mut()) }
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
    entry(|| {
        if data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = range_info(p);
        let host = host_range(p as usize);
        if dev.is_none() && host.is_none() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: data is writable for the attribute's type, per the API.
        unsafe {
            match (attr, dev, host) {
                (CONTEXT, Some((_, _, d)), _) => {
                    out(data as *mut *mut c_void, super::ctx::primary_handle(d))
                }
                (MEMORY_TYPE, Some(_), _) => out(data as *mut c_uint, MEMORYTYPE_DEVICE),
                (MEMORY_TYPE, None, Some(_)) => out(data as *mut c_uint, MEMORYTYPE_HOST),
                (DEVICE_POINTER, Some(_), _) => out(data as *mut u64, p),
                (HOST_POINTER, None, Some(_)) => out(data as *mut u64, p),
                (IS_MANAGED, _, _) => out(data as *mut c_uint, 0),
                (DEVICE_ORDINAL, Some((_, _, d)), _) => out(data as *mut c_int, d as c_int),
                (RANGE_START_ADDR, Some((s, _, _)), _) => out(data as *mut u64, s),
                (RANGE_START_ADDR, None, Some((s, _, _, _))) => out(data as *mut u64, s as u64),
                (RANGE_SIZE, Some((_, n, _)), _) => out(data as *mut usize, n as usize),
                (RANGE_SIZE, None, Some((_, n, _, _))) => out(data as *mut usize, n),
                (MAPPED, Some(_), _) => out(data as *mut c_uint, 1),
                _ => Err(CUDA_ERROR_INVALID_VALUE),
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
    entry(|| {
        if attrs.is_null() || data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..n as usize {
            // SAFETY: n entries each, per the contract.
            let (a, d) = unsafe { (*attrs.add(i), *data.add(i)) };
            // Unlike the single query, an unknown pointer is not an error here: the
            // memory type then reads as 0 (unregistered host memory).
            // SAFETY: d is writable for attribute a.
            let r = unsafe { cuPointerGetAttribute(d, a, p) };
            if r != CUDA_SUCCESS && !d.is_null() {
                // SAFETY: as above; zero is the "unknown" answer for every attribute.
                unsafe { (d as *mut u32).write(0) };
            }
        }
        Ok(())
    })
}
