//! Profiling twins of a client's executable graphs (docs/design.md 12b, design G). A
//! profiler in the client times each kernel of a graph replay; the nodes are the
//! server's, so the server builds, at the first traced launch, a twin of the executable
//! graph with an event-record node before and after each kernel node, and each traced
//! launch points those nodes at events of the client's own before launching the twin.
//!
//! The twin is made from the graph the executable graph was instantiated from, which
//! PyTorch destroys right after instantiating: a graph that executable graphs were made
//! from is kept out of the client's reach until the last of them goes (not counted in its
//! OMPS_MAX_GRAPHS: there are at most as many as its executable graphs, which count). A
//! successful update makes the update's graph the source; a change
//! to the source graph drops it. The twin and the original are two executable graphs,
//! which the driver does not order as it orders two launches of one: a launch of the one
//! after the other waits for it (an event per executable graph, recorded after each).

use super::profiles::{twin_into, Twin};
use super::*;
use crate::gpu::{TimedNode, TimedWork};
use omps_ring::wire::graph;
use std::collections::HashMap;

/// A timed node as the wire tells it (`func`: the client's id of a kernel's function).
fn profiled(node: &TimedNode, func: u32) -> wire::ProfiledNode {
    let mut p = wire::ProfiledNode {
        func,
        ..Default::default()
    };
    match node.work {
        TimedWork::Kernel {
            grid,
            block,
            shared,
            ..
        } => {
            p.grid = grid;
            p.block = block;
            p.shared = shared;
        }
        TimedWork::Memcpy { src, dst, bytes } => {
            p.kind = 1;
            p.src_type = src;
            p.dst_type = dst;
            p.bytes = bytes;
        }
        TimedWork::Memset { value, bytes } => {
            p.kind = 2;
            p.value = value;
            p.bytes = bytes;
        }
    }
    p
}

impl Session {
    /// Executable graph `exec` was made from (or updated to) graph `graph`.
    pub(super) fn note_exec_source(&mut self, exec: u32, graph: u32, flags: u64) {
        self.profiles.sources.insert(exec, (graph, flags));
    }

    /// Executable graph `exec` took graph `graph`'s parameters (a successful update):
    /// `graph` is its source from now on, and the graph it replaces goes if it was kept
    /// for it alone.
    pub(super) fn update_exec_source(&mut self, ctx: &mut WorkerCtx, exec: u32, graph: u32) {
        let Some((old, flags)) = self.profiles.sources.insert(exec, (graph, 0)) else {
            return;
        };
        self.profiles.sources.insert(exec, (graph, flags));
        let mut rel = Release::default();
        if !self.profiles.sources.values().any(|&(g, _)| g == old) {
            if let Some(h) = self.profiles.kept.remove(&old) {
                rel.graphs.push(h);
            }
        }
        self.release_if_any(ctx, rel);
    }

    /// The client destroys graph `id` (driver handle `handle`): true when it is kept
    /// because executable graphs made from it live.
    pub(super) fn keep_destroyed_graph(&mut self, id: u32, handle: u64) -> bool {
        if self.profiles.sources.values().any(|&(g, _)| g == id) {
            self.profiles.kept.insert(id, handle);
            return true;
        }
        false
    }

    /// Executable graph `exec`'s twin goes into `rel`; when `gone` (the executable graph
    /// is destroyed, or its source changed) its source and order event too, and the kept
    /// graph it was the last user of.
    pub(super) fn exec_profile_gone(&mut self, exec: u32, gone: bool, rel: &mut Release) {
        if let Some(Some(t)) = self.profiles.twins.remove(&exec) {
            twin_into(t.twin, rel);
        }
        if !gone {
            return;
        }
        if let Some((e, _)) = self.profiles.order.remove(&exec) {
            rel.events.push(e);
        }
        if let Some((g, _)) = self.profiles.sources.remove(&exec) {
            if !self.profiles.sources.values().any(|&(x, _)| x == g) {
                if let Some(h) = self.profiles.kept.remove(&g) {
                    rel.graphs.push(h);
                }
            }
        }
    }

