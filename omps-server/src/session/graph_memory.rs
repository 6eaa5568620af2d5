//! Memory an executable graph still uses outlives its free (issue 23, finding 9).
//!
//! A graph's memset and memcpy nodes name device addresses once, at capture or when built;
//! every replay writes them again. Were a client to free a block its graph uses, the
//! driver would hand the address to the next allocation, another client's perhaps, and
//! the replay would write over it: a direct memset of the freed block is refused, but the
//! graph's is the driver's. So the ranges each executable graph's memset and memcpy nodes
//! use are read at instantiation ([`crate::gpu::Gpu::graph_memory_ranges`]), and a block
//! freed while one of the client's executable graphs uses it is held, still charged to
//! the client, until the last such graph is destroyed or updated away from it. An IPC
//! opening closed while such a graph uses the memory opened is held the same way, and a
//! module unloaded while the client holds any graph ([`HeldForGraphs`]). (A kernel node's pointers
//! are its arguments' bytes, which no one can read: docs/design.md, the trust model.)

use super::kinds::graph_held::{HeldAtLast, HeldForGraphs};
use super::*;

/// Whether `[a, a+n)` and `[b, b+m)` share a byte.
fn overlap((a, n): (u64, u64), (b, m): (u64, u64)) -> bool {
    a < b.saturating_add(m) && b < a.saturating_add(n)
}

impl Session {
    /// Whether `h` must still be held.
    fn needed_by_graphs(&self, h: &HeldForGraphs) -> bool {
        match *h {
            HeldForGraphs::Module(..) | HeldForGraphs::Array(..) => {
                // A capture under way becomes a graph too.
                !self.graphs.is_empty() || !self.execs.is_empty() || self.capturing > 0
            }
            HeldForGraphs::IpcClose(p, n) | HeldForGraphs::Reservation(p, n) => {
                self.used_by_graphs((p, n))
            }
            HeldForGraphs::Pinned(ref r) => self.used_by_graphs((r.addr, r.len)),
        }
    }
}

impl Session {
    /// Whether one of the client's executable graphs uses a byte of `r`.
    fn used_by_graphs(&self, r: Range) -> bool {
        self.exec_ranges.values().flatten().any(|&e| overlap(e, r))
    }

    /// Holds `what` (a module being unloaded, an IPC opening being closed) if one of the
    /// client's executable graphs uses its memory: true, and it goes once none does.
    pub(super) fn hold_other_for_graphs(&mut self, what: HeldForGraphs) -> bool {
        // One held is enough to keep a module or an opening (each further unload or close
        // gives back a reference of its own, which the held one outlives): the list holds
        // each at most once, however often a client opens and closes.
        let same = |h: &HeldForGraphs| match (h, &what) {
            (HeldForGraphs::Module(a, ..), HeldForGraphs::Module(b, ..)) => a == b,
            (HeldForGraphs::IpcClose(a, _), HeldForGraphs::IpcClose(b, _)) => a == b,
            (HeldForGraphs::Reservation(a, _), HeldForGraphs::Reservation(b, _)) => a == b,
            (HeldForGraphs::Array(a, ..), HeldForGraphs::Array(b, ..)) => a == b,
            _ => false,
        };
        if self.graph_held_other.iter().any(same) {
            return false;
        }
        let used = self.needed_by_graphs(&what);
        if used {
            self.graph_held_other.push(what);
        }
        used
    }

    /// VMM reservations its graphs hold: they count toward its VMM entries (vmm.rs).
    pub(super) fn held_reservations(&self) -> usize {
        self.graph_held_other
            .iter()
            .filter(|h| matches!(h, HeldForGraphs::Reservation(..)))
            .count()
    }

    /// Arrays its graphs hold: they count toward its arrays (arrays.rs).
    pub(super) fn held_arrays(&self) -> usize {
        self.graph_held_other
            .iter()
            .filter(|h| matches!(h, HeldForGraphs::Array(..)))
            .count()
    }

    /// Holds pinned range `r`, being unregistered, while one of the client's executable
    /// graphs copies to or from it (each release held is its own: it is done once);
    /// Err(r) when none does, for the caller to release now.
    pub(crate) fn hold_pinned_for_graphs(
        &mut self,
        r: super::PinnedRelease,
    ) -> Result<(), super::PinnedRelease> {
        if self.used_by_graphs((r.addr, r.len)) {
            self.graph_held_other.push(HeldForGraphs::Pinned(r));
            Ok(())
        } else {
            Err(r)
        }
    }

