//! The copy paths every memory family shares: pipelined copies through the segment's
//! chunks, DMA to and from shared pinned memory, device-to-device copies and copies
//! between GPUs (with the process's peer-access pairs they read), and the waits that
//! finish them. Below the families (mem, hostmem, array, staged, peer, pool) that call them.

use crate::cuda::*;
use crate::handles::{resolve, Stream, CTX_MAGIC};
use crate::state::capture::stream_for;
use crate::state::ctx::{current_dev, CUcontext};
use crate::state::device::device;
use crate::state::entry::live;
use crate::state::host_ranges::is_shared;
use crate::state::profile::{self, copy_kind, memory_kind, Work};
use crate::state::ranges::*;
use crate::state::streams::{
    handle_call, resolve_stream, stream_sync, CUstream, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD,
};
use omps_ring::segment::CHUNKS_PER_CHANNEL;
use omps_ring::wire::{self, ChunkCopy, CopyDtoD, CopyPeer, Op, PeerAccess, PinnedCopy};

/// A synchronous memset or device-to-device copy that touches page-locked or managed
/// memory returns once done, as the driver's does (in device memory it need not).
pub(crate) fn finish_if_host(dst: u64, src: u64) -> Result<(), CUresult> {
    if crate::state::host_ranges::is_shared(dst, 1) || crate::state::host_ranges::is_shared(src, 1)
    {
        crate::state::streams::stream_sync(std::ptr::null_mut())
    } else {
        Ok(())
    }
}

pub(crate) fn deliver_printf(dptr: u64, len: usize, failed: bool) {
    if let Ok(dev) = range_dev(dptr, len as u64) {
        if crate::printf::wanted(dev, failed) {
            crate::printf::deliver(dev, failed, crate::printf::Covers::Unknown, 0);
        }
    }
}

/// Host to device through the staging chunks: copy a piece in while earlier pieces DMA.
/// An asynchronous copy returns once the source is consumed, a blocking one once the
/// data has landed.
pub(crate) fn copy_htod_queued(
    dst: u64,
    src: *const u8,
    len: usize,
    stream: CUstream,
    sync: bool,
) -> Result<(), CUresult> {
    if len == 0 {
        return Ok(());
    }
    if src.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = range_dev(dst, len as u64)?;
    let (s, foreign) = stream_for(dev, stream)?;
    let shared = is_shared(src as u64, len);
    let work = || copy_work(copy_kind::HTOD, shared, len, !(sync || foreign));
    profile::around(stream, dev, work, || {
        htod_queue(dev, dst, src, len, s, shared)
    })?;
    // A blocking copy's data is on the GPU when it returns: a kernel the program queues
    // next on a stream that does not wait for this one must find it there.
    if sync || foreign {
        wait_stream(dev, s)?;
    }
    Ok(())
}

/// What a profiler records of a copy: its direction, its host side's kind (pinned or
/// pageable; unused device to device) and its size.
fn copy_work(kind: u8, host_pinned: bool, len: usize, asynchronous: bool) -> Work<'static> {
    let host = if host_pinned {
        memory_kind::PINNED
    } else {
        memory_kind::PAGEABLE
    };
    let (src_kind, dst_kind) = match kind {
        copy_kind::HTOD => (host, memory_kind::DEVICE),
        copy_kind::DTOH => (memory_kind::DEVICE, host),
        _ => (memory_kind::DEVICE, memory_kind::DEVICE),
    };
    Work::Copy {
        copy_kind: kind,
        src_kind,
        dst_kind,
        bytes: len as u64,
        asynchronous,
    }
}

/// Queues a host-to-device copy on stream `s` without waiting for it.
fn htod_queue(
    dev: usize,
    dst: u64,
    src: *const u8,
    len: usize,
    s: u32,
    shared: bool,
) -> Result<(), CUresult> {
    if shared {
        return pinned_copy(Op::CopyHtoDPinned, dev, dst, src as u64, len, s, false);
    }
    let c = live()?;
    if len <= wire::INLINE_COPY_MAX && len.is_multiple_of(4) && dst.is_multiple_of(4) {
        // A few bytes travel in the record: no chunk to fill, wait for or signal.
        let rec = wire::InlineCopy {
            dev: dst,
            stream: s,
            len: len as u32,
        };
        // SAFETY: the caller's source holds len bytes.
        let bytes = unsafe { std::slice::from_raw_parts(src, len) };
        return c.push(dev, Op::CopyHtoDInline, &[bytemuck::bytes_of(&rec), bytes]);
    }
    let mut ch = c.channel();
    let chunk = c.params().chunk_bytes as usize;
    for (i, off) in (0..len).step_by(chunk).enumerate() {
        let k = i % CHUNKS_PER_CHANNEL;
        let n = chunk.min(len - off);
        ch.wait_chunk(k)?;
        let (p, _) = ch.chunk_ptr(k);
        // SAFETY: the caller's source holds len bytes; the chunk holds `chunk` >= n bytes
        // and is ours until its transfer is queued.
        unsafe { crate::pcopy::copy(p, src.add(off), n) };
        let seq = ch.claim_chunk(k);
        let rec = ChunkCopy {
            dev: dst + off as u64,
            channel: ch.idx,
            chunk: k as u32,
            len: n as u32,
            seq,
            stream: s,
            _pad: 0,
        };
        c.push(dev, Op::CopyHtoDChunk, &[bytemuck::bytes_of(&rec)])?;
    }
    Ok(())
}

