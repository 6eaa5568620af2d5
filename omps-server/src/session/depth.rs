//! Streams queued too deep: a client whose work stream holds about a thousand operations
//! the GPU has not reached waits on its own full ring, rather than the worker waiting in
//! the driver. A CUDA stream takes about 1,000 pending operations; the next one blocks the
//! calling thread until one completes (measured: a launch behind 1,022 queued operations
//! took 3 s), which on a worker stalls every client of that lane.
//!
//! Every driver operation the worker queues for a client is counted on the work stream it
//! lands on ([`Session::queued`]): the work itself, and what the server adds for it (a
//! synchronization's word, the waits of an event or context synchronization and of a
//! release's fence on the client's sync stream, the events of the legacy stream's implicit
//! order, a host function's wait). Every [`MARK_EVERY`] operations on a work stream the
//! worker records an event there. While the marks not yet passed stand for
//! [`HOLD_OPS`] operations or more, the worker leaves the client's ring alone until the
//! oldest passes, asking only about that one event per pass. A client is held back
//! [`MAX_HOLD`] at most at a time, so a stream that waits for something a later record of
//! the same client provides (a stream memory wait) still moves, one batch at a time; but
//! never past [`HARD_OPS`], short of the driver's bound, so a kernel that never ends
//! cannot lead the worker into the driver's wait.

use super::kinds::depth::{CHECK_EVERY, HARD_OPS, HOLD_OPS, MAX_HOLD};
use super::*;
use std::time::Instant;

impl Session {
    /// `n` driver operations queued for client stream `id` on its work stream `pool`.
    pub(super) fn queued(&mut self, ctx: &WorkerCtx, id: u32, pool: usize, n: u32) {
        let capturing = self.streams.get(&id).is_some_and(|s| s.capturing);
        self.queued_as(ctx, pool, n, capturing);
    }

    /// As [`Session::queued`], its capture known (the submission path knows it).
    pub(super) fn queued_as(&mut self, ctx: &WorkerCtx, pool: usize, n: u32, capturing: bool) {
        let d = self.depths.entry(pool).or_default();
        if d.count(&*ctx.gpu, pool, n, capturing) && !self.deep.contains(&pool) {
            self.deep.push(pool);
        }
    }

    /// What a context synchronization or a fence adds: an event record on each of
    /// `streams`, and a wait for each of them and of `left` (plus `extra`) on `m`.
    pub(crate) fn queued_join(
        &mut self,
        ctx: &WorkerCtx,
        streams: &crate::sched::placement::StreamSet,
        left: usize,
        m: usize,
        extra: u32,
    ) {
        let mut joined = 0u32;
        for i in streams.iter() {
            self.queued_as(ctx, i, 1, false);
            joined += 1;
        }
        self.queued_as(
            ctx,
            m,
            joined.saturating_add(left as u32).saturating_add(extra),
            false,
        );
    }

    /// Events of every mark, for the release of the session.
    pub(super) fn take_depth_events(&mut self) -> Vec<u64> {
        self.depths
            .drain()
            .flat_map(|(_, d)| d.marks.into_iter().map(|m| m.0))
            .collect()
    }

    /// Whether a work stream of this client is queued deep: the worker ends the client's
    /// batch there, so that the records after it wait for [`Session::held_back`] (a batch
    /// of context synchronizations, each a wait per event and stream, once added more
    /// than the driver's bound leaves past [`HARD_OPS`]).
    pub fn is_deep(&self) -> bool {
        !self.deep.is_empty()
    }

    /// Whether the worker should take none of this client's records this pass: one of
    /// its work streams is too deep and the GPU has not caught up.
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
        let depths = &mut self.depths;
        let mut deepest = 0;
        self.deep.retain(|pool| {
            let Some(d) = depths.get_mut(pool) else {
                return false;
            };
            // Completed marks go; a broken context completes nothing (treat as done).
            while let Some(&(ev, _)) = d.marks.front() {
                if !gpu.event_query(ev).unwrap_or(true) {
                    break;
                }
                d.marks.pop_front();
                let _ = gpu.event_destroy(ev);
            }
            let p = d.pending();
            deepest = deepest.max(p);
            d.marks.iter().map(|m| m.1).sum::<u32>() >= HOLD_OPS
        });
        if self.deep.is_empty() {
            self.held_since = None;
            self.depth_checked = None;
            return false;
        }
        let now = Instant::now();
        let since = *self.held_since.get_or_insert(now);
        if now - since > MAX_HOLD && deepest < HARD_OPS {
            self.held_since = None;
            self.depth_checked = None;
            return false;
        }
        self.depth_checked = Some(now);
        true
    }
}
