//! What a session leaves when its client goes: everything it still holds on the GPU,
//! gathered into one release ([`Session::into_release`]), and the host functions and
//! host-node words it leaves acknowledged. Apart from state.rs, which holds the session.

use super::kinds::graph_held::HeldAtLast;
use super::*;

impl Session {
    /// Blocks its lane kept for its next allocations (worker/kept.rs), back among its
    /// allocations as it ends, to go with them.
    pub fn adopt_kept(&mut self, blocks: Vec<(u64, u64)>) {
        self.allocs.extend(blocks);
    }

    /// Everything the client still holds on this GPU, for release once its work is done.
    pub fn into_release(
        mut self,
        shared: &crate::worker::GpuShared,
    ) -> (Arc<ClientShared>, Release) {
        let cache = &shared.modules;
        // Images uploaded and never loaded leave the server-wide total.
        let uploaded: usize = self.blobs.iter().map(Vec::len).sum();
        self.client.account.totals.give_image(uploaded as u64);
        // What it exported goes through the IPC books; what it opened is closed, and an
        // allocation whose owner left before is freed with it (counted as this client's
        // until then, since the releaser takes it off the count).
        // Blocks held for its graphs go as its other allocations do (exported ones through
        // the IPC books).
        for (p, n) in self.take_graph_held() {
            self.allocs.insert(p, n);
        }
        // Modules and IPC openings held for its graphs go with the rest.
        let HeldAtLast {
            modules: held_modules,
            closes: held_closes,
            reservations: held_reservations,
            pinned: held_pinned,
            arrays: held_arrays,
            mipmaps: held_mipmaps,
        } = self.take_graph_held_other();
        let (ipc, mut allocs) = {
            let mut reg = shared.ipc.lock().unwrap_or_else(|e| e.into_inner());
            let (ipc, own): (Vec<Range>, Vec<Range>) = std::mem::take(&mut self.allocs)
                .into_iter()
                .partition(|&(p, _)| reg.exported(p, self.client.id));
            // Shared events go with their last user.
            let events: Vec<u64> = self.events.drain().map(|(_, e)| e).collect();
            self.events_to_destroy = events
                .into_iter()
                .filter(|&e| reg.release_event(e))
                .collect();
            self.vmm.pools.release_all(&mut reg);
            (ipc, own)
        };
        allocs.sort_unstable();
        // Pinned host memory stays with the client and goes when its last Arc does.
        // What it opened is closed once its own work is done (crate::worker's free).
        let ipc_close = std::mem::take(&mut self.imported)
            .into_iter()
            .flat_map(|(p, (_, n))| std::iter::repeat_n(p, n as usize))
            .chain(held_closes)
            .collect();
        let module_bytes = self.modules.values().map(|m| m.data_bytes).sum::<u64>()
            + held_modules.iter().map(|m| m.2).sum::<u64>();
        let mut rel = Release {
            // Pinned ranges it gave back that its graphs held: unregistered with the rest.
            pinned: held_pinned,
            limits: None,
            cross: Default::default(),
            module_bytes,
            limit_bytes: self.limit_charges.values().sum(),
            allocs,
            ipc,
            ipc_close,
            modules: self
                .modules
                .drain()
                .map(|(_, m)| (m.handle, m.shared))
                .chain(held_modules.iter().map(|m| (m.0, m.1)))
                .flat_map(|(handle, shared)| match shared {
                    true => cache.release(handle).unwrap_or_default(),
                    false => vec![handle],
                })
                .collect(),
            events: std::mem::take(&mut self.events_to_destroy)
                .into_iter()
                .chain(std::mem::take(&mut self.left))
                .chain(self.quick.take_probe())
                .chain(self.take_depth_events())
                .collect(),
            graphs: self.graphs.drain().map(|(_, g)| g).collect(),
            execs: self.execs.drain().map(|(_, e)| e).collect(),
            vmm: {
                let mut v = std::mem::take(&mut self.vmm);
                let mut reg = shared.vmm_ipc.lock().unwrap_or_else(|e| e.into_inner());
                v.keep_shared(&mut reg, &self.client, self.dev);
                let mut r = v.into_release();
                r.reservations.extend(held_reservations);
                // And those other GPUs' graphs held that none does any more.
                r.reservations.extend(self.take_reach_held());
                r
            },
            arrays: {
                // Arrays its graphs held go with the rest.
                let mut a = std::mem::take(&mut self.arrays).into_release();
                a.arrays.extend(held_arrays);
                a.mipmaps.extend(held_mipmaps);
                a
            },
        };
        // Profiling twins and the graphs kept for them.
        self.profiles.drain_into(&mut rel);
        (self.client, rel)
    }

    /// The client is gone: acknowledges every host function it queued, so its streams (and
    /// the fence after them) do not wait for a function that will never run.
    /// The host-node slots its graphs hold (for acknowledging them once it is dead).
    pub fn take_host_nodes(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.host_nodes).into_iter().collect()
    }

    /// The `ack` words in pinned memory its graphs' host nodes wait on (as above).
    pub fn take_host_words(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.host_words).into_iter().collect()
    }

    pub fn release_host_functions(&mut self) {
        for (&slot, &seq) in &self.hostfn_last {
            if let Some(w) = self.client.seg.hostfn(slot as usize) {
                w.ack.store(seq, Ordering::Release);
            }
        }
    }
}
