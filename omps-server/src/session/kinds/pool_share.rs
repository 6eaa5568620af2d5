//! The memory pools a client shares with other clients ([`PoolShareState`]): below its
//! VMM state, which holds them, and the family that serves them (pool_share.rs).

use std::collections::{HashMap, HashSet};

/// Bounds the pools one client exports or imports, and how often it imports one.
pub(in crate::session) const MAX_POOLS: usize = 1 << 12;
pub(in crate::session) const MAX_IMPORTS: u32 = 1 << 16;

#[derive(Default)]
pub struct PoolShareState {
    /// Keys of its own pools it exported.
    pub(in crate::session) exported: HashSet<u64>,
    /// Keys of other clients' pools it imported -> how many times.
    pub(in crate::session) imported: HashMap<u64, u32>,
}

impl PoolShareState {
    /// A departed client lets go of every pool it exported or imported.
    pub fn release_all(&mut self, reg: &mut crate::client::ipc::Registry) {
        for key in self.exported.drain() {
            reg.release_pool(key);
        }
        for (key, n) in self.imported.drain() {
            for _ in 0..n {
                reg.release_pool(key);
            }
        }
    }
}
