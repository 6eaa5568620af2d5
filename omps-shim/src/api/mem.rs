//! Device memory: allocation in the server, copies staged through the segment in
//! pipelined chunks, memsets. The shim keeps its own table of the client's ranges so bad
//! pointers get their error synchronously, as from the driver; the server checks again.

use crate::cuda::*;
use crate::state::blocks::alloc;
use crate::state::capture::stream_for;
use crate::state::ctx::current_dev;
use crate::state::entry::{entry, live, out};
use crate::state::host_ranges::is_shared;
use crate::state::ranges::*;
use crate::state::streams::CUstream;
use omps_ring::segment::CHUNKS_PER_CHANNEL;
use omps_ring::wire::{self, CallHdr, ChunkCopy, CopyDtoD, Memset, Op, PinnedCopy};
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
    live()?.push(dev, Op::Memset, &[bytemuck::bytes_of(&m)])?;
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

/// Host to device; a synchronous copy also delivers device printf output, as the driver's does.
pub(crate) fn copy_htod(
    dst: u64,
    src: *const u8,
    len: usize,
    stream: CUstream,
    sync: bool,
) -> Result<(), CUresult> {
    if !sync && len > 0 && !is_shared(src as u64, len) {
        if let Some(id) = super::staged::capturing(stream)? {
            // A pageable source in a capture: read on every replay (api/staged.rs).
            range_dev(dst, len as u64)?;
            return super::staged::capture_copy(Some(true), dst, src as usize, 0, len, stream, id);
        }
    }
    let r = copy_htod_queued(dst, src, len, stream, sync);
    if sync {
        deliver_printf(dst, len, r.is_err());
    }
    r
}

/// Device to host; a synchronous copy also delivers device printf output.
pub(crate) fn copy_dtoh(
    dst: *mut u8,
    src: u64,
    len: usize,
    stream: CUstream,
    sync: bool,
) -> Result<(), CUresult> {
    if !sync && len > 0 && !is_shared(dst as u64, len) {
        if let Some(id) = super::staged::capturing(stream)? {
            // A pageable destination in a capture: written on every replay.
            range_dev(src, len as u64)?;
            return super::staged::capture_copy(Some(false), src, dst as usize, 0, len, stream, id);
        }
    }
    let r = copy_dtoh_queued(dst, src, len, stream, sync);
    if sync {
        deliver_printf(src, len, r.is_err());
    }
    r
}

fn deliver_printf(dptr: u64, len: usize, failed: bool) {
    if let Ok(dev) = range_dev(dptr, len as u64) {
        if crate::printf::wanted(dev, failed) {
            crate::printf::deliver(dev, failed, crate::printf::Covers::Unknown, 0);
        }
    }
}

/// Host to device through the staging chunks: copy a piece in while earlier pieces DMA.
/// An asynchronous copy returns once the source is consumed, a blocking one once the
/// data has landed.
fn copy_htod_queued(
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
    let sync = sync || foreign;
    if is_shared(src as u64, len) {
        return pinned_copy(Op::CopyHtoDPinned, dev, dst, src as u64, len, s, sync);
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
        c.push(dev, Op::CopyHtoDInline, &[bytemuck::bytes_of(&rec), bytes])?;
        return if sync { wait_stream(dev, s) } else { Ok(()) };
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
    drop(ch);
    // A blocking copy's data is on the GPU when it returns: a kernel the program queues
    // next on a stream that does not wait for this one must find it there.
    if sync {
        wait_stream(dev, s)?;
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
fn copy_dtoh_queued(
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
        let sync = sync || foreign;
        return pinned_copy(Op::CopyDtoHPinned, dev, src, dst as u64, len, s, sync);
    }
    let c = live()?;
    let mut ch = c.channel();
    ch.wait_all_chunks()?;
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
    for (i, &(off, n)) in pieces.iter().enumerate() {
        if i >= CHUNKS_PER_CHANNEL {
            land(&mut ch, i - CHUNKS_PER_CHANNEL)?;
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
    for i in pieces.len().saturating_sub(CHUNKS_PER_CHANNEL)..pieces.len() {
        land(&mut ch, i)?;
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
        return super::peer::copy_between(dst, src, len, (dev, src_dev), stream);
    }
    let (s, wait) = stream_for(dev, stream)?;
    let rec = CopyDtoD {
        dst,
        src,
        len: len as u64,
        stream: s,
        _pad: 0,
    };
    live()?.push(dev, Op::CopyDtoD, &[bytemuck::bytes_of(&rec)])?;
    if wait {
        wait_stream(dev, s)?;
    }
    Ok(())
}

/// A copy that names its direction but has page-locked host memory where it says device:
/// valid under unified addressing (the driver looks at the pointers, not the name), so it
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
        .then(|| super::hostmem::copy_any(dst, src, n, s, sync))
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
