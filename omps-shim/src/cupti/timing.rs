//! GPU times of the work a traced program queues. The work runs in the server's context,
//! so its times come from there: an event recorded just before and just after it on its
//! own stream (the server records them where the work runs), read back as elapsed times
//! from an anchor event of that GPU whose host time is known.
//!
//! The times of many spans come back in one round trip (`EventTimes`), asked without
//! waiting: work still running answers not ready and is asked again later.
//!
//! An anchor is an event recorded on a stream of the shim's own that nothing else uses,
//! and waited for; its GPU time lies between the host times before the record and after
//! the wait. The narrowest of three tries is kept, and a new anchor is taken once the
//! last is a second old, so that the float milliseconds CUDA gives stay finer than a
//! tenth of a microsecond.
//!
//! Every call here goes through the shim's own entry points with the profiler's reports
//! quieted (`profile::quiet`: no report, relaxed capture mode), so it never times itself
//! and never invalidates a capture. Events come from a pool per GPU, counted against the
//! client's event quota like the program's own, and are destroyed when tracing ends.

use crate::api::exec::{
    cuEventCreate, cuEventDestroy_v2, cuEventRecord, cuEventSynchronize, cuStreamCreate,
    cuStreamDestroy_v2,
};
use crate::api::stream_info::cuStreamIsCapturing;
use crate::cuda::*;
use crate::state::profile::{monotonic_ns, quiet};
use crate::state::streams::{CUevent, CUstream};
use omps_ring::wire::{self, Op};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// An event recorded on the GPU at a known host time. Its event goes back to the pool
/// when the last span that measures from it is done.
pub struct Anchor {
    dev: usize,
    event: CUevent,
    mono: u64,
}

impl Drop for Anchor {
    fn drop(&mut self) {
        give_back(self.dev, self.event);
    }
}

/// The two events around one piece of work; they go back to the pool when it is dropped.
pub struct Span {
    dev: usize,
    start: CUevent,
    end: Option<CUevent>,
    anchor: Arc<Anchor>,
}

impl Drop for Span {
    fn drop(&mut self) {
        give_back(self.dev, self.start);
        if let Some(e) = self.end {
            give_back(self.dev, e);
        }
    }
}

/// The span's work has not finished yet.
#[derive(Clone, Copy, Debug)]
pub struct NotReady;

// SAFETY: event handles are addresses of the shim's leaked event records, valid on any
// thread; the anchor's event likewise.
unsafe impl Send for Span {}
// SAFETY: as above.
unsafe impl Send for Anchor {}
// SAFETY: as above; nothing in an Anchor changes after it is made.
unsafe impl Sync for Anchor {}

#[derive(Default)]
struct PerGpu {
    free: Vec<usize>,
    anchor: Option<Arc<Anchor>>,
    stream: Option<usize>,
    /// The server was told this GPU is traced (`Profiling`): it then times the work of
    /// spans itself where it can (docs/design.md 12b, design S).
    announced: bool,
}

static GPUS: Mutex<Option<HashMap<usize, PerGpu>>> = Mutex::new(None);

const ANCHOR_AGE_NS: u64 = 1_000_000_000;
const ANCHOR_TRIES: usize = 3;

fn with_gpu<R>(dev: usize, f: impl FnOnce(&mut PerGpu) -> R) -> R {
    let mut g = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashMap::new).entry(dev).or_default())
}

/// Whether `dev` is the current context's device: events and streams are made there.
fn current(dev: usize) -> bool {
    crate::state::ctx::current_dev() == Ok(dev)
}

/// An event of device `dev`, from the pool or new (only while `dev` is current).
fn event(dev: usize) -> Option<CUevent> {
    if let Some(e) = with_gpu(dev, |g| g.free.pop()) {
        return Some(e as CUevent);
    }
    if !current(dev) {
        return None;
    }
    let mut e = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; flags 0 keep timing on.
    (unsafe { cuEventCreate(&mut e, 0) } == CUDA_SUCCESS).then_some(e)
}

fn give_back(dev: usize, e: CUevent) {
    with_gpu(dev, |g| g.free.push(e as usize));
}

