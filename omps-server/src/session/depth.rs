//! Streams queued too deep: a client whose stream holds about a thousand operations the
//! GPU has not reached waits on its own full ring, rather than the worker waiting in the
//! driver. A CUDA stream takes about 1,000 pending operations; the next launch blocks the
//! calling thread until one completes (measured: a launch behind 1,022 queued operations
//! took 3 s), which on a worker stalls every client of that lane.
//!
//! Every [`MARK_EVERY`] pieces of work on a client stream the worker records an event
//! there. A stream with [`HOLD_AT`] marks outstanding has at least
//! `(HOLD_AT - 1) * MARK_EVERY` operations the GPU has not finished: the worker leaves the
//! client's ring alone until its oldest mark completes, asking only about that one event
//! per pass. A client is held back [`MAX_HOLD`] at most at a time, so a stream that waits
//! for something a later record of the same client provides (a stream memory wait) is
//! not held forever: it gets one batch through.

use super::*;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub(super) const MARK_EVERY: u32 = 256;
pub(super) const HOLD_AT: usize = 3;
const MAX_HOLD: Duration = Duration::from_secs(1);
/// How often a held client's oldest mark is asked about. cuEventQuery takes the context
/// lock every lane's launches need: asked on every pass (about 1 us) by the lanes of
/// held clients, it cut 8 clients' empty-kernel launch rate from 744k/s to 446k/s (H100,
/// scripts/sched rate). The GPU takes over 300 us to finish the 256 launches between
/// two marks, so the stream never runs dry meanwhile.
const CHECK_EVERY: Duration = Duration::from_micros(50);

/// The depth marks of one client stream.
#[derive(Default)]
pub(super) struct Depth {
    marks: VecDeque<u64>,
    since_mark: u32,
}

impl Depth {
    /// Counts one piece of work queued on the stream (bound to `pool`), and every
    /// [`MARK_EVERY`] records a mark; true once [`HOLD_AT`] marks are outstanding.
    pub(super) fn count(
        &mut self,
        gpu: &dyn crate::gpu::Gpu,
        pool: usize,
        capturing: bool,
    ) -> bool {
        if capturing {
            // A mark recorded now would be a node of the client's graph.
            return false;
        }
        self.since_mark += 1;
        if self.since_mark < MARK_EVERY {
            return false;
        }
        self.since_mark = 0;
        let Ok(ev) = gpu.event_create(0x2) else {
            return false;
        };
        if gpu.event_record(ev, pool).is_err() {
            let _ = gpu.event_destroy(ev);
            return false;
        }
        self.marks.push_back(ev);
        self.marks.len() >= HOLD_AT
    }

    /// Events of the marks, for the release of a stream or session.
    pub(super) fn take_events(&mut self) -> impl Iterator<Item = u64> + '_ {
        self.marks.drain(..)
    }
}

impl Session {
    /// Whether the worker should take none of this client's records this pass: one of
    /// its streams is too deep and the GPU has not caught up.
    pub fn held_back(&mut self, ctx: &WorkerCtx) -> bool {
        if self.deep.is_empty() {
            return false;
        }
        if self
            .depth_checked
            .is_some_and(|t| t.elapsed() < CHECK_EVERY)
        {
            return true;
        }
        let gpu = &ctx.gpu;
        let streams = &mut self.streams;
        self.deep.retain(|id| {
            let Some(st) = streams.get_mut(id) else {
                return false;
            };
            // Completed marks go; a broken context completes nothing (treat as done).
            while let Some(&ev) = st.depth.marks.front() {
                if !gpu.event_query(ev).unwrap_or(true) {
                    break;
                }
                st.depth.marks.pop_front();
                let _ = gpu.event_destroy(ev);
            }
            st.depth.marks.len() >= HOLD_AT
        });
        if self.deep.is_empty() {
            self.held_since = None;
            self.depth_checked = None;
            return false;
        }
        let now = Instant::now();
        let since = *self.held_since.get_or_insert(now);
        if now - since > MAX_HOLD {
            self.held_since = None;
            self.depth_checked = None;
            return false;
        }
        self.depth_checked = Some(now);
        true
    }
}