/// A copy between device memory and a shared pinned allocation: one DMA in stream
/// order, no staging. A synchronous copy waits for it, as CUDA's does.
fn pinned_copy(
    op: Op,
    dev: usize,
    dptr: u64,
    host: u64,
    len: usize,
    stream: u32,
    sync: bool,
) -> Result<(), CUresult> {
    let c = live()?;
    let rec = PinnedCopy {
        dev: dptr,
        host,
        len: len as u64,
        stream,
        _pad: 0,
    };
    c.push(dev, op, &[bytemuck::bytes_of(&rec)])?;
    if sync {
        wait_stream(dev, stream)?;
    }
    Ok(())
}

/// Waits until everything queued on `stream` so far is done on the GPU.
pub(crate) fn wait_stream(dev: usize, stream: u32) -> Result<(), CUresult> {
    let c = live()?;
    let mut ch = c.channel();
    ch.call(dev, Op::StreamSync, |call| {
        bytemuck::bytes_of(&wire::HandleCall {
            call,
            id: stream,
            _pad: 0,
        })
        .to_vec()
    })
}

/// Device to host: keep up to CHUNKS_PER_CHANNEL pieces in flight, copy each out as it lands.
pub(crate) fn copy_dtoh_queued(
    dst: *mut u8,
    src: u64,
    len: usize,
    stream: CUstream,
    sync: bool,
) -> Result<(), CUresult> {
    if len == 0 {
        return Ok(());
    }
    if dst.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = range_dev(src, len as u64)?;
    let (s, foreign) = stream_for(dev, stream)?;
    if is_shared(dst as u64, len) {
        let work = || copy_work(copy_kind::DTOH, true, len, !(sync || foreign));
        profile::around(stream, dev, work, || {
            pinned_copy(Op::CopyDtoHPinned, dev, src, dst as u64, len, s, false)
        })?;
        if sync || foreign {
            wait_stream(dev, s)?;
        }
        return Ok(());
    }
    let c = live()?;
    // Reported before the channel is taken (the profiler may need one to begin), ended
    // after the last piece is queued, before the host waits for the pieces in flight.
    // The pageable path returns once the data has landed, whatever `sync` says.
    let begun = profile::begin(stream, dev, || {
        copy_work(copy_kind::DTOH, false, len, false)
    });
    let mut ch = c.channel();
    if let Err(e) = ch.wait_all_chunks() {
        profile::end(begun, e);
        return Err(e);
    }
    let chunk = c.params().chunk_bytes as usize;
    let pieces: Vec<(usize, usize)> = (0..len)
        .step_by(chunk)
        .map(|off| (off, chunk.min(len - off)))
        .collect();
    let land = |ch: &mut crate::conn::ChanGuard, i: usize| -> Result<(), CUresult> {
        let k = i % CHUNKS_PER_CHANNEL;
        ch.wait_chunk(k)?;
        let (p, _) = ch.chunk_ptr(k);
        let (off, n) = pieces[i];
        // SAFETY: the GPU has written n bytes into the chunk; the caller's buffer holds len.
        unsafe { crate::pcopy::copy(dst.add(off), p, n) };
        Ok(())
    };
    let queued = queue_dtoh_pieces(c, &mut ch, (dev, src), &pieces, s, &land);
    profile::end(begun, queued.err().unwrap_or(CUDA_SUCCESS));
    queued?;
    for i in pieces.len().saturating_sub(CHUNKS_PER_CHANNEL)..pieces.len() {
        land(&mut ch, i)?;
    }
    Ok(())
}

