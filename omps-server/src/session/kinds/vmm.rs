//! A client's virtual memory as its session holds it ([`VmmState`]): reservations,
//! handles, mappings and shared pools. Below the session (state.rs holds it) and the
//! families that use it (vmm.rs, graph_memory.rs).

use super::pool_share::PoolShareState;
use crate::release::given::VmmRelease;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Bounds a client's tables, so it cannot make the server's grow without end.
#[cfg(not(test))]
pub(in crate::session) const MAX_ENTRIES: usize = 1 << 16;
/// Small in unit tests, so that reaching it costs nothing.
#[cfg(test)]
pub(in crate::session) const MAX_ENTRIES: usize = 16;

#[derive(Default)]
pub struct VmmState {
    /// Reservation start -> size.
    pub(in crate::session) reservations: BTreeMap<u64, u64>,
    /// Handle id -> (driver handle, size).
    pub(in crate::session) handles: HashMap<u32, (u64, u64)>,
    /// Handle ids whose memory the driver made compressible: importers learn it too.
    pub(in crate::session) compressed: HashSet<u32>,
    /// Mapping start -> (size, handle id, the server GPUs other than this session's with
    /// access to it, bit per ordinal).
    pub(in crate::session) mappings: BTreeMap<u64, (u64, u32, u64)>,
    /// Handles released while still mapped (PyTorch releases right after mapping): the
    /// driver keeps their memory until the last unmap, and the client stays charged for
    /// it until then. Handle id -> (size, driver handle).
    pub(in crate::session) released_mapped: HashMap<u32, (u64, u64)>,
    /// Handles imported from another client: id -> size. Charged nothing while the
    /// exporter's process is; charged to this client if it releases the memory last while
    /// it still maps it (the driver keeps it for the mapping).
    pub(in crate::session) imported: HashMap<u32, u64>,
    pub(in crate::session) next_handle: u32,
    /// Memory pools it shares with other clients (pool_share.rs).
    pub(in crate::session) pools: PoolShareState,
}

impl VmmState {
    pub(in crate::session) fn reservation_holding(&self, addr: u64, len: u64) -> bool {
        self.reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(&s, &n)| addr.checked_add(len).is_some_and(|e| e <= s + n))
    }

    pub(in crate::session) fn overlaps_mapping(&self, addr: u64, len: u64) -> bool {
        let end = addr.saturating_add(len);
        self.mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&s, &(n, ..))| s + n > addr)
    }

    /// Whether `[addr, addr+len)` lies inside mappings of this client.
    pub fn mapped(&self, addr: u64, len: u64) -> bool {
        let (mut at, end) = (addr, addr.saturating_add(len));
        while at < end {
            match self.mappings.range(..=at).next_back() {
                Some((&s, &(n, ..))) if s + n > at => at = s + n,
                _ => return false,
            }
        }
        true
    }

    /// Handle `id`'s mapping went: if it was its last and the handle was released, the
    /// driver frees the memory with it, and what the client was charged comes back.
    pub(in crate::session) fn unmapped_last(&mut self, id: u32) -> Option<(u64, u64)> {
        if self.mappings.values().any(|&(_, other, _)| other == id) {
            return None;
        }
        self.released_mapped.remove(&id)
    }

    /// The mappings `[addr, addr+len)` consists of, whole: their starts.
    pub(in crate::session) fn whole_mappings(&self, addr: u64, len: u64) -> Option<Vec<u64>> {
        let end = addr.checked_add(len)?;
        let parts: Vec<(u64, u64)> = self
            .mappings
            .range(addr..end)
            .map(|(&s, &(n, ..))| (s, n))
            .collect();
        let mut at = addr;
        for &(s, n) in &parts {
            if s != at {
                return None;
            }
            at = s + n;
        }
        (at == end && !parts.is_empty()).then(|| parts.into_iter().map(|p| p.0).collect())
    }

    pub fn into_release(self) -> VmmRelease {
        VmmRelease {
            unmap: self.mappings.iter().map(|(&s, &(n, ..))| (s, n)).collect(),
            reach: self
                .mappings
                .iter()
                .filter(|m| m.1 .2 != 0)
                .map(|m| *m.0)
                .collect(),
            handles: self.handles.values().copied().collect(),
            reservations: self.reservations.into_iter().collect(),
            reach_reservations: Vec::new(),
            released_mapped_bytes: self.released_mapped.values().map(|r| r.0).sum(),
            answer: None,
        }
    }
}

impl VmmState {
    /// The client goes: memory it released while mapped that other clients still hold
    /// stays charged to its process until they release it too (the rest goes with the
    /// unmaps, `released_mapped_bytes`).
    pub fn keep_shared(
        &mut self,
        reg: &mut crate::client::ipc::Registry,
        client: &crate::client::ClientShared,
        dev: usize,
    ) {
        self.released_mapped.retain(|_, &mut (size, h)| {
            let shared = reg.vmm_shared(h);
            if shared {
                reg.keep_vmm(h, client.hold(dev, size));
            }
            !shared
        });
    }
}