/// The anchor of `dev`, a new one if there is none or it is a second old.
fn anchor(dev: usize) -> Option<Arc<Anchor>> {
    let now = monotonic_ns();
    let old = with_gpu(dev, |g| g.anchor.clone());
    if let Some(a) = &old {
        if now.saturating_sub(a.mono) < ANCHOR_AGE_NS || !current(dev) {
            return old;
        }
    }
    if !current(dev) {
        return None;
    }
    let stream = match with_gpu(dev, |g| g.stream) {
        Some(s) => s as CUstream,
        None => {
            let mut s = std::ptr::null_mut();
            const NON_BLOCKING: u32 = 1;
            // SAFETY: a valid out-pointer.
            if unsafe { cuStreamCreate(&mut s, NON_BLOCKING) } != CUDA_SUCCESS {
                return old;
            }
            with_gpu(dev, |g| g.stream = Some(s as usize));
            s
        }
    };
    let mut best: Option<(u64, Anchor)> = None;
    for _ in 0..ANCHOR_TRIES {
        let Some(e) = event(dev) else { break };
        let t0 = monotonic_ns();
        if cuEventRecord(e, stream) != CUDA_SUCCESS || cuEventSynchronize(e) != CUDA_SUCCESS {
            give_back(dev, e);
            break;
        }
        let t1 = monotonic_ns();
        let cand = Anchor {
            dev,
            event: e,
            mono: t0 / 2 + t1 / 2,
        };
        // The wider window's anchor is dropped: its event goes back to the pool.
        if best.as_ref().is_none_or(|(w, _)| t1 - t0 < *w) {
            best = Some((t1 - t0, cand));
        }
    }
    let Some((_, a)) = best else {
        super::debug::debug(|| format!("no anchor event on GPU {dev}: spans there are not timed"));
        return old;
    };
    let a = Arc::new(a);
    // The one replaced is dropped outside the pool's lock (its Drop takes the lock).
    let replaced = with_gpu(dev, |g| g.anchor.replace(a.clone()));
    drop(replaced);
    Some(a)
}

/// Tells the server whether this process traces GPU `dev`'s work; its answer (whether
/// it times the work itself) changes nothing here: EventTimes says per span.
fn announce(dev: usize, on: bool) {
    let Ok(c) = crate::state::entry::live() else {
        return;
    };
    let mut ch = c.channel();
    let r = ch.call(dev, Op::Profiling, |call| {
        bytemuck::bytes_of(&wire::Profiling {
            call,
            on: on as u32,
            _pad: 0,
        })
        .to_vec()
    });
    super::debug::debug(|| {
        format!(
            "GPU {dev}: the server times traced work itself: {}",
            r.is_ok()
        )
    });
}

/// The anchor work queued on `stream` of `dev` is timed from: None when the stream is
/// capturing (an event there would become a graph node) or no anchor is had.
fn ready(stream: CUstream, dev: usize) -> Option<Arc<Anchor>> {
    let mut status = 0u32;
    // SAFETY: a valid out-pointer.
    let r = unsafe { cuStreamIsCapturing(stream, &mut status) };
    if r != CUDA_SUCCESS || status != 0 {
        // A capture's work is timed when its graph replays; a failed query is said.
        if r != CUDA_SUCCESS {
            super::debug::debug(|| format!("a stream's capture status failed ({r}): not timed"));
        }
        return None;
    }
    if !with_gpu(dev, |g| std::mem::replace(&mut g.announced, true)) {
        announce(dev, true);
    }
    let a = anchor(dev);
    if a.is_none() {
        super::debug::debug(|| format!("no anchor on GPU {dev} (current: {:?})", current(dev)));
    }
    a
}

/// Records the start of work about to be queued on `stream` of `dev`: None when the
/// stream is capturing (an event there would become a graph node) or no event is had.
pub(crate) fn begin(stream: CUstream, dev: usize) -> Option<Span> {
    quiet(|| {
        let anchor = ready(stream, dev)?;
        let Some(start) = event(dev) else {
            super::debug::debug(|| format!("no event on GPU {dev} for a span"));
            return None;
        };
        if cuEventRecord(start, stream) != CUDA_SUCCESS {
            super::debug::debug(|| "recording a span's start failed".into());
            give_back(dev, start);
            return None;
        }
        Some(Span {
            dev,
            start,
            end: None,
            anchor,
        })
    })
}

/// Spans for the `n` timed nodes of a graph replay on `stream` of `dev`: their events are
/// recorded by the server's twin of the graph, not here. None when the stream is
/// capturing (the launch becomes a node of that capture) or events are short.
pub(crate) fn graph_spans(stream: CUstream, dev: usize, n: usize) -> Option<Vec<Span>> {
    quiet(|| {
        let anchor = ready(stream, dev)?;
        let mut spans = Vec::with_capacity(n);
        for _ in 0..n {
            // A span short of its events gives back what it took when dropped.
            let start = event(dev)?;
            let mut span = Span {
                dev,
                start,
                end: None,
                anchor: anchor.clone(),
            };
            span.end = Some(event(dev)?);
            spans.push(span);
        }
        Some(spans)
    })
}

/// The server's ids of a span's two events.
pub(crate) fn event_ids(span: &Span) -> Option<[u32; 2]> {
    let id = |e: CUevent| crate::state::streams::event(e).ok().map(|ev| ev.id);
    Some([id(span.start)?, id(span.end?)?])
}

/// Records the end of the work on `stream`, right after it was queued. Waits for
/// nothing: it may run while the caller holds a channel.
pub(crate) fn end(span: &mut Span, stream: CUstream) {
    quiet(|| {
        if let Some(e) = event(span.dev) {
            if cuEventRecord(e, stream) == CUDA_SUCCESS {
                span.end = Some(e);
            } else {
                give_back(span.dev, e);
            }
        }
    })
}

