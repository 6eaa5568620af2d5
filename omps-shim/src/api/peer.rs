//! Copies between GPUs, and what a program asks about peer access.
//!
//! Each GPU's worker checks only the ranges its own session of the client holds, and a
//! free on one GPU waits only for the client's work on that GPU: a direct copy queued on
//! GPU B from GPU A's memory could outlive A's free and read what another client was
//! given there next. So omps reports no direct peer access (kernels cannot reach another
//! GPU's memory), and a copy between two GPUs' memory goes through this process's host
//! memory: the source GPU copies a piece out, the destination GPU copies it in, each
//! checked by its own session. Such a copy is ordered after the work of the stream it
//! names (which it synchronizes first) and done when the call returns.

use super::ctx::CUcontext;
use super::device::device;
use super::exec::{stream_sync, CUstream};
use super::mem::{copy_dtoh, copy_htod};
use super::{entry, out};
use crate::cuda::*;
use crate::handles::{resolve, CTX_MAGIC};
use std::ffi::c_int;

const CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: CUresult = 217;
const CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: CUresult = 705;
/// Bytes moved through host memory at a time.
const PIECE: usize = 8 << 20;

/// `len` bytes from `src` (on one GPU) to `dst` (on another), through host memory, after
/// the work queued on `stream`.
pub(crate) fn copy_between(
    dst: u64,
    src: u64,
    len: usize,
    stream: CUstream,
) -> Result<(), CUresult> {
    stream_sync(stream)?;
    let mut buf = vec![0u8; len.min(PIECE)];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(PIECE);
        // Each leg on its own GPU's default stream, synchronously: the piece is in host
        // memory before it goes out again.
        copy_dtoh(
            buf.as_mut_ptr(),
            src + off as u64,
            n,
            std::ptr::null_mut(),
            true,
        )?;
        copy_htod(
            dst + off as u64,
            buf.as_ptr(),
            n,
            std::ptr::null_mut(),
            true,
        )?;
        off += n;
    }
    Ok(())
}

fn check_ctx(c: CUcontext) -> Result<usize, CUresult> {
    // SAFETY: a handle from this shim, as the API requires.
    unsafe { resolve(c, CTX_MAGIC) }
        .map(|ctx| ctx.dev)
        .map_err(|_| CUDA_ERROR_INVALID_CONTEXT)
}

/// # Safety
/// `can` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    entry(|| {
        device(dev)?;
        device(peer)?;
        // SAFETY: the caller's pointer.
        unsafe { out(can, 0) }
    })
}

/// # Safety
/// `value` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    value: *mut c_int,
    _attrib: c_int,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    entry(|| {
        device(src)?;
        device(dst)?;
        if src == dst {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        // Performance rank, access, native atomics, array access: none without direct access.
        // SAFETY: the caller's pointer.
        unsafe { out(value, 0) }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, flags: std::ffi::c_uint) -> CUresult {
    entry(|| {
        check_ctx(peer)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Err(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
    })
}

#[no_mangle]
pub extern "C" fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult {
    entry(|| {
        check_ctx(peer)?;
        Err(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyPeer(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
) -> CUresult {
    with_contexts(dst_ctx, src_ctx, || {
        super::mem::cuMemcpyDtoD_v2(dst, src, n)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
    s: CUstream,
) -> CUresult {
    with_contexts(dst_ctx, src_ctx, || {
        super::mem::cuMemcpyDtoDAsync_v2(dst, src, n, s)
    })
}

/// The copy, once both contexts a peer copy names are this shim's (the pointers, unified,
/// say which GPU each end lies on).
fn with_contexts(dst: CUcontext, src: CUcontext, copy: impl FnOnce() -> CUresult) -> CUresult {
    match check_ctx(dst).and(check_ctx(src)) {
        Ok(_) => copy(),
        Err(e) => e,
    }
}
