//! Device memory: allocation in the server, copies staged through the segment in
//! pipelined chunks, memsets. The shim keeps its own table of the client's ranges so bad
//! pointers get their error synchronously, as from the driver; the server checks again.

use super::staged::{copy_dtoh, copy_htod};
use crate::cuda::*;
use crate::state::blocks::alloc;
use crate::state::capture::stream_for;
use crate::state::copies::{copy_dtod, finish_if_host, wait_stream};
use crate::state::ctx::current_dev;
use crate::state::entry::{entry, live, out};
use crate::state::ranges::*;
use crate::state::streams::CUstream;
use omps_ring::wire::{self, CallHdr, Memset, Op};
use std::ffi::c_void;

/// # Safety
/// `dptr` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    entry(|| {
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::state::capture::unsafe_call_allowed()?;
        let p = alloc(current_dev()?, size)?;
        // SAFETY: the caller's pointer, non-null.
        unsafe { out(dptr, p) }
    })
}

/// # Safety
/// `dptr` and `pitch` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: u32,
) -> CUresult {
    // The driver rounds rows up to the texture pitch alignment, at least 512 bytes on
    // every GPU this targets.
    const ALIGN: usize = 512;
    entry(|| {
        crate::state::capture::unsafe_call_allowed()?;
        if dptr.is_null()
            || pitch.is_null()
            || width == 0
            || height == 0
            || !matches!(elem, 4 | 8 | 16)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let row = width.next_multiple_of(ALIGN);
        let p = alloc(
            current_dev()?,
            row.checked_mul(height).ok_or(CUDA_ERROR_INVALID_VALUE)?,
        )?;
        // SAFETY: the caller's pointers, non-null.
        unsafe {
            out(pitch, row)?;
            out(dptr, p)
        }
    })
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    entry(|| {
        crate::state::capture::unsafe_call_allowed()?;
        super::pool::free(ptr)
    })
}

/// # Safety
/// `free` and `total` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry(|| {
        let dev = current_dev()?;
        let c = live()?;
        let mut ch = c.channel();
        ch.call(dev, Op::MemGetInfo, |call: CallHdr| {
            bytemuck::bytes_of(&call).to_vec()
        })?;
        let r = ch.reply::<wire::MemInfoReply>();
        // SAFETY: the caller's pointers.
        unsafe {
            out(free, r.free as usize)?;
            out(total, r.total as usize)
        }
    })
}

fn memset(
    dst: u64,
    value: u32,
    elem_size: u32,
    count: usize,
    stream: CUstream,
) -> Result<(), CUresult> {
    let bytes = (count as u64)
        .checked_mul(elem_size as u64)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if count == 0 {
        return Ok(());
    }
    if !dst.is_multiple_of(elem_size as u64) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Page-locked memory is device-visible natively (XLA's autotuner memsets it): the
    // shared kind is mapped at this address in the server, which checks it as the
    // client's; the stream names the GPU that writes it.
    let dev = match range_dev(dst, bytes) {
        Ok(dev) => dev,
        Err(_) if crate::state::host_ranges::is_shared(dst, bytes as usize) => {
            crate::state::streams::stream_dev(stream)?.1
        }
        Err(_) if crate::state::host_ranges::is_unshared_host(dst, bytes as usize) => {
            return memset_on_host(dst, value, elem_size, count, stream);
        }
        Err(e) => return Err(e),
    };
    let (s, wait) = stream_for(dev, stream)?;
    let m = Memset {
        dst,
        count: count as u64,
        value,
        elem_size,
        stream: s,
        _pad: 0,
    };
    let work = || crate::state::profile::Work::Memset { value, bytes };
    crate::state::profile::around(stream, dev, work, || {
        live()?.push(dev, Op::Memset, &[bytemuck::bytes_of(&m)])
    })?;
    if wait {
        wait_stream(dev, s)?;
    }
    Ok(())
}

/// A memset of page-locked memory the server cannot reach (registered program memory
/// that is not whole pages, the shim's fallback memory): the stream's earlier work is
/// waited for, then this process writes the values, so what the stream does next sees
/// them, as it would the GPU's. Not in a capture, which would have to replay it.
fn memset_on_host(
    dst: u64,
    value: u32,
    elem_size: u32,
    count: usize,
    stream: CUstream,
) -> Result<(), CUresult> {
    if crate::state::capture::any_capture() {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    crate::state::streams::stream_sync(stream)?;
    let n = elem_size as usize;
    let bytes = &value.to_le_bytes()[..n];
    // SAFETY: [dst, dst + count * n) lies in one page-locked range of this process
    // (is_unshared_host), which the program keeps mapped and writable while registered.
    let d = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, count * n) };
    for c in d.chunks_exact_mut(n) {
        c.copy_from_slice(bytes);
    }
    Ok(())
}

