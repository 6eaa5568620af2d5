//! Counters the workers keep about their own time, read by `omps-ctl stats`.
//!
//! They exist to answer "where does a client's time go inside the server" while a real
//! workload runs: how busy each lane is, how long one record takes to handle, and which
//! record was the slowest. Each lane writes only its own counters (relaxed atomics; a
//! reader may see them a few records apart, which is fine for figures read once a second).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Upper bounds, in microseconds, of the handling-time buckets; the last bucket is open.
pub const BUCKETS_US: [u64; 8] = [2, 5, 10, 50, 200, 1_000, 10_000, u64::MAX];

#[derive(Default)]
pub struct LaneStats {
    pub records: AtomicU64,
    /// Time spent handling records.
    pub busy_ns: AtomicU64,
    /// Passes over the lane's clients, and of those, the ones that ended asleep.
    pub passes: AtomicU64,
    pub naps: AtomicU64,
    pub hist: [AtomicU64; BUCKETS_US.len()],
    /// The slowest record since the last reset, and its wire op.
    pub max_ns: AtomicU64,
    pub max_op: AtomicU32,
}

impl LaneStats {
    pub fn record(&self, op: u32, ns: u64) {
        self.records.fetch_add(1, Ordering::Relaxed);
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
        let us = ns / 1000;
        let b = BUCKETS_US.iter().position(|&lim| us < lim).unwrap_or(0);
        self.hist[b].fetch_add(1, Ordering::Relaxed);
        if ns > self.max_ns.load(Ordering::Relaxed) {
            self.max_ns.store(ns, Ordering::Relaxed);
            self.max_op.store(op, Ordering::Relaxed);
        }
    }

    /// One line: cumulative counters, then the slowest record since the last call (reset).
    pub fn line_and_reset_max(&self) -> String {
        let hist: Vec<String> = self
            .hist
            .iter()
            .map(|h| h.load(Ordering::Relaxed).to_string())
            .collect();
        let max = self.max_ns.swap(0, Ordering::Relaxed);
        let op = self.max_op.load(Ordering::Relaxed);
        format!(
            "records {} busy_ns {} passes {} naps {} hist_us<2,5,10,50,200,1k,10k,inf {} max_ns {} max_op {}",
            self.records.load(Ordering::Relaxed),
            self.busy_ns.load(Ordering::Relaxed),
            self.passes.load(Ordering::Relaxed),
            self.naps.load(Ordering::Relaxed),
            hist.join(","),
            max,
            op
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_land_in_their_bucket_and_the_max_resets_on_read() {
        let s = LaneStats::default();
        s.record(3, 1_500);
        s.record(7, 60_000);
        s.record(9, 20_000_000);
        assert_eq!(s.hist[0].load(Ordering::Relaxed), 1);
        assert_eq!(s.hist[4].load(Ordering::Relaxed), 1);
        assert_eq!(s.hist[7].load(Ordering::Relaxed), 1);
        let line = s.line_and_reset_max();
        assert!(line.contains("records 3 busy_ns 20061500"), "{line}");
        assert!(line.ends_with("max_ns 20000000 max_op 9"), "{line}");
        assert!(s.line_and_reset_max().contains("max_ns 0 "));
    }
}
