//! Virtual memory management for one client: address reservations, physical handles and
//! mappings (PyTorch's `expandable_segments:True` allocator), in the shared context.
//!
//! Reservations and handles are the client's own: every address and handle a record names
//! is looked up in this client's tables, so no client can map, unmap or reach another's.
//! Physical memory counts as the client's memory from creation to release. Mapped ranges
//! join the ranges the client may copy to and from. What a client leaves behind is
//! unmapped, released and freed once its work is done (`crate::release::releaser`).
//!
//! Access from another GPU (`cuMemSetAccess` naming a peer device, as NCCL's cuMem
//! transport asks) is passed to the driver for whole mappings of the client's; the
//! mapping joins the client's table other GPUs' sessions check copies against
//! (`ClientShared::vmm_reaches`), and its unmap waits for the client's work on every GPU
//! (crate::release::peer_fence) before the driver unmaps it and the call is answered (R14).

use super::kinds::vmm::MAX_ENTRIES;
use super::{bad, Malformed, Session};
use crate::gpu::{code, CuError, GpuResult};
use crate::release::given::VmmRelease;
use crate::worker::WorkerCtx;
use omps_ring::wire::{self, vmm};
use std::sync::atomic::Ordering;

impl Session {
    pub(super) fn handle_vmm(
        &mut self,
        ctx: &mut WorkerCtx,
        v: wire::Vmm,
    ) -> Result<(), Malformed> {
        let gpu = ctx.gpu.clone();
        let [a0, a1, a2] = v.args;
        if matches!(v.kind, vmm::EXPORT | vmm::IMPORT) {
            return self.vmm_share(ctx, v);
        }
        if (vmm::POOL_EXPORT..=vmm::POOL_IMPORT_PTR).contains(&v.kind) {
            return self.pool_share(ctx, v);
        }
        if v.kind == vmm::SET_ACCESS {
            return self.vmm_set_access(ctx, v);
        }
        if v.kind == vmm::UNMAP
            && matches!(self.vmm.mappings.get(&a0), Some(&(n, _, peers)) if n == a1 && peers != 0)
        {
            self.unmap_held(ctx, v);
            return Ok(());
        }
        // CUmemAllocationCompType: none or generic, as the driver knows.
        if matches!(v.kind, vmm::CREATE | vmm::GRANULARITY) && a1 > 1 {
            return self.complete(v.call, code::INVALID_VALUE, &[]);
        }
        if v.kind == vmm::ADDRESS_FREE {
            return self.vmm_address_free(ctx, v);
        }
        if v.kind == vmm::CREATE {
            if let Err(e) = self.charge(ctx, a0) {
                return self.complete(v.call, e.0, &[]);
            }
        }
        let client = self.client.clone();
        let dev = self.dev;
        let uncharge = |n: u64| client.uncharge(dev, n);
        // Memory it is done with but another client may still hold: charged to its
        // process until the last holder lets go (crate::client::ipc), given back now otherwise.
        let shared = ctx.shared.clone();
        let done_with = |h: u64, n: u64| {
            shared
                .vmm_ipc
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .keep_vmm(h, client.hold(dev, n))
        };
        // Reservations its graphs hold after it freed them count: still the driver's.
        let held = self.held_reservations();
        let st = &mut self.vmm;
        // Handle ids are never reused while the session lives: one that made 2^32
        // handles gets no more, rather than an id that names another handle.
        let ids_left = v.kind != vmm::CREATE || st.next_handle < u32::MAX;
        if (st.reservations.len() + st.handles.len() + st.mappings.len() + held >= MAX_ENTRIES
            && matches!(v.kind, vmm::RESERVE | vmm::CREATE | vmm::MAP))
            || !ids_left
        {
            if v.kind == vmm::CREATE {
                uncharge(a0);
            }
            return self.complete(v.call, code::OUT_OF_MEMORY, &[]);
        }
        if v.kind == vmm::CREATE {
            let r = gpu
                .vmm_create(a0, a1 == 1)
                .map(|(h, compressed)| {
                    st.next_handle += 1;
                    st.handles.insert(st.next_handle, (h, a0));
                    if compressed {
                        st.compressed.insert(st.next_handle);
                    }
                    [st.next_handle as u64, u64::from(compressed)]
                })
                .inspect_err(|_| {
                    uncharge(a0);
                });
            return self.complete_pod(v.call, r);
        }
        let r: GpuResult<u64> = match v.kind {
            vmm::RESERVE => gpu.vmm_reserve(a0, a1, a2).inspect(|&p| {
                st.reservations.insert(p, a0);
            }),
            vmm::RELEASE => match st.handles.remove(&v.handle) {
                Some((h, size)) => {
                    st.compressed.remove(&v.handle);
                    let imported = st.imported.remove(&v.handle);
                    let mapped = st.mappings.values().any(|&(_, id, _)| id == v.handle);
                    // Memory another client imported goes with its last user.
                    let last = shared
                        .vmm_ipc
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .release_vmm(h);
                    match imported {
                        // Imported memory it now holds last, through a mapping: its own
                        // until it unmaps it.
                        Some(n) if last && mapped => {
                            client.add_mem(dev, n);
                            st.released_mapped.insert(v.handle, (n, h));
                        }
                        Some(_) => {}
                        None if mapped && size > 0 => {
                            st.released_mapped.insert(v.handle, (size, h));
                        }
                        None => done_with(h, size),
                    }
                    if last {
                        gpu.vmm_release(h).map(|()| 0)
                    } else {
                        Ok(0)
                    }
                }
                None => Err(CuError(code::INVALID_HANDLE)),
            },
            vmm::MAP => match st.handles.get(&v.handle) {
                None => Err(CuError(code::INVALID_HANDLE)),
                Some(_) if !st.reservation_holding(a0, a1) || st.overlaps_mapping(a0, a1) => {
                    Err(CuError(code::INVALID_VALUE))
                }
                Some(&(h, _)) => gpu.vmm_map(a0, a1, a2, h).map(|()| {
                    st.mappings.insert(a0, (a1, v.handle, 0));
                    0
                }),
            },
            vmm::UNMAP => match st.mappings.get(&a0) {
                // The program promised nothing uses the range any more, as natively; only
                // this GPU reaches it (else `unmap_held`).
                Some(&(n, id, _)) if n == a1 => gpu.vmm_unmap(a0, a1).map(|()| {
                    st.mappings.remove(&a0);
                    if let Some((size, h)) = st.unmapped_last(id) {
                        done_with(h, size);
                    }
                    0
                }),
                _ => Err(CuError(code::INVALID_VALUE)),
            },
            vmm::GRANULARITY => gpu.vmm_granularity(a0 != 0, a1 == 1),
            k => return bad(format!("unknown vmm call {k}")),
        };
        self.complete_pod(v.call, r.map(|value| wire::U64Reply { value }))
    }

