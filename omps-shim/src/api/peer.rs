//! Copies between GPUs, and direct peer access.
//!
//! The server runs each GPU's clients in one context per GPU. The snapshot says which
//! pairs of GPUs can reach each other (`cuDeviceCanAccessPeer`, `cuDeviceGetP2PAttribute`
//! answer from it); `cuCtxEnablePeerAccess` and `cuCtxDisablePeerAccess` keep the driver's
//! errors per pair of contexts, and an enable asks the server, which enables access in its
//! context the first time any client asks (every allocation in a context with peer access
//! is mapped on the peer too, so it is not done for servers whose clients never ask) and
//! from then on holds what this client frees until its work on every GPU is done.
//!
//! A copy between two GPUs' memory goes through this process's host memory: the source
//! GPU copies a piece out, the destination GPU copies it in, each checked by its own
//! session (each GPU's worker checks only the ranges the client holds there). Such a copy
//! is ordered after the work of the stream it names (which it synchronizes first) and
//! done when the call returns.

use crate::cuda::*;
use crate::state::copies::{ask_server, check_ctx, enabled, p2p, Enabled, ACCESS};
use crate::state::ctx::CUcontext;
use crate::state::device::device;
use crate::state::entry::{entry, out};
use crate::state::streams::CUstream;
use std::ffi::c_int;

const CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: CUresult = 217;
const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
const CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: CUresult = 705;
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

#[no_mangle]
pub extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, flags: std::ffi::c_uint) -> CUresult {
    entry(|| {
        let peer_dev = check_ctx(peer)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let here = crate::state::ctx::current_ctx_checked()?;
        let dev = check_ctx(here)?;
        if dev == peer_dev || p2p(dev as CUdevice, peer_dev as CUdevice, ACCESS)? != 1 {
            return Err(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
        }
        let pair = Enabled {
            ctx: here as usize,
            peer: peer as usize,
            dev,
            peer_dev,
        };
        let mut on = enabled();
        if on.iter().any(|e| e.ctx == pair.ctx && e.peer == pair.peer) {
            return Err(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        ask_server(dev, peer_dev)?;
        on.push(pair);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult {
    entry(|| {
        check_ctx(peer)?;
        let here = crate::state::ctx::current_ctx_checked()? as usize;
        let mut on = enabled();
        let i = on
            .iter()
            .position(|e| e.ctx == here && e.peer == peer as usize)
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
