//! The clock of the records: the shim takes every time in CLOCK_MONOTONIC nanoseconds and
//! converts it, when records are delivered, into the domain the profiler expects. That is
//! the timestamp callback's domain when one is registered (Kineto registers its own, the
//! TSC on x86) and CUPTI's default, wall-clock nanoseconds, when none is.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The registered `uint64_t (*)(void)`, as an address (0: none).
static CALLBACK: AtomicUsize = AtomicUsize::new(0);

pub fn set_callback(f: Option<unsafe extern "C" fn() -> u64>) {
    CALLBACK.store(f.map_or(0, |f| f as usize), Ordering::Relaxed);
}

fn callback() -> Option<unsafe extern "C" fn() -> u64> {
    match CALLBACK.load(Ordering::Relaxed) {
        0 => None,
        // SAFETY: only set_callback stores a nonzero value, from such a function pointer.
        a => Some(unsafe { std::mem::transmute::<usize, unsafe extern "C" fn() -> u64>(a) }),
    }
}

/// The time now in the output domain (`cuptiGetTimestamp`).
pub fn now() -> u64 {
    match callback() {
        // SAFETY: the program registered f as a timestamp function taking nothing.
        Some(f) => unsafe { f() },
        None => realtime_ns(),
    }
}

fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One reading of both clocks: the output clock read on either side of the monotonic one
/// and averaged, so that a slow callback does not shift the pair.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pair {
    pub mono: u64,
    pub out: u64,
}

pub fn pair() -> Pair {
    let a = now();
    let mono = crate::state::profile::monotonic_ns();
    let b = now();
    Pair {
        mono,
        out: a / 2 + b / 2 + (a % 2 + b % 2) / 2,
    }
}

/// Monotonic nanoseconds to the output domain, through two pairs taken apart (the first
/// at enable, the second at delivery): their slope is the output clock's rate, which for
/// the TSC is not one tick a nanosecond. Integer arithmetic throughout: wall-clock
/// nanoseconds (about 1.8e18) would lose 256 ns in a double. With pairs less than a
/// millisecond apart the rate is taken as 1.
pub fn convert(first: Pair, last: Pair, mono: u64) -> u64 {
    let dm = last.mono as i128 - first.mono as i128;
    let dout = last.out as i128 - first.out as i128;
    let since = mono as i128 - last.mono as i128;
    let shift = if dm > 1_000_000 && dout > 0 {
        since * dout / dm
    } else {
        since
    };
    (last.out as i128 + shift).clamp(0, u64::MAX as i128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_follows_the_output_clocks_rate_and_offset() {
        // A clock that runs 3 ticks a nanosecond from 1,000.
        let p0 = Pair {
            mono: 10_000_000,
            out: 1_000,
        };
        let p1 = Pair {
            mono: 30_000_000,
            out: 1_000 + 3 * 20_000_000,
        };
        assert_eq!(convert(p0, p1, 20_000_000), 1_000 + 3 * 10_000_000);
        assert_eq!(convert(p0, p1, 30_000_001), 1_000 + 3 * 20_000_000 + 3);
        // Pairs too close together: the offset alone.
        assert_eq!(convert(p1, p1, 30_000_010), 1_000 + 3 * 20_000_000 + 10);
        // Wall-clock nanoseconds keep every nanosecond.
        let wall = Pair {
            mono: 5_000_000_000,
            out: 1_764_000_000_000_000_001,
        };
        assert_eq!(
            convert(wall, wall, 5_000_000_003),
            1_764_000_000_000_000_004
        );
    }

    #[test]
    fn without_a_callback_the_domain_is_wall_clock_nanoseconds() {
        set_callback(None);
        let p = pair();
        let wall = realtime_ns();
        assert!(p.out.abs_diff(wall) < 1_000_000_000);
    }
}
