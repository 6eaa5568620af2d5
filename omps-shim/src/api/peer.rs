//! Copies between GPUs, and direct peer access.
//!
//! The server enables direct access between every pair of its GPUs that can reach each
//! other (one context per GPU serves every client), and the snapshot says which pairs do:
//! `cuDeviceCanAccessPeer` and `cuDeviceGetP2PAttribute` answer from it. A context's
//! `cuCtxEnablePeerAccess` is bookkeeping here (the already-enabled and not-enabled errors
//! come from it), plus one call that tells the server: from then on what the client frees
//! on one GPU waits for its work on every GPU, since a kernel of its elsewhere may use it.
//!
//! A copy between two GPUs' memory goes through this process's host memory: the source
//! GPU copies a piece out, the destination GPU copies it in, each checked by its own
//! session (each GPU's worker checks only the ranges the client holds there). Such a copy
//! is ordered after the work of the stream it names (which it synchronizes first) and
//! done when the call returns.

use super::ctx::CUcontext;
use super::device::device;
use super::exec::{stream_sync, CUstream};
use super::mem::{copy_dtoh, copy_htod};
use super::{entry, live, out};
use crate::cuda::*;
use crate::handles::{resolve, CTX_MAGIC};
use omps_ring::wire::{CallHdr, Op};
use std::ffi::c_int;

const CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: CUresult = 217;
const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
const CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: CUresult = 705;
/// cuDeviceGetP2PAttribute's index of "access supported".
const ACCESS: usize = 2;

/// Pairs (context, peer context) with access enabled.
static ENABLED: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());
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

/// P2P attribute `attr` (1-based, as the driver numbers them) from `src` to `dst`.
fn p2p(src: CUdevice, dst: CUdevice, attr: usize) -> Result<i32, CUresult> {
    let d = device(src)?;
    device(dst)?;
    if src == dst {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    if !(1..=omps_ring::segment::P2P_DEFINED).contains(&attr) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(d.p2p[dst as usize][attr - 1])
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
        let yes = dev != peer && p2p(dev, peer, ACCESS)? == 1;
        // SAFETY: the caller's pointer.
        unsafe { out(can, yes as c_int) }
    })
}

/// # Safety
/// `value` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    value: *mut c_int,
    attrib: c_int,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    entry(|| {
        let v = p2p(src, dst, usize::try_from(attrib).unwrap_or(0))?;
        // SAFETY: the caller's pointer.
        unsafe { out(value, v) }
    })
}

fn enabled() -> std::sync::MutexGuard<'static, Vec<(usize, usize)>> {
    ENABLED.lock().unwrap_or_else(|e| e.into_inner())
}

#[no_mangle]
pub extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, flags: std::ffi::c_uint) -> CUresult {
    entry(|| {
        let peer_dev = check_ctx(peer)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let here = super::ctx::current_ctx_checked()?;
        let dev = check_ctx(here)?;
        if dev == peer_dev || p2p(dev as CUdevice, peer_dev as CUdevice, ACCESS)? != 1 {
            return Err(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
        }
        let pair = (here as usize, peer as usize);
        let mut on = enabled();
        if on.contains(&pair) {
            return Err(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        // Answered once the server has marked the client: no free sent after this call
        // returns, on any GPU, is released before the client's work everywhere is done.
        let c = live()?;
        c.channel().call(dev, Op::PeerAccess, |call: CallHdr| {
            bytemuck::bytes_of(&call).to_vec()
        })?;
        on.push(pair);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult {
    entry(|| {
        check_ctx(peer)?;
        let pair = (super::ctx::current_ctx_checked()? as usize, peer as usize);
        let mut on = enabled();
        let i = on
            .iter()
            .position(|&p| p == pair)
            .ok_or(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)?;
        on.swap_remove(i);
        Ok(())
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
