//! The depth marks of a client's work streams ([`Depth`]) and the bounds they are held
//! to: below the session (state.rs holds them) and the family that counts and checks
//! them (depth.rs).

use std::collections::VecDeque;
use std::time::Duration;

pub(in crate::session) const MARK_EVERY: u32 = 256;
/// Operations pending on one work stream that hold its client back.
pub(in crate::session) const HOLD_OPS: u32 = 3 * MARK_EVERY;
/// Beyond this many a held client gets no batch through at all, and a batch ends at the
/// record that makes a stream deep: one record adds well under the 1,020 - HARD_OPS left
/// (a few operations; a context synchronization one per stream and unfolded event).
pub(in crate::session) const HARD_OPS: u32 = 832;
pub(in crate::session) const MAX_HOLD: Duration = Duration::from_secs(1);
/// How often a held client's oldest mark is asked about. cuEventQuery takes the context
/// lock every lane's launches need: asked on every pass (about 1 us) by the lanes of
/// held clients, it cut 8 clients' empty-kernel launch rate from 744k/s to 446k/s (H100,
/// scripts/sched rate). The GPU takes over 300 us to finish the 256 launches between
/// two marks, so the stream never runs dry meanwhile.
pub(in crate::session) const CHECK_EVERY: Duration = Duration::from_micros(50);

/// The depth marks of one work stream of a client: each event and the operations queued
/// up to it since the one before.
#[derive(Default)]
pub(in crate::session) struct Depth {
    pub(in crate::session) marks: VecDeque<(u64, u32)>,
    pub(in crate::session) since_mark: u32,
}

impl Depth {
    /// Operations the GPU may not have reached: those behind marks not yet passed, and
    /// those since the last mark.
    pub(in crate::session) fn pending(&self) -> u32 {
        self.marks
            .iter()
            .map(|m| m.1)
            .sum::<u32>()
            .saturating_add(self.since_mark)
    }

    /// Counts `n` operations queued on work stream `pool`, and records a mark once
    /// [`MARK_EVERY`] have been; true once the marks outstanding stand for [`HOLD_OPS`].
    pub(in crate::session) fn count(
        &mut self,
        gpu: &dyn crate::gpu::Gpu,
        pool: usize,
        n: u32,
        capturing: bool,
    ) -> bool {
        if capturing {
            // A mark recorded now would be a node of the client's graph, and what is
            // queued there is captured, not run.
            return false;
        }
        self.since_mark = self.since_mark.saturating_add(n);
        if self.since_mark < MARK_EVERY {
            return false;
        }
        let Ok(ev) = gpu.event_create(0x2) else {
            return false;
        };
        if gpu.event_record(ev, pool).is_err() {
            let _ = gpu.event_destroy(ev);
            return false;
        }
        // The mark is an operation of the stream too.
        self.marks.push_back((ev, self.since_mark + 1));
        self.since_mark = 0;
        self.pending() >= HOLD_OPS
    }
}
