//! Blocks a client freed while it had nothing on the GPU, kept a moment for its next
//! allocation of the same size ([`QuickFree`]; issue 25: `cudaMalloc` + `cudaFree` at the
//! driver's cost).
//!
//! A free normally waits for a fence: an event recorded after all the client's queued
//! work, joined from each of its streams (worker/ctx.rs `defer`): four to eight driver
//! calls, and the block comes back only once the fence has passed. A program that
//! allocates and frees in a loop with no work in between (a test harness, a host-side
//! allocator without a cache) paid those calls on every iteration: 4.0 us against the
//! driver's 1.4 us on an H100.
//!
//! So a session keeps a *probe*: an event of its own, recorded after the fence of a free
//! that waited, and marks itself *quiet* until any record other than an allocation or a
//! free comes (dispatch.rs). While quiet, once the probe has passed the client has no work
//! on the GPU at all: a block it frees then cannot be in use, and is kept here, still
//! charged to the client, for its next allocation of exactly that size. Nothing else ever
//! sees it. Blocks kept longer than [`KEEP`], or when an allocation of another size comes,
//! go back the usual way (the lane looks each pass), as does everything at the end of the
//! session. At most [`MAX_BLOCKS`] blocks and [`MAX_BYTES`] are kept.

use std::time::{Duration, Instant};

/// Blocks kept at most per session.
pub const MAX_BLOCKS: usize = 8;
/// Bytes kept at most per session.
pub const MAX_BYTES: u64 = 256 << 20;
/// How long a kept block waits for an allocation of its size before it goes back.
pub const KEEP: Duration = Duration::from_millis(5);

#[derive(Default)]
pub(in crate::session) struct QuickFree {
    /// The session's probe event (created at its first use), and whether it has been
    /// recorded since the last record that could have queued work.
    probe: Option<u64>,
    /// No record but allocations and frees since the probe was recorded.
    quiet: bool,
    /// The probe passed while quiet: the client has nothing on this GPU.
    idle: bool,
    /// Kept blocks: pointer, length, when kept.
    blocks: Vec<(u64, u64, Instant)>,
    bytes: u64,
}

impl QuickFree {
    /// A record that may queue work came: the client is no longer known to be idle.
    pub(in crate::session) fn touch(&mut self) {
        self.quiet = false;
        self.idle = false;
    }

    /// The probe to record after a fence (`created` makes one when there is none yet).
    pub(in crate::session) fn probe_or(
        &mut self,
        created: impl FnOnce() -> Option<u64>,
    ) -> Option<u64> {
        if self.probe.is_none() {
            self.probe = created();
        }
        self.probe
    }

    /// The probe was recorded after all the client's queued work.
    pub(in crate::session) fn armed(&mut self) {
        self.quiet = true;
        self.idle = false;
    }

    /// Whether the client has nothing on the GPU: quiet since the probe, and the probe
    /// passed (`passed` asks the driver, once).
    pub(in crate::session) fn idle(&mut self, passed: impl FnOnce(u64) -> bool) -> bool {
        if !self.idle && self.quiet {
            self.idle = self.probe.is_some_and(passed);
        }
        self.idle
    }

    /// Keeps `ptr` (`len` bytes) if there is room: false if it must go back the usual way.
    pub(in crate::session) fn keep(&mut self, ptr: u64, len: u64, now: Instant) -> bool {
        if self.blocks.len() >= MAX_BLOCKS || self.bytes.saturating_add(len) > MAX_BYTES {
            return false;
        }
        self.blocks.push((ptr, len, now));
        self.bytes += len;
        true
    }

    /// A kept block of exactly `len` bytes, taken.
    pub(in crate::session) fn take(&mut self, len: u64) -> Option<u64> {
        let i = self.blocks.iter().rposition(|b| b.1 == len)?;
        let (p, n, _) = self.blocks.swap_remove(i);
        self.bytes -= n;
        Some(p)
    }

    pub(in crate::session) fn holds(&self) -> bool {
        !self.blocks.is_empty()
    }

    /// Blocks kept longer than KEEP by `now` (all of them with `all`), taken.
    pub(in crate::session) fn expired(&mut self, now: Instant, all: bool) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        self.blocks.retain(|&(p, n, t)| {
            let go = all || now.saturating_duration_since(t) >= KEEP;
            if go {
                out.push((p, n));
            }
            !go
        });
        self.bytes -= out.iter().map(|b| b.1).sum::<u64>();
        out
    }

    /// The probe event, given up (the session ends).
    pub(in crate::session) fn take_probe(&mut self) -> Option<u64> {
        self.touch();
        self.probe.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_only_when_quiet_since_a_passed_probe() {
        let mut q = QuickFree::default();
        // Never armed: never idle, and the driver is not asked.
        assert!(!q.idle(|_| panic!("no probe to ask about")));
        assert_eq!(q.probe_or(|| Some(7)), Some(7));
        assert_eq!(q.probe_or(|| Some(8)), Some(7), "one probe per session");
        q.armed();
        assert!(!q.idle(|_| false), "probe not passed");
        assert!(q.idle(|e| e == 7));
        // Idle is remembered until a record that may queue work.
        assert!(q.idle(|_| panic!("asked again")));
        q.touch();
        assert!(!q.idle(|_| true), "work since the probe");
        q.armed();
        assert!(q.idle(|_| true));
        assert_eq!(q.take_probe(), Some(7));
        assert!(!q.idle(|_| true), "no probe after the end");
    }

    #[test]
    fn keeps_within_bounds_and_gives_back_by_age_and_size() {
        let mut q = QuickFree::default();
        let t0 = Instant::now();
        for i in 0..MAX_BLOCKS as u64 {
            assert!(q.keep(0x1000 * (i + 1), 1 << 20, t0));
        }
        assert!(!q.keep(0xdead, 1 << 20, t0), "at most MAX_BLOCKS");
        assert_eq!(q.take(2 << 20), None, "exact size only");
        assert_eq!(q.take(1 << 20), Some(0x1000 * MAX_BLOCKS as u64));
        assert!(q.keep(0xbeef, 1 << 20, t0 + KEEP));
        assert!(!q.keep(0xf00d, MAX_BYTES, t0), "at most MAX_BYTES");
        let old = q.expired(t0 + KEEP, false);
        assert_eq!(old.len(), MAX_BLOCKS - 1, "the young block stays");
        assert!(q.holds());
        assert_eq!(q.expired(t0, true), vec![(0xbeef, 1 << 20)]);
        assert!(!q.holds());
        assert_eq!(q.bytes, 0);
    }
}
