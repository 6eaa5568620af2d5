//! Green contexts as the stream lookups see them: which green context is current, which
//! one a stream belongs to, the legacy stream stream 0 names inside one, and the streams
//! made in one. The green-context entry points are api/green.rs.

use super::entry::live;
use crate::cuda::*;
use crate::handles::{leak, next_id, retire, Ctx, Stream, STREAM_MAGIC};
use omps_ring::wire::{self, CallHdr, Op};
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, RwLock};

pub const GREEN_MAGIC: u32 = 0x6772_6e21;

/// A stream of a destroyed green context: only cuStreamDestroy takes it.
pub const DETACHED_MAGIC: u32 = 0x6474_6368;

#[repr(C)]
pub struct GreenCtx {
    pub magic: AtomicU32,
    /// Its id on the wire.
    pub id: u32,
    pub dev: usize,
    pub sms: u32,
    /// What cuCtxFromGreenCtx gives.
    pub ctx: &'static Ctx,
    /// Its legacy default stream.
    pub legacy: &'static Stream,
    /// cuGreenCtxGetId's answer.
    pub uid: u64,
    /// Streams made in it (besides its legacy stream), destroyed or not.
    pub(crate) streams: Mutex<Vec<&'static Stream>>,
    /// A stream of its own that cuGreenCtxRecordEvent joins its streams in, made at first use.
    pub(crate) join: Mutex<Option<u32>>,
}

/// The live green contexts, looked up by context and by stream. Empty in nearly every
/// process, which `ANY` tells the stream lookups without a lock.
pub(crate) static GREENS: RwLock<Vec<&'static GreenCtx>> = RwLock::new(Vec::new());

pub(crate) static ANY: AtomicBool = AtomicBool::new(false);

pub(crate) fn greens() -> std::sync::RwLockReadGuard<'static, Vec<&'static GreenCtx>> {
    GREENS.read().unwrap_or_else(|e| e.into_inner())
}

/// The green context whose context is current on this thread, if any.
pub(crate) fn current_green() -> Option<&'static GreenCtx> {
    if !ANY.load(Ordering::Acquire) {
        return None;
    }
    let c = crate::state::ctx::current_ctx();
    greens()
        .iter()
        .find(|g| std::ptr::eq(g.ctx as *const Ctx, c as *const Ctx))
        .copied()
}

/// The green context of context `c`, if it is one's.
pub(crate) fn green_of_ctx(c: *const Ctx) -> Option<&'static GreenCtx> {
    if !ANY.load(Ordering::Acquire) {
        return None;
    }
    greens()
        .iter()
        .find(|g| std::ptr::eq(g.ctx as *const Ctx, c))
        .copied()
}

/// The green context stream `s` was made in, if any.
pub(crate) fn green_of_stream(s: &Stream) -> Option<&'static GreenCtx> {
    if !ANY.load(Ordering::Acquire) {
        return None;
    }
    greens()
        .iter()
        .find(|g| {
            std::ptr::eq(g.legacy, s)
                || g.streams
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .any(|&x| std::ptr::eq(x, s))
        })
        .copied()
}

pub(crate) fn call(dev: usize, rec: wire::GreenCall) -> Result<(), CUresult> {
    let c = live()?;
    let mut ch = c.channel();
    ch.call(dev, Op::Green, |call: CallHdr| {
        bytemuck::bytes_of(&wire::GreenCall { call, ..rec }).to_vec()
    })
}

/// A new stream in green context `g`, with its quota taken.
pub(crate) fn make_stream(
    g: &GreenCtx,
    flags: c_uint,
    priority: c_int,
) -> Result<&'static Stream, CUresult> {
    let [least, greatest] = crate::state::device::device(g.dev as CUdevice)?.stream_priority;
    let priority = priority.clamp(greatest.min(least), least.max(greatest));
    let id = next_id();
    let c = live()?;
    c.streams.take()?;
    let rec = wire::GreenCall {
        kind: wire::green::STREAM,
        green: g.id,
        stream: id,
        flags,
        priority,
        ..Default::default()
    };
    if let Err(e) = call(g.dev, rec) {
        c.streams.give_back();
        return Err(e);
    }
    Ok(new_handle(id, g.dev, flags, priority))
}

pub(crate) fn new_handle(id: u32, dev: usize, flags: c_uint, priority: c_int) -> &'static Stream {
    // SAFETY: freshly leaked, never freed.
    unsafe {
        &*leak(Stream {
            magic: AtomicU32::new(STREAM_MAGIC),
            id,
            dev,
            flags,
            priority,
        })
    }
}

/// cuStreamCreate while a green context is current: the stream is made in it. None when
/// no green context is current (the caller makes an ordinary stream).
pub(crate) fn stream_in_current(
    flags: c_uint,
    priority: c_int,
) -> Result<Option<&'static Stream>, CUresult> {
    let Some(g) = current_green() else {
        return Ok(None);
    };
    let s = make_stream(g, flags, priority)?;
    g.streams.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    Ok(Some(s))
}

/// The legacy stream that stream 0 names on this thread: the current green context's, or
/// None for the client's own.
pub(crate) fn legacy_stream() -> Option<&'static Stream> {
    current_green().map(|g| g.legacy)
}

/// cuStreamDestroy of a stream whose green context is gone: Some(result) if it was one.
pub(crate) fn destroy_detached(s: *mut Stream) -> Option<CUresult> {
    if s.is_null() || (s as usize) <= 2 {
        return None;
    }
    // SAFETY: a stream handle from this shim (a leaked box whose first field is its magic).
    let m = unsafe { &(*s).magic };
    (m.load(Ordering::Acquire) == DETACHED_MAGIC)
        .then(|| retire(m, DETACHED_MAGIC).map_or_else(|e| e, |_| CUDA_SUCCESS))
}