macro_rules! memsets {
    ($($sync:ident, $async_:ident, $t:ty, $size:expr;)*) => {$(
        #[no_mangle]
        pub extern "C" fn $sync(dst: CUdeviceptr, v: $t, n: usize) -> CUresult {
            entry(|| {
                memset(dst, v as u32, $size, n, std::ptr::null_mut())?;
                finish_if_host(dst, 0)
            })
        }
        #[no_mangle]
        pub extern "C" fn $async_(dst: CUdeviceptr, v: $t, n: usize, s: CUstream) -> CUresult {
            entry(|| memset(dst, v as u32, $size, n, s))
        }
    )*};
}

memsets! {
    cuMemsetD8_v2, cuMemsetD8Async, u8, 1;
    cuMemsetD16_v2, cuMemsetD16Async, u16, 2;
    cuMemsetD32_v2, cuMemsetD32Async, u32, 4;
}

/// A pitched memset as one memset per row.
pub(crate) fn memset_2d(
    dst: u64,
    pitch: usize,
    value: u32,
    elem_size: u32,
    width: usize,
    height: usize,
    stream: CUstream,
) -> Result<(), CUresult> {
    if height > 1 && pitch < width * elem_size as usize {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for row in 0..height {
        memset(dst + (row * pitch) as u64, value, elem_size, width, stream)?;
    }
    Ok(())
}

macro_rules! memsets_2d {
    ($($sync:ident, $async_:ident, $t:ty, $size:expr;)*) => {$(
        #[no_mangle]
        pub extern "C" fn $sync(dst: CUdeviceptr, pitch: usize, v: $t, w: usize, h: usize) -> CUresult {
            entry(|| {
                memset_2d(dst, pitch, v as u32, $size, w, h, std::ptr::null_mut())?;
                finish_if_host(dst, 0)
            })
        }
        #[no_mangle]
        pub extern "C" fn $async_(dst: CUdeviceptr, pitch: usize, v: $t, w: usize, h: usize, s: CUstream) -> CUresult {
            entry(|| memset_2d(dst, pitch, v as u32, $size, w, h, s))
        }
    )*};
}

memsets_2d! {
    cuMemsetD2D8_v2, cuMemsetD2D8Async, u8, 1;
    cuMemsetD2D16_v2, cuMemsetD2D16Async, u16, 2;
    cuMemsetD2D32_v2, cuMemsetD2D32Async, u32, 4;
}

/// goes the way cuMemcpy goes. `None` when the named direction is the real one.
fn uva_copy(
    dst: u64,
    src: u64,
    n: usize,
    s: CUstream,
    sync: bool,
    dst_dev: bool,
    src_dev: bool,
) -> Option<Result<(), CUresult>> {
    let pinned = |p: u64, named_dev: bool| {
        named_dev && range_info(p).is_none() && crate::state::host_ranges::is_pinned_host(p, n)
    };
    (pinned(dst, dst_dev) || pinned(src, src_dev))
        .then(|| super::copy_any::copy_any(dst, src, n, s, sync))
}

/// # Safety
/// `src` is readable for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    entry(|| {
        let null = std::ptr::null_mut();
        uva_copy(dst, src as u64, n, null, true, true, false)
            .unwrap_or_else(|| copy_htod(dst, src as *const u8, n, null, true))
    })
}

/// # Safety
/// `src` is readable for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    s: CUstream,
) -> CUresult {
    entry(|| {
        uva_copy(dst, src as u64, n, s, false, true, false)
            .unwrap_or_else(|| copy_htod(dst, src as *const u8, n, s, false))
    })
}

/// # Safety
/// `dst` is writable for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    entry(|| {
        let null = std::ptr::null_mut();
        uva_copy(dst as u64, src, n, null, true, false, true)
            .unwrap_or_else(|| copy_dtoh(dst as *mut u8, src, n, null, true))
    })
}

/// # Safety
/// `dst` is writable for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    entry(|| {
        uva_copy(dst as u64, src, n, s, false, false, true)
            .unwrap_or_else(|| copy_dtoh(dst as *mut u8, src, n, s, false))
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    entry(|| {
        if let Some(r) = uva_copy(dst, src, n, std::ptr::null_mut(), true, true, true) {
            return r;
        }
        copy_dtod(dst, src, n, std::ptr::null_mut())?;
        // Managed memory the CPU touches next: done before the return.
        finish_if_host(dst, src)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    entry(|| {
        uva_copy(dst, src, n, s, false, true, true).unwrap_or_else(|| copy_dtod(dst, src, n, s))
    })
}