    /// cuMemAddressFree of a whole reservation with nothing mapped in it. One a live
    /// executable graph of the client's uses a range of is the client's no more, but the
    /// driver keeps it reserved until no such graph is left (graph_memory.rs): freed now,
    /// its addresses could become another client's reservation, which a replay would write.
    fn vmm_address_free(&mut self, ctx: &mut WorkerCtx, v: wire::Vmm) -> Result<(), Malformed> {
        let [at, size, _] = v.args;
        let st = &mut self.vmm;
        let r = if st.reservations.get(&at) != Some(&size) || st.overlaps_mapping(at, size) {
            Err(CuError(code::INVALID_VALUE))
        } else {
            st.reservations.remove(&at);
            let held = crate::session::kinds::graph_held::HeldForGraphs::Reservation(at, size);
            // Graphs on other GPUs may write it too (VMM memory they were given access to).
            if self.hold_other_for_graphs(held) || self.hold_for_other_gpus((at, size)) {
                Ok(0)
            } else if self.client.vmm_peer.load(Ordering::SeqCst) {
                // Another GPU's lane may not yet have read an instantiate (or update) the
                // client published there before it unmapped the range: accepted then
                // (ClientShared::vmm_reaches), its graph would write freed addresses. So,
                // as the unmap, the free waits for the client's work on every GPU, and goes
                // to the driver only if no graph of its uses the range by then.
                let rel = super::Release {
                    vmm: VmmRelease {
                        reach_reservations: vec![(at, size)],
                        ..Default::default()
                    },
                    ..Default::default()
                };
                ctx.release_everywhere(self, rel);
                Ok(0)
            } else {
                ctx.gpu.vmm_address_free(at, size).map(|()| 0)
            }
        };
        self.complete_pod(v.call, r.map(|value| wire::U64Reply { value }))
    }

