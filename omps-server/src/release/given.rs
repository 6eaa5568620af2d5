//! What a client gives back ([`Release`]), as its session hands it to the releaser:
//! plain data, on its own so that the releaser, the workers and the sessions can all
//! name it without depending on one another (a session makes one, a worker fences it, the
//! releaser frees it).

use crate::client::limits::ContextLimits;
use crate::client::ClientShared;
use crate::release::cross::{CrossPart, CrossRelease};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A pinned range a client gave back: every GPU's worker fences the client's work that
/// may still use it, and the last of them unregisters it.
pub struct PinnedRelease {
    pub addr: u64,
    pub len: u64,
    /// Workers still to fence it.
    pub left: Arc<AtomicUsize>,
    pub client: Arc<ClientShared>,
}

impl PinnedRelease {
    /// This worker is done with it: unregistered if it was the last.
    pub fn done(self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.client.release_pinned(self.addr, self.len);
            self.client.unpinned(self.len);
            let mut u = self
                .client
                .unpinning
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            u.0 = u.0.saturating_sub(self.len);
            u.1 = u.1.saturating_sub(1);
        }
    }
}

/// Resources a client gave back or left behind, freed once the GPU is done with them.
#[derive(Default)]
pub struct Release {
    pub allocs: Vec<(u64, u64)>,
    /// Pinned host ranges (already out of the client's table).
    pub pinned: Vec<PinnedRelease>,
    pub modules: Vec<u64>,
    /// What the modules' variables took of the client's memory (given back with them).
    pub module_bytes: u64,
    /// What the context limits it raised took of its memory (given back once they come
    /// down: crate::client::limits).
    pub limit_bytes: u64,
    pub events: Vec<u64>,
    pub graphs: Vec<u64>,
    pub execs: Vec<u64>,
    /// Allocations the client exported for IPC and is done with (crate::client::ipc).
    pub ipc: Vec<(u64, u64)>,
    /// Other clients' allocations it opened and closed (or left open when it went).
    pub ipc_close: Vec<u64>,
    pub vmm: VmmRelease,
    pub arrays: ArrayRelease,
    /// The context limits of the GPU where the departed client had raised them: they
    /// come back down once its work is done (crate::client::limits).
    pub limits: Option<Arc<Mutex<ContextLimits>>>,
    /// Releases on other GPUs that wait for this one's fence (crate::release::peer_fence).
    pub cross: CrossPart,
}

impl Release {
    /// Nothing but fences for releases held elsewhere (crate::release::peer_fence); `settles`: its
    /// passing also means the session's last work here is done.
    pub fn fencing(tokens: Vec<Arc<CrossRelease>>, settles: bool) -> Self {
        Release {
            cross: CrossPart { tokens, settles },
            ..Default::default()
        }
    }

    /// Whether releasing it gives device memory back.
    pub fn gives_memory(&self) -> bool {
        !self.allocs.is_empty()
            || !self.ipc.is_empty()
            || !self.ipc_close.is_empty()
            || self.module_bytes > 0
            || !self.vmm.handles.is_empty()
            || self.vmm.released_mapped_bytes > 0
            || !self.arrays.arrays.is_empty()
            || !self.arrays.mipmaps.is_empty()
            || !self.cross.tokens.is_empty()
    }

    /// Whether this is one device allocation of `size` bytes and nothing else.
    pub fn is_one_alloc_of(&self, size: u64) -> bool {
        matches!(self.allocs[..], [(_, len)] if len == size)
            && self.cross.is_empty()
            && self.pinned.is_empty()
            && self.modules.is_empty()
            && self.module_bytes == 0
            && self.events.is_empty()
            && self.graphs.is_empty()
            && self.execs.is_empty()
            && self.ipc.is_empty()
            && self.ipc_close.is_empty()
            && self.vmm.unmap.is_empty()
            && self.vmm.handles.is_empty()
            && self.vmm.reservations.is_empty()
            && self.vmm.reach_reservations.is_empty()
            && self.vmm.released_mapped_bytes == 0
            && self.arrays.arrays.is_empty()
            && self.arrays.mipmaps.is_empty()
            && self.arrays.textures.is_empty()
            && self.arrays.surfaces.is_empty()
            && self.limits.is_none()
    }
}

/// What goes once the client's work is done, in this order.
#[derive(Default)]
pub struct ArrayRelease {
    pub textures: Vec<u64>,
    pub surfaces: Vec<u64>,
    /// (handle, bytes) of arrays, then of mipmapped arrays.
    pub arrays: Vec<(u64, u64)>,
    pub mipmaps: Vec<(u64, u64)>,
}

/// What a departed client's virtual memory leaves to release, in this order.
#[derive(Default)]
pub struct VmmRelease {
    pub unmap: Vec<(u64, u64)>,
    pub handles: Vec<(u64, u64)>,
    pub reservations: Vec<(u64, u64)>,
    /// Reservations freed by a client that gave other GPUs access to its VMM memory,
    /// released with its work on every GPU past a fence: freed then only if no executable
    /// graph of its on any GPU uses a byte of them (ClientShared::graph_reach, which a
    /// graph read before the fence is in by then); else held there until none does.
    pub reach_reservations: Vec<(u64, u64)>,
    /// Memory of handles released but still mapped: charged until the unmaps above.
    pub released_mapped_bytes: u64,
    /// Mappings other GPUs reached: out of the client's table once unmapped.
    pub reach: Vec<u64>,
    /// A call (channel, sequence) answered once the unmaps are done: a held cuMemUnmap.
    pub answer: Option<(u32, u32)>,
}