    /// A conditional-graph op (wire::graph) is about to run: an update makes the
    /// executable graph's twin stale (its new source is noted once the update succeeds,
    /// conditional.rs); a capture into a graph or its clearing changes that graph, so
    /// executable graphs made from it lose it as their source.
    pub(super) fn graph_cond_profile(&mut self, ctx: &mut WorkerCtx, c: &wire::GraphCond) {
        let mut rel = Release::default();
        match c.kind {
            graph::EXEC_UPDATE => {
                if let Ok(e) = u32::try_from(c.handle) {
                    self.exec_profile_gone(e, false, &mut rel);
                }
            }
            graph::CAPTURE_TO | graph::COND_CLEAR => {
                let stale: Vec<u32> = (self.profiles.sources.iter())
                    .filter(|&(_, &(g, _))| g == c.graph)
                    .map(|(&e, _)| e)
                    .collect();
                for e in stale {
                    self.exec_profile_gone(e, true, &mut rel);
                }
            }
            _ => {}
        }
        self.release_if_any(ctx, rel);
    }

    /// Releases `rel` after the client's work, unless it holds nothing.
    pub(super) fn release_if_any(&mut self, ctx: &mut WorkerCtx, rel: Release) {
        if !rel.graphs.is_empty() || !rel.execs.is_empty() || !rel.events.is_empty() {
            // A twin may still run: freed once the client's work is done.
            ctx.release_later(self, rel);
        }
    }

    /// The twin of `exec`, built at first need: Err(CUresult) when it cannot be (no
    /// source, a graph a copy cannot stand in for, or no room in OMPS_MAX_GRAPHS).
    fn twin(&mut self, ctx: &mut WorkerCtx, exec: u32) -> Result<&Twin, i32> {
        if !self.profiles.twins.contains_key(&exec) {
            let source = self.profiles.sources.get(&exec).and_then(|&(g, flags)| {
                let h = self.graphs.get(&g).or_else(|| self.profiles.kept.get(&g))?;
                Some((*h, flags))
            });
            let built = match source {
                Some((g, flags)) if self.room_for_graphs(2).is_ok() => {
                    match ctx.gpu.graph_profile_twin(g, flags) {
                        Ok(t) => Some(t),
                        Err(e) => {
                            tracing::info!(
                                client = self.client.id,
                                "no profiling twin for graph exec {exec}: the copy failed ({})",
                                e.0
                            );
                            None
                        }
                    }
                }
                Some(_) => {
                    tracing::info!(
                        client = self.client.id,
                        "no profiling twin for graph exec {exec}: no room in OMPS_MAX_GRAPHS"
                    );
                    None
                }
                None => {
                    tracing::info!(
                        client = self.client.id,
                        "no profiling twin for graph exec {exec}: its source graph is gone"
                    );
                    None
                }
            };
            let built = built.map(|twin| {
                let by_handle: HashMap<u64, u32> = (self.functions.iter())
                    .map(|(&id, f)| (f.handle, id))
                    .collect();
                let funcs = (twin.nodes.iter())
                    .map(|n| match n.work {
                        TimedWork::Kernel { func, .. } => {
                            by_handle.get(&func).copied().unwrap_or(0)
                        }
                        _ => 0,
                    })
                    .collect();
                Twin { twin, funcs }
            });
            self.profiles.twins.insert(exec, built);
        }
        match self.profiles.twins.get(&exec) {
            Some(Some(t)) => Ok(t),
            _ => Err(code::NOT_SUPPORTED),
        }
    }

    /// Before launching executable graph `exec` (`twin`: its twin) on work stream `s`:
    /// waits for the last launch of the other one. After: `recorded` below.
    fn order_before(&mut self, ctx: &mut WorkerCtx, exec: u32, twin: bool, s: usize) {
        let entry = match self.profiles.order.get(&exec) {
            Some(&e) => e,
            None => match ctx.gpu.event_create(0) {
                Ok(ev) => {
                    self.profiles.order.insert(exec, (ev, twin));
                    (ev, twin)
                }
                Err(_) => return,
            },
        };
        if entry.1 != twin {
            if let Err(err) = ctx.gpu.stream_wait_event(s, entry.0) {
                self.note_error(err);
            }
        }
    }

    fn order_after(&mut self, ctx: &mut WorkerCtx, exec: u32, twin: bool, s: usize) {
        if let Some(e) = self.profiles.order.get_mut(&exec) {
            e.1 = twin;
            if let Err(err) = ctx.gpu.event_record(e.0, s) {
                self.note_error(err);
            }
        }
    }