    /// cuMemSetAccess: read-write for this GPU (`args[2]` 0), or for the client's devices
    /// whose bits `args[2]` sets. Access for another GPU is for whole mappings only, so
    /// that what other GPUs' sessions accept is exactly what the driver maps there.
    fn vmm_set_access(&mut self, ctx: &mut WorkerCtx, v: wire::Vmm) -> Result<(), Malformed> {
        let [addr, len, mask] = v.args;
        let visible = self.client.visible.len().min(64);
        if mask >> visible != 0 {
            return bad(format!(
                "vmm access for devices {mask:#x} beyond its {visible}"
            ));
        }
        let gpus: Vec<usize> = match mask {
            0 => vec![self.dev],
            _ => (0..visible)
                .filter(|d| mask & (1 << d) != 0)
                .map(|d| self.client.visible[d])
                .collect(),
        };
        let others = gpus
            .iter()
            .filter(|&&g| g != self.dev && g < 64)
            .fold(0u64, |a, &g| a | 1 << g);
        let starts = match others {
            0 => self.vmm.mapped(addr, len).then(Vec::new),
            _ => self.vmm.whole_mappings(addr, len),
        };
        let Some(starts) = starts else {
            return self.complete(v.call, code::INVALID_VALUE, &[]);
        };
        if let Err(e) = ctx.gpu.vmm_set_access(addr, len, &gpus) {
            return self.complete(v.call, e.0, &[]);
        }
        if others != 0 {
            // Before the answer: what the client unmaps or leaves from now on waits for
            // its work on the other GPUs, whose sessions accept the range from now on.
            self.client.vmm_peer.store(true, Ordering::SeqCst);
            for s in starts {
                if let Some(m) = self.vmm.mappings.get_mut(&s) {
                    m.2 |= others;
                    self.client.note_vmm_access(s, m.0, m.2);
                }
            }
        }
        self.complete_pod(v.call, Ok(wire::U64Reply { value: 0 }))
    }

    /// The unmap of a mapping other GPUs reach: out of the books now (a copy the client
    /// sends after it is refused), unmapped by the driver once the client's work on every
    /// GPU has passed a fence, and answered then.
    fn unmap_held(&mut self, ctx: &mut WorkerCtx, v: wire::Vmm) {
        let [addr, len, _] = v.args;
        let Some((_, id, _)) = self.vmm.mappings.remove(&addr) else {
            return;
        };
        let freed = match self.vmm.unmapped_last(id) {
            Some((size, h)) => {
                let mut reg = ctx.shared.vmm_ipc.lock().unwrap_or_else(|e| e.into_inner());
                if reg.vmm_shared(h) {
                    reg.keep_vmm(h, self.client.hold(self.dev, size));
                    0
                } else {
                    size
                }
            }
            None => 0,
        };
        self.client.note_vmm_unmap(addr, true);
        let rel = super::Release {
            vmm: VmmRelease {
                unmap: vec![(addr, len)],
                reach: vec![addr],
                released_mapped_bytes: freed,
                answer: Some((v.call.channel, v.call.seq)),
                ..Default::default()
            },
            ..Default::default()
        };
        ctx.release_everywhere(self, rel);
    }

