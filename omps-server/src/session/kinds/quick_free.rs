//! Whether a client has nothing on the GPU, so that a block it frees needs no fence
//! ([`QuickFree`]; issue 25: `cudaMalloc` + `cudaFree` at the driver's cost).
//!
//! A free normally waits for a fence: an event recorded after all the client's queued
//! work, joined from each of its streams (worker/ctx.rs `defer`): four to eight driver
//! calls, and the block comes back only once the fence has passed. A program that
//! allocates and frees in a loop with no work in between (a test harness, a host-side
//! allocator without a cache) paid those calls on every iteration: 4.0 us against the
//! driver's 1.4 us on an H100.
//!
//! So a session keeps a *probe*: an event of its own, recorded after the fence of a free
//! that waited (and counted toward the sync stream's depth, as the fence is), and marks
//! itself *quiet* until any record other than an allocation or a free comes (dispatch.rs).
//! While quiet, once the probe has passed the client has no work on the GPU at all: a block
//! it frees then cannot be in use, and its lane keeps it for the client's next allocation
//! of exactly that size (worker/kept.rs says how long, and how it goes back).

#[derive(Default)]
pub(in crate::session) struct QuickFree {
    /// The session's probe event (created at its first use).
    probe: Option<u64>,
    /// No record but allocations and frees since the probe was recorded.
    quiet: bool,
    /// The probe passed while quiet: the client has nothing on this GPU.
    idle: bool,
}

impl QuickFree {
    /// A record that may queue work came: the client is no longer known to be idle.
    pub(in crate::session) fn touch(&mut self) {
        self.quiet = false;
        self.idle = false;
    }

    /// Whether the probe must be recorded again after a fence: not while quiet (it
    /// already follows all the client's work).
    pub(in crate::session) fn wants_probe(&self) -> bool {
        !self.quiet
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
        assert!(q.wants_probe());
        assert_eq!(q.probe_or(|| Some(7)), Some(7));
        assert_eq!(q.probe_or(|| Some(8)), Some(7), "one probe per session");
        q.armed();
        assert!(
            !q.wants_probe(),
            "quiet: the probe already follows all work"
        );
        assert!(!q.idle(|_| false), "probe not passed");
        assert!(q.idle(|e| e == 7));
        // Idle is remembered until a record that may queue work.
        assert!(q.idle(|_| panic!("asked again")));
        q.touch();
        assert!(q.wants_probe());
        assert!(!q.idle(|_| true), "work since the probe");
        q.armed();
        assert!(q.idle(|_| true));
        assert_eq!(q.take_probe(), Some(7));
        assert!(!q.idle(|_| true), "no probe after the end");
    }
}