/// Waits until the span's work has finished (or failed).
pub fn wait(span: &Span) {
    if let Some(end) = span.end {
        quiet(|| cuEventSynchronize(end));
    }
}

/// Each span's start and end in monotonic nanoseconds, for work that has finished:
/// NotReady for work still running, Ok(None) for work that failed or a span without an
/// end. One round trip per EVENT_TIMES_MAX spans of one GPU and anchor (EventTimes),
/// none waits.
pub fn resolve_all(spans: &[&Span]) -> Vec<Result<Option<(u64, u64)>, NotReady>> {
    let mut out: Vec<Result<Option<(u64, u64)>, NotReady>> = vec![Ok(None); spans.len()];
    let mut groups: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
    for (i, sp) in spans.iter().enumerate() {
        if sp.end.is_some() {
            let key = (sp.dev, Arc::as_ptr(&sp.anchor) as usize);
            groups.entry(key).or_default().push(i);
        }
    }
    let mut by_source = [0usize; 3];
    for ((dev, _), idx) in groups {
        for chunk in idx.chunks(wire::EVENT_TIMES_MAX) {
            let answers = quiet(|| times(dev, spans, chunk)).unwrap_or_default();
            if answers.len() != chunk.len() {
                super::debug::debug(|| {
                    format!("EventTimes failed for {} spans on GPU {dev}", chunk.len())
                });
            }
            for (&i, t) in chunk.iter().zip(answers) {
                by_source[match (t.result, t.source) {
                    (0, wire::time_source::GPU) => 0,
                    (0, _) => 1,
                    _ => 2,
                }] += 1;
                let anchor_ns = spans[i].anchor.mono as f64;
                out[i] = match t.result {
                    // The server's record of the work itself, in this host's monotonic ns.
                    0 if t.source == wire::time_source::GPU => {
                        Ok(Some((t.start_ns, t.end_ns.max(t.start_ns))))
                    }
                    // The server recorded the pair end first: the work ran untimed (a
                    // graph replay without its twin).
                    0 if t.length_ms < 0.0 => Ok(None),
                    0 => {
                        let start = (anchor_ns + t.from_anchor_ms as f64 * 1e6).max(0.0) as u64;
                        Ok(Some((
                            start,
                            start + (t.length_ms.max(0.0) as f64 * 1e6) as u64,
                        )))
                    }
                    CUDA_ERROR_NOT_READY => Err(NotReady),
                    r => {
                        super::debug::debug(|| format!("a span's times answer {r}: no record"));
                        Ok(None)
                    }
                };
            }
        }
    }
    super::debug::debug(|| {
        format!(
            "span times: {} from the server's records, {} from events, {} not ready or failed",
            by_source[0], by_source[1], by_source[2]
        )
    });
    out
}

/// One EventTimes call for the spans `idx` of `spans`, all of GPU `dev` and one anchor.
fn times(dev: usize, spans: &[&Span], idx: &[usize]) -> Option<Vec<wire::EventTime>> {
    let id = |e: CUevent| crate::state::streams::event(e).ok().map(|ev| ev.id);
    let anchor = id(spans[idx[0]].anchor.event)?;
    let mut ids = Vec::with_capacity(idx.len() * 8);
    for &i in idx {
        ids.extend_from_slice(&id(spans[i].start)?.to_le_bytes());
        ids.extend_from_slice(&id(spans[i].end?)?.to_le_bytes());
    }
    let c = crate::state::entry::live().ok()?;
    let mut ch = c.channel();
    ch.call(dev, Op::EventTimes, |call| {
        let mut rec = bytemuck::bytes_of(&wire::EventTimes {
            call,
            anchor,
            count: idx.len() as u32,
        })
        .to_vec();
        rec.extend_from_slice(&ids);
        rec
    })
    .ok()?;
    let size = std::mem::size_of::<wire::EventTime>();
    let bytes = ch.reply_bytes(idx.len() * size);
    Some(
        bytes
            .chunks_exact(size)
            .map(bytemuck::pod_read_unaligned)
            .collect(),
    )
}

/// Tracing is over: the pooled events and the anchors' streams are destroyed, so that
/// they no longer count against the client's quota. Spans still held give their events
/// back later; the next `drain` destroys those.
pub fn drain() {
    let all: Vec<(usize, PerGpu)> = {
        let mut g = GPUS.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert_with(HashMap::new).drain().collect()
    };
    quiet(|| {
        for (dev, mut per) in all {
            if per.announced {
                announce(dev, false);
            }
            // The anchor's event goes back to the pool (a fresh entry for `dev`, outside
            // the lock) if no span holds it, and is destroyed with the rest.
            drop(per.anchor.take());
            let freed = with_gpu(dev, |g| std::mem::take(&mut g.free));
            for e in per.free.into_iter().chain(freed) {
                cuEventDestroy_v2(e as CUevent);
            }
            if let Some(s) = per.stream {
                // SAFETY: the stream this module made for its anchors; nothing else has it.
                unsafe { cuStreamDestroy_v2(s as CUstream) };
            }
        }
    });
}
