//! Host copies between the program's pageable memory and the staging chunks, split
//! across the calling thread and a few helper threads.
//!
//! A pageable copy is staged: the program's thread copies each piece into a chunk while
//! the copy engine moves earlier pieces, so the host copy sets the pace (one thread
//! copies 7-10 GB/s on the H100 machines; the copy engine moves 55). The driver stages the
//! same way with one thread. The helpers start at the first large copy, spin briefly
//! after each piece so that a stream of pieces finds them awake, and then sleep on a
//! futex. One copy uses them at a time; another thread's copy, or a forked child's, copies
//! alone.

use omps_ring::futex;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Below this a copy is not split: waking helpers would cost more than it saves.
const MIN_SPLIT: usize = 256 << 10;
const MAX_HELPERS: usize = 3;
/// How long a helper spins for the next piece before it sleeps.
const SPIN_ROUNDS: u32 = 200_000;

const IDLE: u32 = 0;
const POSTED: u32 = 1;
const DONE: u32 = 2;

/// One helper's mailbox: a piece to copy and where it stands.
struct Slot {
    state: AtomicU32,
    /// Set while the helper sleeps on `state`, so a post wakes it only then.
    sleeping: AtomicU32,
    src: AtomicUsize,
    dst: AtomicUsize,
    len: AtomicUsize,
}

struct Pool {
    pid: u32,
    slots: Vec<&'static Slot>,
    /// Held by the one copy that uses the helpers.
    busy: Mutex<()>,
}

fn pool() -> Option<&'static Pool> {
    static POOL: OnceLock<Option<Pool>> = OnceLock::new();
    let p = POOL
        .get_or_init(|| {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            let n = MAX_HELPERS.min(cpus.saturating_sub(1));
            let mut slots = Vec::new();
            for i in 0..n {
                let slot: &'static Slot = Box::leak(Box::new(Slot {
                    state: AtomicU32::new(IDLE),
                    sleeping: AtomicU32::new(0),
                    src: AtomicUsize::new(0),
                    dst: AtomicUsize::new(0),
                    len: AtomicUsize::new(0),
                }));
                let spawned = std::thread::Builder::new()
                    .name(format!("omps-copy{i}"))
                    .spawn(move || helper(slot));
                if spawned.is_err() {
                    break;
                }
                slots.push(slot);
            }
            (!slots.is_empty()).then(|| Pool {
                pid: std::process::id(),
                slots,
                busy: Mutex::new(()),
            })
        })
        .as_ref()?;
    // A forked child has the pool's memory but not its threads.
    (p.pid == std::process::id()).then_some(p)
}

fn helper(slot: &'static Slot) {
    loop {
        let mut rounds = 0;
        while slot.state.load(Ordering::Acquire) != POSTED {
            if rounds < SPIN_ROUNDS {
                rounds += 1;
                std::hint::spin_loop();
                continue;
            }
            // SYNC POINT: SeqCst with the poster's store of POSTED and load of `sleeping`:
            // either it sees us asleep and wakes us, or we see its post and stay up.
            slot.sleeping.store(1, Ordering::SeqCst);
            let seen = slot.state.load(Ordering::SeqCst);
            if seen != POSTED {
                futex::wait(&slot.state, seen, None);
            }
            slot.sleeping.store(0, Ordering::Relaxed);
        }
        // SYNC POINT: the Acquire load of POSTED above pairs with the poster's Release
        // store, so the job's fields are the poster's.
        let (src, dst, len) = (
            slot.src.load(Ordering::Relaxed) as *const u8,
            slot.dst.load(Ordering::Relaxed) as *mut u8,
            slot.len.load(Ordering::Relaxed),
        );
        // SAFETY: the poster keeps both ranges valid, and apart, until it sees DONE.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        // SYNC POINT: Release pairs with the poster's Acquire load of DONE, which so sees
        // the copied bytes.
        slot.state.store(DONE, Ordering::Release);
    }
}