    /// Physical memory shared between clients (cuMemExportToShareableHandle and
    /// cuMemImportFromShareableHandle): a token names it, as IPC handles name allocations.
    /// An importer holds the memory until it releases it, whatever the exporter does; it
    /// is not charged for it: the exporter's process is, until the last holder releases
    /// it (then, if that holder still maps it, the holder is, until it unmaps it).
    fn vmm_share(&mut self, ctx: &mut WorkerCtx, v: wire::Vmm) -> Result<(), Malformed> {
        let me = self.client.id;
        let mut reg = ctx.shared.vmm_ipc.lock().unwrap_or_else(|e| e.into_inner());
        if v.kind == vmm::EXPORT {
            let r = match self.vmm.handles.get(&v.handle) {
                Some(&(h, size)) if size > 0 => {
                    let compressed = self.vmm.compressed.contains(&v.handle);
                    Ok(reg.export_vmm(me, h, size, compressed, self.dev))
                }
                // Unknown, or imported from another client: not this client's to export.
                _ => Err(CuError(code::INVALID_VALUE)),
            };
            drop(reg);
            return self.complete_pod(v.call, r);
        }
        let mut token = [0u8; 16];
        token[..8].copy_from_slice(&v.args[0].to_le_bytes());
        token[8..].copy_from_slice(&v.args[1].to_le_bytes());
        if self.vmm.handles.len() >= MAX_ENTRIES || self.vmm.next_handle == u32::MAX {
            drop(reg);
            return self.complete(v.call, code::OUT_OF_MEMORY, &[]);
        }
        let r = match reg.open_vmm(&token, me) {
            Ok((h, size, compressed, home)) => {
                self.vmm.next_handle += 1;
                // Charged nothing here: recorded with size 0, released through the books.
                self.vmm.handles.insert(self.vmm.next_handle, (h, 0));
                self.vmm.imported.insert(self.vmm.next_handle, size);
                if compressed {
                    self.vmm.compressed.insert(self.vmm.next_handle);
                }
                // Where it lives, as the client numbers its devices (u64::MAX: one it
                // does not see).
                let home = self.client.ring_of(home).map_or(u64::MAX, |d| d as u64);
                Ok([
                    self.vmm.next_handle as u64,
                    size,
                    u64::from(compressed),
                    home,
                ])
            }
            Err(_) => Err(CuError(code::INVALID_VALUE)),
        };
        drop(reg);
        self.complete_pod(v.call, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::Gpu;
    use std::sync::Arc;

    /// Found in the review of the reservation hold: reservations its graphs hold after
    /// the client freed them are still the driver's, and count toward its entries.
    #[test]
    fn reservations_held_for_graphs_count_toward_the_entries() {
        let gpu: Arc<dyn Gpu> = Arc::new(crate::gpu::host::HostGpu::new(0, 1 << 26));
        let (client, _peer) = crate::testing::fake_client(&gpu, 1).expect("fake client");
        let mut ctx = WorkerCtx::new(gpu.clone()).expect("worker ctx");
        // SAFETY: the fake client's segment has ring 0 and outlives the session.
        let mut s = unsafe { Session::new(client, 0) };
        let g = gpu.vmm_granularity(false, false).expect("granularity");
        let reserve = wire::Vmm {
            kind: vmm::RESERVE,
            args: [g, 0, 0],
            ..Default::default()
        };
        for i in 0..MAX_ENTRIES as u64 {
            s.graph_held_other
                .push(crate::session::kinds::graph_held::HeldForGraphs::Reservation(i << 20, g));
        }
        s.handle_vmm(&mut ctx, reserve).expect("well formed");
        assert!(
            s.vmm.reservations.is_empty(),
            "a reservation past the entries"
        );
        s.graph_held_other.clear();
        s.handle_vmm(&mut ctx, reserve).expect("well formed");
        assert_eq!(s.vmm.reservations.len(), 1, "room again");
    }

    /// Review 4, finding 4: a client that gave another GPU access to its VMM memory frees a
    /// reservation here while that GPU's lane has yet to read an instantiate it published
    /// there before the unmap (which `vmm_reaches` still accepts then). Its free went to the
    /// driver at once; now it waits for the client's work on every GPU, as the unmap does,
    /// and a graph read meanwhile keeps it reserved.
    #[test]
    fn a_reservation_other_gpus_may_reach_is_freed_only_past_their_fence() {
        let host = Arc::new(crate::gpu::host::HostGpu::new(0, 1 << 26));
        let gpu: Arc<dyn Gpu> = host.clone();
        let (client, _peer) = crate::testing::fake_client(&gpu, 1).expect("fake client");
        let mut ctx = WorkerCtx::new(gpu.clone()).expect("worker ctx");
        // SAFETY: the fake client's segment has ring 0 and outlives the session.
        let mut s = unsafe { Session::new(client.clone(), 0) };
        client.vmm_peer.store(true, Ordering::SeqCst);
        let g = gpu.vmm_granularity(false, false).expect("granularity");
        let call = |kind, args| wire::Vmm {
            kind,
            args,
            ..Default::default()
        };
        for _ in 0..2 {
            s.handle_vmm(&mut ctx, call(vmm::RESERVE, [g, 0, 0]))
                .expect("well formed");
        }
        let vas: Vec<u64> = s.vmm.reservations.keys().copied().collect();
        assert_eq!(host.vmm_live().0, 2);
        // Both freed while no graph anywhere is known to use them.
        for &va in &vas {
            s.handle_vmm(&mut ctx, call(vmm::ADDRESS_FREE, [va, g, 0]))
                .expect("well formed");
        }
        assert_eq!(
            host.vmm_live().0,
            2,
            "freed before the client's work on the other GPUs passed a fence"
        );
        // Before the fence, GPU 1's lane reads the instantiate of a graph over the first.
        client
            .graph_reach
            .lock()
            .unwrap()
            .uses
            .insert((1, 7), vec![(vas[0], g)]);
        ctx.poll();
        assert_eq!(
            host.vmm_live().0,
            1,
            "the other one is freed past the fence"
        );
        assert_eq!(
            client.graph_reach.lock().unwrap().held,
            vec![(vas[0], g)],
            "held while GPU 1's graph uses it"
        );
        // The graph goes: the reservation with it.
        let free = {
            let mut r = client.graph_reach.lock().unwrap();
            r.uses.clear();
            r.unused()
        };
        assert_eq!(free, vec![(vas[0], g)]);
    }

    #[test]
    fn handle_ids_never_wrap_onto_ones_in_use() {
        let gpu: Arc<dyn Gpu> = Arc::new(crate::gpu::host::HostGpu::new(0, 1 << 26));
        let (client, _peer) = crate::testing::fake_client(&gpu, 1).expect("fake client");
        let mut ctx = WorkerCtx::new(gpu.clone()).expect("worker ctx");
        // SAFETY: the fake client's segment has ring 0 and outlives the session.
        let mut s = unsafe { Session::new(client, 0) };
        s.vmm.next_handle = u32::MAX - 1;
        let g = gpu.vmm_granularity(false, false).expect("granularity");
        let create = wire::Vmm {
            kind: vmm::CREATE,
            args: [g, 0, 0],
            ..Default::default()
        };
        s.handle_vmm(&mut ctx, create).expect("well formed");
        assert_eq!(s.vmm.handles.len(), 1);
        let first = s.vmm.handles[&u32::MAX];
        s.handle_vmm(&mut ctx, create).expect("well formed");
        assert_eq!(s.vmm.handles.len(), 1, "no id left: refused");
        assert_eq!(
            s.vmm.handles[&u32::MAX],
            first,
            "the last id still names its handle"
        );
        assert_eq!(
            s.client.mem_bytes[0].load(Ordering::Relaxed),
            g,
            "the refusal charged nothing"
        );
    }
}
