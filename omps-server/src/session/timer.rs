//! The GPU's own times of a traced client's work (docs/design.md 12b, design S): while
//! the client's profiler traces (`Profiling`), each event the client records on a stream
//! starts a new span of that stream, the driver calls made for the client's work on the
//! stream carry the span's key, and `EventTimes` answers a span that starts at an event
//! from the GPU's record of the work under its key (the backend's, `Gpu::timer_*`), and
//! from the events only where there is none.
//!
//! A key is this session's (a number no other session uses) and the span's (a
//! number each event record takes anew): a client can only ever ask for its own work's
//! times, and an event reused for a later span never answers with an earlier one's.

use super::kinds::span_timer::{RECORD_WAIT_NS, WAITING_MAX};
use super::*;
use crate::gpu::Gpu;

/// The stream a work record queues on, for the ops whose driver calls the timer keys.
fn work_stream(op: Op, p: &[u8]) -> Option<u32> {
    Some(match op {
        Op::Launch => rec::<wire::Launch>(p).stream,
        Op::Memset => rec::<wire::Memset>(p).stream,
        Op::CopyDtoD => rec::<wire::CopyDtoD>(p).stream,
        Op::CopyPeer => rec::<wire::CopyPeer>(p).stream,
        Op::CopyHtoDChunk | Op::CopyDtoHChunk => rec::<wire::ChunkCopy>(p).stream,
        Op::CopyHtoDPinned | Op::CopyDtoHPinned => rec::<wire::PinnedCopy>(p).stream,
        Op::CopyHtoDInline => rec::<wire::InlineCopy>(p).stream,
        _ => return None,
    })
}

/// A span's key pushed on the lane's thread (`Gpu::timer_begin`), popped when dropped:
/// also when a panic ends the record's handling (the lane goes on with other clients,
/// whose work must not carry the key).
pub(super) struct KeyPushed(std::sync::Arc<dyn Gpu>);

impl Drop for KeyPushed {
    fn drop(&mut self) {
        self.0.timer_end();
    }
}

impl Session {
    /// `Profiling`: the client's profiler starts or stops tracing this GPU.
    pub(super) fn handle_profiling(
        &mut self,
        ctx: &mut WorkerCtx,
        c: &wire::Profiling,
    ) -> Result<(), Malformed> {
        let on = match c.on {
            0 => false,
            1 => true,
            v => return bad(format!("profiling: on = {v}")),
        };
        let t = &mut self.timer;
        if on && !t.timed {
            t.timed = ctx.gpu.timer_start();
            t.number();
        } else if !on && t.timed {
            ctx.gpu.timer_stop();
            t.timed = false;
            t.by_stream.clear();
            t.by_event.clear();
            t.waiting.clear();
        }
        let r = if !on || t.timed {
            0
        } else {
            code::NOT_SUPPORTED
        };
        self.complete(c.call, r, &[])
    }

    /// The client ends while tracing: the backend's count goes down with it.
    pub fn end_timing(&mut self, gpu: &dyn Gpu) {
        if std::mem::take(&mut self.timer.timed) {
            gpu.timer_stop();
        }
    }

    /// Before a record runs: an event record starts a span of its stream; an event
    /// destroyed, or recorded by a graph's twin (whose spans the events time), starts
    /// none any more.
    pub(super) fn timer_before(&mut self, op: Op, p: &[u8]) {
        let t = &mut self.timer;
        if !t.timed {
            return;
        }
        match op {
            Op::EventRecord => {
                let r = rec::<wire::EventRecord>(p);
                t.seq = t.seq.wrapping_add(1);
                // Bounded by the client's streams and events (their own quotas).
                t.by_stream.insert(r.stream, t.seq);
                t.by_event.insert(r.event, t.seq);
            }
            Op::EventDestroy => {
                t.by_event.remove(&rec::<wire::Handle>(p).id);
            }
            Op::GraphLaunchProfiled => {
                for id in p[op.fixed_len()..].chunks_exact(4) {
                    t.by_event
                        .remove(&u32::from_le_bytes(id.try_into().expect("4 bytes")));
                }
            }
            _ => {}
        }
    }

    /// Pushes the key a traced client's work record's driver calls carry, if any; the
    /// guard pops it. Untraced clients' records (every launch of them) cost one test.
    pub(super) fn timer_key(&self, ctx: &WorkerCtx, op: Op, p: &[u8]) -> Option<KeyPushed> {
        if !self.timer.timed {
            return None;
        }
        let key = work_stream(op, p).and_then(|s| self.timer.key_for(s))?;
        ctx.gpu.timer_begin(key);
        Some(KeyPushed(ctx.gpu.clone()))
    }

    /// The GPU's times of the span starting at event `start`, whose end event has
    /// completed: Some(Ok) from its record, Some(Err(NOT_READY)) while the record may
    /// still come, None when the events answer (not timed, or no record came in time).
    pub(super) fn timer_answer(
        &mut self,
        gpu: &dyn Gpu,
        start: u32,
    ) -> Option<Result<(u64, u64), i32>> {
        let t = &mut self.timer;
        if !t.timed {
            return None;
        }
        let span = *t.by_event.get(&start)?;
        let key = t.key(span);
        if let Some(times) = gpu.timer_take(key) {
            t.waiting.remove(&span);
            // Answered once: asked again, the events answer.
            t.by_event.remove(&start);
            return Some(Ok(times));
        }
        let now = crate::gpu::work_times::monotonic_ns();
        if t.waiting.len() >= WAITING_MAX && !t.waiting.contains_key(&span) {
            return None;
        }
        let since = *t.waiting.entry(span).or_insert(now);
        if now.saturating_sub(since) > RECORD_WAIT_NS {
            t.waiting.remove(&span);
            return None;
        }
        gpu.timer_settle();
        // Asked again after the flush: the record may have come with it.
        if let Some(times) = gpu.timer_take(key) {
            t.waiting.remove(&span);
            t.by_event.remove(&start);
            return Some(Ok(times));
        }
        Some(Err(code::NOT_READY))
    }
}
