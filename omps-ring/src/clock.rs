//! The one clock both sides time work in: CLOCK_MONOTONIC nanoseconds. The server hands a
//! traced client the GPU's start and end of its work in it (`wire::EventTime`), and the
//! client's shim takes every other time of its profiler's records in it, so the two meet
//! without conversion on one machine.

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