    /// The ranges `graph` uses, its conditional nodes' bodies included: the server knows
    /// the bodies it made, where the driver cannot list them (cuGraphNodeGetParams is
    /// newer than CUDA 13.0), and a body's memset replays as any other.
    /// So are the bodies of graphs it holds copies of (a clone, a child node: CondState::reach).
    fn graph_ranges(&self, ctx: &WorkerCtx, graph: u64) -> crate::gpu::GpuResult<Vec<(u64, u64)>> {
        let mut ranges = ctx.gpu.graph_memory_ranges(graph)?;
        let (bodies, inherited) = self.cond.reach(graph);
        for body in bodies {
            ranges.extend(ctx.gpu.graph_memory_ranges(body)?);
        }
        ranges.extend(inherited);
        ranges.sort_unstable();
        ranges.dedup();
        Ok(ranges)
    }

    /// What a copy of `graph` (a clone, or a child node) inherits beyond the nodes the
    /// driver lists: the ranges its bodies and what it inherited use now; None if it has
    /// none (nothing to record).
    pub(super) fn copied_ranges(
        &self,
        ctx: &WorkerCtx,
        graph: u64,
    ) -> crate::gpu::GpuResult<Option<Vec<(u64, u64)>>> {
        let (bodies, mut ranges) = self.cond.reach(graph);
        if bodies.is_empty() && ranges.is_empty() {
            return Ok(None);
        }
        for body in bodies {
            ranges.extend(ctx.gpu.graph_memory_ranges(body)?);
        }
        Ok(Some(ranges))
    }

    /// The ranges `graph`'s memset and memcpy nodes use, read once for its instantiation
    /// or update: None (said in the log) where one is no longer the client's, since a
    /// graph captured over a block freed since would write whoever has it now, or where
    /// they cannot be read, since such a graph could write anything at every replay.
    pub(super) fn owned_graph_ranges(
        &mut self,
        ctx: &mut WorkerCtx,
        graph: u64,
    ) -> Option<Vec<Range>> {
        let ranges = match self.graph_ranges(ctx, graph) {
            Ok(r) => r,
            Err(e) => {
                self.log_refusal(format_args!(
                    "the memory a graph uses could not be read (CUDA error {}): not instantiated",
                    e.0
                ));
                return None;
            }
        };
        if let Some(&(a, n)) = ranges.iter().find(|&&(a, n)| !self.owns_range(a, n)) {
            self.log_refusal(format_args!(
                "a graph's memset or memcpy uses [{a:#x}, +{n}), no longer the client's: not instantiated"
            ));
            return None;
        }
        Some(ranges)
    }

    /// Executable graph `id`, instantiated from (or updated to) a graph, uses `ranges`
    /// ([`Session::owned_graph_ranges`]).
    pub(super) fn note_exec_ranges(&mut self, ctx: &mut WorkerCtx, id: u32, ranges: Vec<Range>) {
        self.note_reach(ctx, id, Some(&ranges));
        self.exec_ranges.insert(id, ranges);
        self.release_graph_held(ctx);
    }

    /// A graph, or executable graph `exec`, is gone: what it alone held goes back.
    pub(super) fn graph_gone(&mut self, ctx: &mut WorkerCtx, exec: Option<u32>) {
        let had_ranges = exec.is_some_and(|id| self.exec_ranges.remove(&id).is_some());
        if let Some(id) = exec.filter(|_| had_ranges) {
            self.note_reach(ctx, id, None);
        }
        if had_ranges || !self.graph_held_other.is_empty() {
            self.release_graph_held(ctx);
        }
    }

    /// Executable graph `id` now uses `ranges` (None: it is gone). The part of them in VMM
    /// memory another GPU's session maps goes into the client's books every GPU sees
    /// (ClientShared::graph_reach): a reservation freed there is held while it is used.
    /// Reservations held so that no graph uses any more go, once the client's work on every
    /// GPU is done (the graph that used them ran on this one).
    fn note_reach(&mut self, ctx: &mut WorkerCtx, id: u32, ranges: Option<&[Range]>) {
        if !self.client.vmm_peer.load(Ordering::SeqCst) {
            // Never given another GPU access: no graph reaches such memory.
            return;
        }
        let reached: Vec<Range> = ranges
            .unwrap_or_default()
            .iter()
            .copied()
            .filter(|&(a, n)| {
                !self.vmm.mapped(a, n)
                    && self
                        .client
                        .vmm_reaches(self.dev, a, n, self.consumer.position())
            })
            .collect();
        let free = {
            let mut r = self
                .client
                .graph_reach
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match reached.is_empty() {
                true => r.uses.remove(&(self.dev, id)),
                false => r.uses.insert((self.dev, id), reached),
            };
            r.unused()
        };
        if !free.is_empty() {
            let rel = Release {
                vmm: VmmRelease {
                    reservations: free,
                    ..Default::default()
                },
                ..Default::default()
            };
            ctx.release_everywhere(self, rel);
        }
    }

    /// Whether a graph of the client's on another GPU uses a byte of reservation `r`,
    /// being freed here: then it is held in the client's books until none does.
    pub(super) fn hold_for_other_gpus(&mut self, r: Range) -> bool {
        if !self.client.vmm_peer.load(Ordering::SeqCst) {
            return false;
        }
        let mut reach = self
            .client
            .graph_reach
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let used = reach.used(r);
        if used {
            reach.held.push(r);
        }
        used
    }

