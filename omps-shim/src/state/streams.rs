//! Streams, events and functions as handles: what a `CUstream` names (the legacy, the
//! per-thread or a green context's stream), the server's id and device behind it, and
//! the stream and event synchronizations every family uses.

use super::ctx::current_dev;
use super::entry::live;
use crate::cuda::*;
use crate::handles::{
    leak, next_id, resolve, Event, Function, Stream, EVENT_MAGIC, FUNC_MAGIC, STREAM_MAGIC,
};
use omps_ring::wire::{self, HandleCall, Op, StreamCreate};
use std::sync::atomic::AtomicU32;

pub type CUstream = *mut Stream;

pub type CUevent = *mut Event;

pub type CUfunction = *mut Function;

pub(crate) const CU_STREAM_LEGACY: usize = 0x1;

pub(crate) const CU_STREAM_PER_THREAD: usize = 0x2;

/// The wire id of a stream handle; 0 (and the legacy / per-thread handles) is the
/// client's default stream.
pub(crate) fn stream_of(s: CUstream) -> Result<u32, CUresult> {
    Ok(resolve_stream(s)?.map_or(wire::STREAM_DEFAULT, |st| st.id))
}

pub(crate) fn resolve_stream(s: CUstream) -> Result<Option<&'static Stream>, CUresult> {
    match s as usize {
        0 if PER_THREAD.get() => per_thread_stream().map(Some),
        CU_STREAM_PER_THREAD => per_thread_stream().map(Some),
        // While a green context is current, its own legacy stream.
        0 | CU_STREAM_LEGACY => Ok(super::green::legacy_stream()),
        // SAFETY: the caller passed a stream handle, as the API requires.
        _ => unsafe { resolve(s as *const Stream, STREAM_MAGIC) }.map(Some),
    }
}

thread_local! {
    /// Set while a `_ptds` / `_ptsz` entry point runs: stream 0 means this thread's stream.
    static PER_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static THREAD_STREAMS: std::cell::RefCell<Vec<(usize, &'static Stream)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs an entry point with per-thread default stream semantics.
pub(crate) fn per_thread<R>(f: impl FnOnce() -> R) -> R {
    PER_THREAD.set(true);
    let r = f();
    PER_THREAD.set(false);
    r
}

/// This thread's default stream on the current device, made on first use. Like CUDA's, it
/// is a blocking stream: it synchronizes with the legacy default stream.
pub(crate) fn per_thread_stream() -> Result<&'static Stream, CUresult> {
    let dev = current_dev()?;
    if let Some(s) =
        THREAD_STREAMS.with(|t| t.borrow().iter().find(|(d, _)| *d == dev).map(|(_, s)| *s))
    {
        return Ok(s);
    }
    let id = next_id();
    let rec = StreamCreate {
        id,
        flags: 0,
        priority: 0,
        _pad: 0,
    };
    let c = live()?;
    c.streams.take()?;
    c.push(dev, Op::StreamCreate, &[bytemuck::bytes_of(&rec)])?;
    // SAFETY: freshly leaked, never freed.
    let s: &'static Stream = unsafe {
        &*leak(Stream {
            magic: AtomicU32::new(STREAM_MAGIC),
            id,
            dev,
            flags: 0,
            priority: 0,
        })
    };
    THREAD_STREAMS.with(|t| t.borrow_mut().push((dev, s)));
    Ok(s)
}

/// Device a stream belongs to: its own, or the current context's for the default stream.
pub(crate) fn stream_dev(s: CUstream) -> Result<(u32, usize), CUresult> {
    resolved_id_dev(resolve_stream(s)?)
}

/// The server's stream id and the device of a resolved stream (None: the legacy stream).
pub(crate) fn resolved_id_dev(st: Option<&Stream>) -> Result<(u32, usize), CUresult> {
    match st {
        Some(st) => Ok((st.id, st.dev)),
        None => Ok((wire::STREAM_DEFAULT, current_dev()?)),
    }
}

/// A call about stream or event `id`. After a synchronization, device printf output is
/// delivered, as the driver writes it at such calls.
pub(crate) fn handle_call(dev: usize, op: Op, id: u32) -> Result<(), CUresult> {
    use crate::printf::{before_sync, deliver, Covers};
    let c = live()?;
    let before = before_sync(dev);
    let mut ch = c.channel();
    let r = ch.call(dev, op, |call| {
        bytemuck::bytes_of(&HandleCall { call, id, _pad: 0 }).to_vec()
    });
    drop(ch);
    match op {
        Op::StreamSync => deliver(dev, r.is_err(), Covers::Stream(id), before),
        Op::EventSync => deliver(dev, r.is_err(), Covers::Unknown, before),
        _ => {}
    }
    r
}

/// cuStreamSynchronize's work, for the shim's own synchronizations (which the capture
/// modes do not restrict: a synchronous memset is allowed during a capture).
pub(crate) fn stream_sync(s: CUstream) -> Result<(), CUresult> {
    let (id, dev) = stream_dev(s)?;
    handle_call(dev, Op::StreamSync, id)
}

pub(crate) fn event(e: CUevent) -> Result<&'static Event, CUresult> {
    // SAFETY: the caller passed an event handle, as the API requires.
    unsafe { resolve(e as *const Event, EVENT_MAGIC) }
}

pub(crate) fn function(f: CUfunction) -> Result<&'static Function, CUresult> {
    // SAFETY: the caller passed a function handle, as the API requires.
    unsafe { resolve(f as *const Function, FUNC_MAGIC) }
}
