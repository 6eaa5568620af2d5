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

use super::mem::{copy_dtoh, copy_htod};
use crate::cuda::*;
use crate::handles::{resolve, Stream, CTX_MAGIC};
use crate::state::ctx::current_dev;
use crate::state::ctx::CUcontext;
use crate::state::device::device;
use crate::state::entry::{entry, live, out};
use crate::state::ranges::plain_alloc;
use crate::state::streams::{
    handle_call, resolve_stream, stream_sync, CUstream, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD,
};
use omps_ring::wire::{CopyPeer, Op, PeerAccess};
use std::ffi::c_int;

const CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: CUresult = 217;
const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
const CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: CUresult = 705;
/// cuDeviceGetP2PAttribute's index of "access supported".
const ACCESS: usize = 2;

/// Pairs of contexts with access enabled: (context, peer context, their devices).
static ENABLED: std::sync::Mutex<Vec<Enabled>> = std::sync::Mutex::new(Vec::new());

#[derive(Clone, Copy, PartialEq)]
struct Enabled {
    ctx: usize,
    peer: usize,
    dev: usize,
    peer_dev: usize,
}

/// Whether this process enabled access from device `dev` to device `peer_dev`.
fn enabled_between(dev: usize, peer_dev: usize) -> bool {
    enabled()
        .iter()
        .any(|e| e.dev == dev && e.peer_dev == peer_dev)
}
/// Bytes moved through host memory at a time.
const PIECE: usize = 8 << 20;

/// `len` bytes from `src` (on GPU `sd`) to `dst` (on GPU `dd`): directly, over peer
/// access, on the stream's GPU where the process enabled it and the far end is an
/// allocation of its own; otherwise through host memory, after the work queued on `stream`.
pub(crate) fn copy_between(
    dst: u64,
    src: u64,
    len: usize,
    (dd, sd): (usize, usize),
    stream: CUstream,
) -> Result<(), CUresult> {
    let target = resolve_stream(stream)?;
    if let Some((near, far)) = direct_side(dst, src, len as u64, (dd, sd), target) {
        return copy_direct(near, far, dst, src, len as u64, far == sd, stream);
    }
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

/// The GPUs (near, far) of a direct copy: near runs it (the stream's GPU, or for the
/// default stream the current device if it holds an end, else the destination's, or the
/// other GPU where only that direction has access); None where it must be staged.
fn direct_side(
    dst: u64,
    src: u64,
    len: u64,
    (dd, sd): (usize, usize),
    target: Option<&Stream>,
) -> Option<(usize, usize)> {
    let near = match target {
        Some(st) => st.dev,
        None => current_dev()
            .ok()
            .filter(|&d| d == dd || d == sd)
            .unwrap_or(dd),
    };
    let (far, far_addr, near_addr) = match near {
        n if n == dd => (sd, src, dst),
        n if n == sd => (dd, dst, src),
        _ => return None,
    };
    if enabled_between(near, far) {
        plain_alloc(far_addr, len).then_some((near, far))
    } else if target.is_none() && enabled_between(far, near) {
        plain_alloc(near_addr, len).then_some((far, near))
    } else {
        None
    }
}

/// A copy over peer access, queued on GPU `near`. On the default stream it keeps
/// cuMemcpyPeer's promise: after the work already queued on both GPUs, and done before
/// anything queued after it (the call waits for it).
fn copy_direct(
    near: usize,
    far: usize,
    dst: u64,
    src: u64,
    len: u64,
    far_is_src: bool,
    stream: CUstream,
) -> Result<(), CUresult> {
    let named = match stream as usize {
        0 | CU_STREAM_LEGACY | CU_STREAM_PER_THREAD => None,
        _ => resolve_stream(stream)?,
    };
    if named.is_none() {
        crate::state::ctx::sync_device(far)?;
    }
    let id = named.map_or(omps_ring::wire::STREAM_DEFAULT, |st| st.id);
    let rec = CopyPeer {
        dst,
        src,
        len,
        stream: id,
        peer: far as u32,
        far_is_src: far_is_src as u32,
        _pad: 0,
    };
    live()?.push(near, Op::CopyPeer, &[bytemuck::bytes_of(&rec)])?;
    if named.is_none() {
        handle_call(near, Op::StreamSync, id)?;
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

fn enabled() -> std::sync::MutexGuard<'static, Vec<Enabled>> {
    ENABLED.lock().unwrap_or_else(|e| e.into_inner())
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

/// Has the server give its context on `dev` access to `peer_dev`'s memory (once, for every
/// client) and mark this process: answered once it has, so that no free sent after this
/// returns, on any GPU, is released before the process's work everywhere is done.
pub(crate) fn ask_server(dev: usize, peer_dev: usize) -> Result<(), CUresult> {
    live()?.channel().call(dev, Op::PeerAccess, |call| {
        bytemuck::bytes_of(&PeerAccess {
            call,
            peer: peer_dev as u32,
            _pad: 0,
        })
        .to_vec()
    })?;
    Ok(())
}

/// Whether the server's GPU behind `dev` can reach `peer_dev`'s memory directly.
pub(crate) fn can_reach(dev: usize, peer_dev: usize) -> bool {
    dev != peer_dev && p2p(dev as CUdevice, peer_dev as CUdevice, ACCESS).is_ok_and(|a| a == 1)
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
