//! OMPS_STATS=1: the shim counts where the program's threads waited on omps, and prints
//! the totals to stderr at exit. Meant for finding out why a workload is slower through
//! omps than natively: time blocked on a full ring (the server is behind) against time
//! waiting for answers and completions (the GPU or the server's round trip).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub struct Counter {
    count: AtomicU64,
    ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Counter {
    const fn new() -> Self {
        Counter {
            count: AtomicU64::new(0),
            ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }

    pub fn add(&self, since: Instant) {
        let ns = since.elapsed().as_nanos() as u64;
        self.count.fetch_add(1, Ordering::Relaxed);
        self.ns.fetch_add(ns, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    fn line(&self, what: &str) -> String {
        format!(
            "{what} {} total_ms {:.3} max_ms {:.3}",
            self.count.load(Ordering::Relaxed),
            self.ns.load(Ordering::Relaxed) as f64 / 1e6,
            self.max_ns.load(Ordering::Relaxed) as f64 / 1e6
        )
    }
}

/// Pushes that found the ring full, timed until the record went in.
pub static RING_FULL: Counter = Counter::new();
/// Waits for a call's answer, a synchronization's completion or a staging chunk.
pub static WAITS: Counter = Counter::new();
/// Those of the waits that went to sleep on the futex.
pub static SLEPT: Counter = Counter::new();

/// Round-trip calls by wire op tag (tags are below 64).
pub static CALLS: [AtomicU64; 128] = [const { AtomicU64::new(0) }; 128];

pub fn count_call(tag: u32) {
    if let Some(c) = CALLS.get(tag as usize) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Query calls by `wire::query` kind (kinds are below 16).
pub static QUERIES: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];

pub fn count_query(kind: u32) {
    if let Some(c) = QUERIES.get(kind as usize) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

fn calls_line() -> String {
    let by_op: Vec<String> = CALLS
        .iter()
        .enumerate()
        .filter_map(|(tag, c)| {
            let n = c.load(Ordering::Relaxed);
            let name = omps_ring::wire::Op::from_tag(tag as u32);
            let name = name.map_or_else(|| format!("op{tag}"), |op| format!("{op:?}"));
            (n > 0).then(|| format!("{name}={n}"))
        })
        .collect();
    let by_kind: Vec<String> = QUERIES
        .iter()
        .enumerate()
        .filter_map(|(k, c)| {
            let n = c.load(Ordering::Relaxed);
            (n > 0).then(|| format!("query{k}={n}"))
        })
        .collect();
    format!("calls {} {}", by_op.join(" "), by_kind.join(" "))
}

pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var_os("OMPS_STATS").is_some_and(|v| v != "0");
        if on {
            // SAFETY: registering a plain extern "C" function with no arguments.
            unsafe { libc::atexit(print_at_exit) };
        }
        on
    })
}

extern "C" fn print_at_exit() {
    eprintln!(
        "omps-stats pid {}: {}; {}; {}; {}",
        std::process::id(),
        RING_FULL.line("ring_full"),
        WAITS.line("waits"),
        SLEPT.line("slept"),
        calls_line()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_sums_and_keeps_the_longest() {
        let c = Counter::new();
        let t = Instant::now() - std::time::Duration::from_millis(3);
        c.add(t);
        c.add(Instant::now());
        let line = c.line("x");
        assert!(line.starts_with("x 2 total_ms 3."), "{line}");
        assert!(line.contains("max_ms 3."), "{line}");
    }
}
