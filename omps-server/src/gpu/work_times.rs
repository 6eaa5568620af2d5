//! The GPU's own times of traced clients' work, kept until the client asks for them
//! (docs/design.md 12b, design S). A backend that times work fills it: the CUDA backend
//! from CUPTI's records in the server (a record of work names the driver call that queued
//! it by correlation id, and an external-correlation record ties that call to the key
//! the session pushed around it), the host backend directly.
//!
//! Keys are the sessions' (`Session::timer_key`): unique per session and span, so one
//! client can never read another's times. Everything here is bounded: past `LIMIT`
//! entries of a map, its oldest go.

pub use omps_ring::clock::monotonic_ns;
use std::collections::{HashMap, VecDeque};

/// Entries each map keeps at most (some 10 MB in all).
const LIMIT: usize = 1 << 17;

/// A map that forgets its oldest entries past LIMIT.
struct Bounded<K, V> {
    map: HashMap<K, V>,
    order: VecDeque<K>,
}

impl<K: std::hash::Hash + Eq + Copy, V> Default for Bounded<K, V> {
    fn default() -> Self {
        Bounded {
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq + Copy, V> Bounded<K, V> {
    fn entry(&mut self, k: K, v: V, merge: impl FnOnce(&mut V, V)) {
        if let Some(old) = self.map.get_mut(&k) {
            merge(old, v);
            return;
        }
        while self.map.len() >= LIMIT {
            match self.order.pop_front() {
                Some(old) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
        self.map.insert(k, v);
        self.order.push_back(k);
    }

    fn remove(&mut self, k: &K) -> Option<V> {
        // `order` keeps the key until it reaches the front: removing it there is a
        // no-op then (the map no longer has it).
        let v = self.map.remove(k);
        if self.order.len() > 2 * LIMIT {
            let map = &self.map;
            self.order.retain(|k| map.contains_key(k));
        }
        v
    }
}

/// Start and end of work, widened as more of it is recorded (a copy in chunks).
fn widen(old: &mut (u64, u64), new: (u64, u64)) {
    old.0 = old.0.min(new.0);
    old.1 = old.1.max(new.1);
}

#[derive(Default)]
pub struct WorkTimes {
    /// Driver call (correlation id) -> the key pushed around it.
    keys: Bounded<u32, u64>,
    /// Work whose call's key has not been seen yet, by correlation id.
    orphans: Bounded<u32, (u64, u64)>,
    /// Key -> the times of its work.
    times: Bounded<u64, (u64, u64)>,
}

impl WorkTimes {
    /// The driver call `correlation` was made with `key` pushed.
    pub fn key(&mut self, correlation: u32, key: u64) {
        self.keys.entry(correlation, key, |k, new| *k = new);
        if let Some(t) = self.orphans.remove(&correlation) {
            self.times.entry(key, t, widen);
        }
    }

    /// Work that the driver call `correlation` queued ran from `start` to `end`.
    pub fn work(&mut self, correlation: u32, start: u64, end: u64) {
        match self.keys.map.get(&correlation) {
            Some(&key) => self.times.entry(key, (start, end), widen),
            None => self.orphans.entry(correlation, (start, end), widen),
        }
    }

    /// Work of `key` ran from `start` to `end` (a backend that knows the key itself).
    pub fn keyed(&mut self, key: u64, start: u64, end: u64) {
        self.times.entry(key, (start, end), widen);
    }

    /// The times of `key`'s work, once: a key is asked for once.
    pub fn take(&mut self, key: u64) -> Option<(u64, u64)> {
        self.times.remove(&key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_meets_its_key_in_either_order_and_is_taken_once() {
        let mut w = WorkTimes::default();
        w.key(1, 100);
        w.work(1, 10, 20);
        w.work(2, 30, 45);
        w.work(2, 25, 40);
        assert_eq!(w.take(100), Some((10, 20)));
        assert_eq!(w.take(100), None, "taken once");
        w.key(2, 200);
        assert_eq!(w.take(200), Some((25, 45)), "chunks of one copy widen it");
        w.keyed(300, 5, 6);
        assert_eq!(w.take(300), Some((5, 6)));
    }

    #[test]
    fn the_maps_stay_bounded() {
        let mut w = WorkTimes::default();
        for i in 0..(LIMIT as u32 + 10) {
            w.work(i, 1, 2);
        }
        assert_eq!(w.orphans.map.len(), LIMIT);
        assert!(!w.orphans.map.contains_key(&0), "the oldest went first");
        for i in 0..(3 * LIMIT as u64) {
            w.keyed(i, 1, 2);
            w.take(i);
        }
        assert!(w.times.order.len() <= 2 * LIMIT + 1);
    }
}