    /// The session goes: its graphs use nothing now; the reservations held that no other
    /// GPU's graph uses, for its last release.
    pub(super) fn take_reach_held(&mut self) -> Vec<Range> {
        if !self.client.vmm_peer.load(Ordering::SeqCst) {
            return Vec::new();
        }
        let mut r = self
            .client
            .graph_reach
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let dev = self.dev;
        r.uses.retain(|&(d, _), _| d != dev);
        r.unused()
    }

    /// Whether the block `[ptr, ptr+len)` being freed is still used by one of the client's
    /// executable graphs: then it is held here instead of released.
    pub(super) fn hold_for_graphs(&mut self, ptr: u64, len: u64) -> bool {
        let used = self.used_by_graphs((ptr, len));
        if used {
            self.graph_held.push((ptr, len));
        }
        used
    }

    /// Releases the held blocks, modules and openings no executable graph uses any more.
    fn release_graph_held(&mut self, ctx: &mut WorkerCtx) {
        let (still, free): (Vec<HeldForGraphs>, Vec<HeldForGraphs>) =
            std::mem::take(&mut self.graph_held_other)
                .into_iter()
                .partition(|h| self.needed_by_graphs(h));
        self.graph_held_other = still;
        for h in free {
            match h {
                HeldForGraphs::Module(handle, shared, charged) => {
                    self.give_back_module(ctx, handle, shared, charged)
                }
                HeldForGraphs::IpcClose(ptr, _) => ctx.release_later(
                    self,
                    Release {
                        ipc_close: vec![ptr],
                        ..Default::default()
                    },
                ),
                HeldForGraphs::Pinned(r) => ctx.release_later(
                    self,
                    Release {
                        pinned: vec![r],
                        ..Default::default()
                    },
                ),
                HeldForGraphs::Reservation(at, n) => ctx.release_later(
                    self,
                    Release {
                        vmm: VmmRelease {
                            reservations: vec![(at, n)],
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                ),
                HeldForGraphs::Array(h, n, mip) => {
                    let mut rel = Release::default();
                    match mip {
                        true => rel.arrays.mipmaps.push((h, n)),
                        false => rel.arrays.arrays.push((h, n)),
                    }
                    ctx.release_later(self, rel)
                }
            }
        }
        let ranges = &self.exec_ranges;
        let (still, free): (Vec<Range>, Vec<Range>) = std::mem::take(&mut self.graph_held)
            .into_iter()
            .partition(|&b| ranges.values().flatten().any(|&r| overlap(r, b)));
        self.graph_held = still;
        if !free.is_empty() {
            // An exported block goes through the IPC books, as its free would have.
            let (ipc, allocs): (Vec<Range>, Vec<Range>) = {
                let reg = ctx.shared.ipc.lock().unwrap_or_else(|e| e.into_inner());
                free.into_iter()
                    .partition(|&(p, _)| reg.exported(p, self.client.id))
            };
            ctx.release_later(
                self,
                Release {
                    allocs,
                    ipc,
                    ..Default::default()
                },
            );
        }
    }

    /// The blocks held for graphs, for the client's last release.
    pub(super) fn take_graph_held(&mut self) -> Vec<Range> {
        std::mem::take(&mut self.graph_held)
    }

    /// The modules (handle, shared, bytes charged), IPC openings and VMM reservations held
    /// for graphs, for the client's last release.
    pub(super) fn take_graph_held_other(&mut self) -> HeldAtLast {
        let mut last = HeldAtLast::default();
        for h in std::mem::take(&mut self.graph_held_other) {
            match h {
                HeldForGraphs::Module(handle, shared, charged) => {
                    last.modules.push((handle, shared, charged))
                }
                HeldForGraphs::IpcClose(ptr, _) => last.closes.push(ptr),
                HeldForGraphs::Reservation(at, n) => last.reservations.push((at, n)),
                HeldForGraphs::Pinned(r) => last.pinned.push(r),
                HeldForGraphs::Array(h, n, false) => last.arrays.push((h, n)),
                HeldForGraphs::Array(h, n, true) => last.mipmaps.push((h, n)),
            }
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use super::overlap;

    #[test]
    fn ranges_overlap_only_when_they_share_a_byte() {
        assert!(overlap((100, 10), (105, 1)));
        assert!(overlap((100, 10), (90, 11)));
        assert!(!overlap((100, 10), (110, 5)), "adjacent");
        assert!(!overlap((100, 10), (90, 10)), "adjacent below");
        assert!(!overlap((100, 0), (100, 10)), "empty");
        assert!(overlap((u64::MAX - 4, 10), (u64::MAX - 1, 1)), "saturating");
    }
}
