//! Futex waits and wakes that work across processes, and the [`Doorbell`] built on them.
//!
//! The words live in a shared segment, so the futex calls are the shared kind (no
//! `FUTEX_PRIVATE_FLAG`): the kernel keys them by the underlying page, not by address
//! space.

use std::sync::atomic::{fence, AtomicU32, Ordering::SeqCst};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitResult {
    /// A wake arrived (or the kernel woke us spuriously: callers recheck anyway).
    Woken,
    TimedOut,
    /// The word did not hold `expected` when the kernel looked.
    ValueChanged,
    /// A signal arrived. Any other failure, which a valid `&AtomicU32` cannot cause,
    /// also reads as this, so that callers simply recheck.
    Interrupted,
}

/// Sleeps while `word` holds `expected`, at most `timeout` (relative, monotonic clock).
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> WaitResult {
    let timespec = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let timespec_ptr = timespec
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: the word is a live, aligned u32 for the whole call and the timespec (or
    // null) outlives it; FUTEX_WAIT ignores the last two arguments.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            timespec_ptr,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if rc == 0 {
        return WaitResult::Woken;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN) => WaitResult::ValueChanged,
        Some(libc::ETIMEDOUT) => WaitResult::TimedOut,
        _ => WaitResult::Interrupted,
    }
}

/// Wakes up to `n` waiters on `word`; returns how many woke.
pub fn wake(word: &AtomicU32, n: u32) -> usize {
    let n = n.min(i32::MAX as u32) as libc::c_int;
    // SAFETY: the word is a live, aligned u32; FUTEX_WAKE ignores the last three
    // arguments and never writes through the pointer.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            n,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    usize::try_from(rc).unwrap_or(0)
}

/// A doorbell that costs a fence and a load, no system call, while its waiter is awake.
///
/// One side (the waiter) sleeps on it when out of work; any number of ringers ring it
/// after publishing work. Lives in shared memory: all-zero bytes are a quiet doorbell.
///
/// Why no wakeup is lost: the ringer does *publish work; fence; load `sleeping`*, the
/// waiter *store `sleeping = 1`; fence; load `bell`; recheck work*. With both fences
/// SeqCst, either the waiter's recheck sees the work, or the ringer sees `sleeping`
/// and bumps `bell` then wakes. In that case, if the waiter's `bell` load already saw
/// the bump it also sees the work (the bump is a release after the work), so it does
/// not sleep; otherwise the bump makes the futex wait return at once or the wake ends it.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Doorbell {
    /// Bumped by ringers that found the waiter asleep; the futex word.
    pub bell: AtomicU32,
    /// 1 while the waiter is (about to be) asleep.
    pub sleeping: AtomicU32,
}

impl Doorbell {
    pub const fn new() -> Self {
        Self {
            bell: AtomicU32::new(0),
            sleeping: AtomicU32::new(0),
        }
    }

    /// Ringer side: call after publishing work.
    pub fn ring(&self) {
        // Orders the (possibly only Release) publication of the work before the load
        // below; without it the load may pass the store and miss a sleeper.
        fence(SeqCst);
        if self.sleeping.load(SeqCst) != 0 {
            self.bell.fetch_add(1, SeqCst);
            wake(&self.bell, i32::MAX as u32);
        }
    }

    /// Waiter side: sleeps unless `recheck` (true when there is work) says otherwise,
    /// for at most `timeout`. Returns `None` if it did not sleep, else how the sleep
    /// ended. Callers loop: a return does not promise work.
    pub fn sleep_unless(
        &self,
        mut recheck: impl FnMut() -> bool,
        timeout: Option<Duration>,
    ) -> Option<WaitResult> {
        self.sleeping.store(1, SeqCst);
        // Pairs with the fence in `ring`: see the type's documentation.
        fence(SeqCst);
        let bell = self.bell.load(SeqCst);
        let result = if recheck() {
            None
        } else {
            Some(wait(&self.bell, bell, timeout))
        };
        // A late clear only costs a ringer one needless wake.
        self.sleeping.store(0, SeqCst);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn wait_returns_at_once_when_the_word_changed() {
        let word = AtomicU32::new(5);
        assert_eq!(wait(&word, 4, None), WaitResult::ValueChanged);
    }

    #[test]
    fn wait_times_out_when_nobody_wakes() {
        let word = AtomicU32::new(5);
        let result = wait(&word, 5, Some(Duration::from_millis(1)));
        assert_eq!(result, WaitResult::TimedOut);
    }

    #[test]
    fn wake_counts_sleepers() {
        let word = Arc::new(AtomicU32::new(0));
        let sleeper = {
            let word = Arc::clone(&word);
            std::thread::spawn(move || {
                while word.load(Ordering::Acquire) == 0 {
                    wait(&word, 0, None);
                }
            })
        };
        // The sleeper may not be asleep yet: keep knocking until a wake finds it.
        let woken = loop {
            match wake(&word, 1) {
                0 => std::thread::yield_now(),
                n => break n,
            }
        };
        assert_eq!(woken, 1);
        word.store(1, Ordering::Release);
        wake(&word, 1);
        sleeper.join().unwrap();
        assert_eq!(wake(&word, 1), 0);
    }

    /// Two threads hand a counter back and forth, each sleeping on its own doorbell
    /// whenever it is not its turn. A lost wakeup leaves a thread asleep with its turn
    /// already come, which shows as a timeout while the turn is there; the first one
    /// ends the test rather than costing 5 s per round.
    #[test]
    fn doorbell_never_loses_a_wakeup() {
        const ROUNDS: u64 = 100_000;
        let counter = Arc::new(AtomicU64::new(0));
        let lost = Arc::new(AtomicBool::new(false));
        let bells = Arc::new([Doorbell::new(), Doorbell::new()]);

        let player = |me: u64| {
            let (counter, lost, bells) = (counter.clone(), lost.clone(), bells.clone());
            std::thread::spawn(move || {
                let mut slept = 0u64;
                for round in 0..ROUNDS {
                    let turn = round * 2 + me;
                    let my_turn = || counter.load(Ordering::Acquire) == turn;
                    while !my_turn() {
                        if lost.load(Ordering::Relaxed) {
                            return slept;
                        }
                        let timeout = Some(Duration::from_secs(5));
                        match bells[me as usize].sleep_unless(my_turn, timeout) {
                            Some(WaitResult::TimedOut) if my_turn() => {
                                lost.store(true, Ordering::Relaxed);
                                bells[1 - me as usize].ring();
                            }
                            Some(_) => slept += 1,
                            None => {}
                        }
                    }
                    counter.store(turn + 1, Ordering::Release);
                    bells[1 - me as usize].ring();
                }
                slept
            })
        };
        let (a, b) = (player(0), player(1));
        let slept = a.join().unwrap() + b.join().unwrap();
        assert!(!lost.load(Ordering::Relaxed), "a wakeup was lost");
        assert_eq!(counter.load(Ordering::Acquire), 2 * ROUNDS);
        // The test means something only if the sleep path ran a lot.
        assert!(slept > ROUNDS / 10, "slept only {slept} times");
    }
}