    /// Launches the client's executable graph `exec` (driver handle `e`) on work stream
    /// `s` of client stream `stream`, after its twin's last launch where it has one.
    pub(super) fn launch_original(
        &mut self,
        ctx: &mut WorkerCtx,
        exec: u32,
        e: u64,
        s: usize,
        stream: u32,
    ) {
        let ordered = self.profiles.order.contains_key(&exec) && !self.stream_capturing(stream);
        if ordered {
            self.order_before(ctx, exec, false, s);
        }
        self.client.launches.fetch_add(1, Ordering::Relaxed);
        if let Err(err) = ctx.gpu.graph_launch(e, s) {
            self.note_error(err);
        }
        if ordered {
            self.order_after(ctx, exec, false, s);
        }
    }

    pub(super) fn handle_graph_profile(
        &mut self,
        ctx: &mut WorkerCtx,
        op: Op,
        p: &[u8],
        tail: &[u8],
    ) -> Result<(), Malformed> {
        match op {
            Op::GraphProfileInfo => {
                fixed_only(tail, "graph profile info")?;
                let q = rec::<wire::GraphProfileInfo>(p);
                if !self.execs.contains_key(&q.exec) {
                    return bad(format!("profiling unknown executable graph {}", q.exec));
                }
                let reply = match self.twin(ctx, q.exec) {
                    Err(e) => return self.complete(q.call, e, &[]),
                    Ok(t) => {
                        let first = (q.first as usize).min(t.twin.nodes.len());
                        let n = (t.twin.nodes.len() - first).min(wire::PROFILED_PER_REPLY);
                        let mut out = bytemuck::bytes_of(&wire::ProfiledNodes {
                            total: t.twin.nodes.len() as u32,
                            count: n as u32,
                        })
                        .to_vec();
                        for (node, &func) in (t.twin.nodes.iter().zip(&t.funcs)).skip(first).take(n)
                        {
                            out.extend_from_slice(bytemuck::bytes_of(&profiled(node, func)));
                        }
                        out
                    }
                };
                self.complete(q.call, 0, &reply)?;
            }
            Op::GraphLaunchProfiled => {
                let l = rec::<wire::GraphLaunchProfiled>(p);
                let Some(&e) = self.execs.get(&l.exec) else {
                    return bad(format!("launching unknown executable graph {}", l.exec));
                };
                let n = l.count as usize;
                if tail.len() != n.saturating_mul(8) {
                    return bad(format!(
                        "profiled launch: {n} nodes in {} bytes",
                        tail.len()
                    ));
                }
                let mut events = Vec::with_capacity(tail.len() / 4);
                for id in tail.chunks_exact(4) {
                    events.push(self.event(u32::from_le_bytes(id.try_into().expect("4")))?);
                }
                let Some(s) = self.stream(ctx, l.stream)? else {
                    return Ok(());
                };
                let gpu = ctx.gpu.clone();
                // A launch into a capture becomes a node of it: no twin there.
                let twin = match self.stream_capturing(l.stream) {
                    true => None,
                    false => match self.twin(ctx, l.exec) {
                        Ok(t) if t.twin.nodes.len() == n => {
                            Some((t.twin.exec, t.twin.nodes.clone()))
                        }
                        _ => None,
                    },
                };
                let set = twin.as_ref().map(|(x, nodes)| {
                    nodes
                        .iter()
                        .zip(events.chunks_exact(2))
                        .try_for_each(|(node, pair)| {
                            gpu.graph_exec_set_event(*x, node.start, pair[0])?;
                            gpu.graph_exec_set_event(*x, node.end, pair[1])
                        })
                });
                match (twin, set) {
                    (Some((x, _)), Some(Ok(()))) => {
                        self.order_before(ctx, l.exec, true, s);
                        self.client.launches.fetch_add(1, Ordering::Relaxed);
                        if let Err(err) = gpu.graph_launch(x, s) {
                            self.note_error(err);
                        }
                        self.order_after(ctx, l.exec, true, s);
                    }
                    // Untimed (stale twin, none to be had, a capture): the program's launch
                    // runs as it asked, and each pair is recorded end first, so that the
                    // profiler drops it (a negative length) instead of reading old times.
                    _ => {
                        if !self.stream_capturing(l.stream) {
                            for pair in events.chunks_exact(2) {
                                let _ = gpu.event_record(pair[1], s);
                                let _ = gpu.event_record(pair[0], s);
                            }
                        }
                        self.launch_original(ctx, l.exec, e, s, l.stream);
                    }
                }
            }
            _ => unreachable!("dispatched to graph profiling: {op:?}"),
        }
        Ok(())
    }
}