/// Queues each piece of a device-to-host copy through the channel's chunks, landing the
/// piece that held a chunk before it is claimed again.
fn queue_dtoh_pieces(
    c: &crate::conn::Conn,
    ch: &mut crate::conn::ChanGuard,
    (dev, src): (usize, u64),
    pieces: &[(usize, usize)],
    s: u32,
    land: &dyn Fn(&mut crate::conn::ChanGuard, usize) -> Result<(), CUresult>,
) -> Result<(), CUresult> {
    for (i, &(off, n)) in pieces.iter().enumerate() {
        if i >= CHUNKS_PER_CHANNEL {
            land(ch, i - CHUNKS_PER_CHANNEL)?;
        }
        let k = i % CHUNKS_PER_CHANNEL;
        let seq = ch.claim_chunk(k);
        let rec = ChunkCopy {
            dev: src + off as u64,
            channel: ch.idx,
            chunk: k as u32,
            len: n as u32,
            seq,
            stream: s,
            _pad: 0,
        };
        c.push(dev, Op::CopyDtoHChunk, &[bytemuck::bytes_of(&rec)])?;
    }
    Ok(())
}

pub(crate) fn copy_dtod(dst: u64, src: u64, len: usize, stream: CUstream) -> Result<(), CUresult> {
    if len == 0 {
        return Ok(());
    }
    let dev = range_dev(dst, len as u64)?;
    let src_dev = range_dev(src, len as u64)?;
    if src_dev != dev {
        return copy_between(dst, src, len, (dev, src_dev), stream);
    }
    let (s, wait) = stream_for(dev, stream)?;
    let rec = CopyDtoD {
        dst,
        src,
        len: len as u64,
        stream: s,
        _pad: 0,
    };
    let work = || copy_work(copy_kind::DTOD, false, len, !wait);
    profile::around(stream, dev, work, || {
        live()?.push(dev, Op::CopyDtoD, &[bytemuck::bytes_of(&rec)])
    })?;
    if wait {
        wait_stream(dev, s)?;
    }
    Ok(())
}

/// cuDeviceGetP2PAttribute's index of "access supported".
pub(crate) const ACCESS: usize = 2;

/// Pairs of contexts with access enabled: (context, peer context, their devices).
pub(crate) static ENABLED: std::sync::Mutex<Vec<Enabled>> = std::sync::Mutex::new(Vec::new());

#[derive(Clone, Copy, PartialEq)]
pub(crate) struct Enabled {
    pub(crate) ctx: usize,
    pub(crate) peer: usize,
    pub(crate) dev: usize,
    pub(crate) peer_dev: usize,
}

/// Whether this process enabled access from device `dev` to device `peer_dev`.
pub(crate) fn enabled_between(dev: usize, peer_dev: usize) -> bool {
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
        sync_dtoh(buf.as_mut_ptr(), src + off as u64, n)?;
        sync_htod(dst + off as u64, buf.as_ptr(), n)?;
        off += n;
    }
    Ok(())
}

/// The GPUs (near, far) of a direct copy: near runs it (the stream's GPU, or for the
/// default stream the current device if it holds an end, else the destination's, or the
/// other GPU where only that direction has access); None where it must be staged.
pub(crate) fn direct_side(
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
pub(crate) fn copy_direct(
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

pub(crate) fn check_ctx(c: CUcontext) -> Result<usize, CUresult> {
    // SAFETY: a handle from this shim, as the API requires.
    unsafe { resolve(c, CTX_MAGIC) }
        .map(|ctx| ctx.dev)
        .map_err(|_| CUDA_ERROR_INVALID_CONTEXT)
}

/// P2P attribute `attr` (1-based, as the driver numbers them) from `src` to `dst`.
pub(crate) fn p2p(src: CUdevice, dst: CUdevice, attr: usize) -> Result<i32, CUresult> {
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

pub(crate) fn enabled() -> std::sync::MutexGuard<'static, Vec<Enabled>> {
    ENABLED.lock().unwrap_or_else(|e| e.into_inner())
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

/// A blocking copy to the device on the default stream, as api/staged.rs's `copy_htod`
/// with `sync` does (a blocking copy is never staged): it also delivers printf output.
fn sync_htod(dst: u64, src: *const u8, len: usize) -> Result<(), CUresult> {
    let r = copy_htod_queued(dst, src, len, std::ptr::null_mut(), true);
    deliver_printf(dst, len, r.is_err());
    r
}

/// A blocking copy from the device on the default stream, as `copy_dtoh` with `sync`.
fn sync_dtoh(dst: *mut u8, src: u64, len: usize) -> Result<(), CUresult> {
    let r = copy_dtoh_queued(dst, src, len, std::ptr::null_mut(), true);
    deliver_printf(src, len, r.is_err());
    r
}
