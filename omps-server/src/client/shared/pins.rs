//! Which of a client segment's staging is registered with the GPU: the book that
//! `ClientShared::staging_ready` (staging.rs) keeps. Uses nothing of the client.

use omps_ring::segment::Layout;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Which channels' staging is registered with the GPU.
pub struct Pins {
    /// Bit `c`: channel `c`'s chunks are registered (every bit when made ahead). Channels
    /// are at most 64 (`LayoutParams::validate`).
    ready: AtomicU64,
    /// Registered with the segment as one range ([`Layout::registered_range`]); otherwise
    /// the control range, and a range per channel in `ready`.
    whole: bool,
    /// Held while a channel is registered: two GPUs' lanes may copy through it at once.
    registering: Mutex<()>,
}

impl Pins {
    /// The whole registered range was registered with the segment.
    pub fn ahead() -> Self {
        Pins {
            ready: AtomicU64::new(u64::MAX),
            whole: true,
            registering: Mutex::new(()),
        }
    }

    /// Only the control range was: each channel's staging comes at its first copy.
    pub fn at_first_copy() -> Self {
        Pins {
            ready: AtomicU64::new(0),
            whole: false,
            registering: Mutex::new(()),
        }
    }

    /// Whether channel `c`'s chunks are registered.
    pub fn ready(&self, c: usize) -> bool {
        // SYNC POINT: pairs with `mark`'s Release: a lane that sees the bit sees the
        // registration another GPU's lane made.
        c < 64 && self.ready.load(Ordering::Acquire) & (1u64 << c) != 0
    }

    /// Channel `c`'s chunks are registered now.
    pub fn mark(&self, c: usize) {
        if c < 64 {
            self.ready.fetch_or(1u64 << c, Ordering::Release);
        }
    }

    /// Held while registering, so a channel is registered once.
    pub fn registering(&self) -> MutexGuard<'_, ()> {
        self.registering.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ranges registered in a segment of `layout`, (offset, length) each.
    pub fn ranges(&self, layout: &Layout) -> Vec<(usize, usize)> {
        if self.whole {
            return vec![layout.registered_range()];
        }
        let mut out = vec![layout.control_range()];
        out.extend(
            (0..layout.params.num_channels as usize)
                .filter(|&c| self.ready(c))
                .filter_map(|c| layout.staging_range(c)),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omps_ring::segment::LayoutParams;

    #[test]
    fn the_ranges_are_the_whole_or_the_control_range_and_the_channels_marked() {
        let l = LayoutParams::for_devices(1).validate().unwrap();
        assert_eq!(Pins::ahead().ranges(&l), vec![l.registered_range()]);
        assert!((0..8).all(|c| Pins::ahead().ready(c)));
        let p = Pins::at_first_copy();
        assert_eq!(p.ranges(&l), vec![l.control_range()]);
        p.mark(3);
        p.mark(0);
        assert!(p.ready(3) && p.ready(0) && !p.ready(1));
        assert!(!p.ready(64), "no channel 64");
        assert_eq!(
            p.ranges(&l),
            vec![
                l.control_range(),
                l.staging_range(0).unwrap(),
                l.staging_range(3).unwrap()
            ]
        );
    }
}