/// Copies `n` bytes from `src` to `dst`, with helper threads when it is worth it.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` readable and `dst` writable for `n` bytes,
/// not overlapping.
pub unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    let whole = || {
        // SAFETY: the caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
    };
    if n < MIN_SPLIT {
        return whole();
    }
    let Some(pool) = pool() else {
        return whole();
    };
    let Ok(_ours) = pool.busy.try_lock() else {
        return whole();
    };
    // SAFETY: the caller's promise; we hold `busy`.
    unsafe { split(pool, dst, src, n) }
}

/// Copies with every helper of `pool`.
///
/// # Safety
/// As [`copy`], and the caller holds `pool.busy`.
unsafe fn split(pool: &Pool, dst: *mut u8, src: *const u8, n: usize) {
    let parts = pool.slots.len() + 1;
    let part = (n / parts).next_multiple_of(4096);
    let mut posted = Vec::with_capacity(pool.slots.len());
    let mut off = part;
    for slot in &pool.slots {
        if off >= n {
            break;
        }
        let len = part.min(n - off);
        slot.src.store(src as usize + off, Ordering::Relaxed);
        slot.dst.store(dst as usize + off, Ordering::Relaxed);
        slot.len.store(len, Ordering::Relaxed);
        // SYNC POINT: pairs with the helper's Acquire load of POSTED.
        slot.state.store(POSTED, Ordering::SeqCst);
        if slot.sleeping.load(Ordering::SeqCst) != 0 {
            futex::wake(&slot.state, 1);
        }
        posted.push(slot);
        off += len;
    }
    // The first part is ours, and so is what is left past the helpers' parts (rounding
    // the part size to pages leaves a tail when there are fewer helpers than parts).
    // SAFETY: both pieces lie within the caller's ranges: [0, part.min(n)) and [off, n).
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, part.min(n));
        if off < n {
            std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), n - off);
        }
    }
    for slot in posted {
        // SYNC POINT: Acquire pairs with the helper's Release store of DONE.
        while slot.state.load(Ordering::Acquire) != DONE {
            std::hint::spin_loop();
        }
        slot.state.store(IDLE, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    /// Every size through the helpers (however many this machine has), holding the pool
    /// so that no other test's copy makes this one copy alone.
    #[test]
    fn split_copies_are_exact_at_every_size() {
        let pool = super::pool();
        let _ours = pool.map(|p| p.busy.lock().unwrap());
        let sizes = [
            1,
            4095,
            4096,
            8193,
            256 << 10,
            (256 << 10) + 1,
            (256 << 10) + 4097,
        ];
        for n in sizes
            .into_iter()
            .chain([(1 << 20) + 12345, (3 << 20) + 1, 5 << 20])
        {
            let src: Vec<u8> = (0..n).map(|i| (i * 7 + i / 4096) as u8).collect();
            let mut dst = vec![0xEEu8; n + 64];
            let (d, s) = (dst[32..].as_mut_ptr(), src.as_ptr());
            // SAFETY: src holds n bytes, dst n + 64 past which d starts 32 in; separate
            // vectors; we hold the pool.
            unsafe {
                match pool {
                    Some(p) => super::split(p, d, s, n),
                    None => super::copy(d, s, n),
                }
            }
            let bad = dst[32..32 + n].iter().zip(&src).position(|(a, b)| a != b);
            assert_eq!(bad, None, "size {n}: first wrong byte");
            assert!(
                dst[..32].iter().chain(&dst[32 + n..]).all(|&b| b == 0xEE),
                "size {n}: wrote outside"
            );
        }
    }

    #[test]
    fn concurrent_copies_do_not_mix() {
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                std::thread::spawn(move || {
                    for round in 0..20u8 {
                        let n = (1 << 20) + t as usize * 4097;
                        let src = vec![t.wrapping_mul(31).wrapping_add(round); n];
                        let mut dst = vec![0u8; n];
                        // SAFETY: both vectors hold n bytes.
                        unsafe { super::copy(dst.as_mut_ptr(), src.as_ptr(), n) };
                        assert!(dst == src, "thread {t} round {round}");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
