//! Profiling twins of a client's executable graphs (docs/design.md 12b, design G). A
//! profiler in the client times each kernel of a graph replay; the nodes are the
//! server's, so the server builds, at the first traced launch, a twin of the executable
//! graph with an event-record node before and after each kernel node, and each traced
//! launch points those nodes at events of the client's own before launching the twin.
//!
//! The twin is made from the graph the executable graph was instantiated from, which
//! PyTorch destroys right after instantiating: a graph that executable graphs were made
//! from is kept (out of the client's reach) until the last of them goes. An update of an
//! executable graph, or a change to its graph, makes its twin stale: the next traced
//! launch builds it again, or answers that it cannot.

use super::*;
use crate::gpu::ProfileTwin;
use omps_ring::wire::graph;
use std::collections::HashMap;

#[derive(Default)]
pub(crate) struct GraphProfiles {
    /// Executable graph -> the graph it was made from.
    sources: HashMap<u32, u32>,
    /// Graphs the client destroyed while executable graphs made from them live.
    kept: HashMap<u32, u64>,
    /// Executable graph -> its twin (None: it could not be made; asked again after a
    /// change).
    twins: HashMap<u32, Option<ProfileTwin>>,
}

impl GraphProfiles {
    /// Everything held, for the release when the client goes.
    pub(crate) fn drain_into(&mut self, rel: &mut Release) {
        rel.graphs.extend(self.kept.drain().map(|(_, g)| g));
        for twin in self.twins.drain().filter_map(|(_, t)| t) {
            twin_into(twin, rel);
        }
        self.sources.clear();
    }
}

fn twin_into(twin: ProfileTwin, rel: &mut Release) {
    rel.execs.push(twin.exec);
    rel.graphs.push(twin.graph);
    if twin.placeholder != 0 {
        rel.events.push(twin.placeholder);
    }
}

impl Session {
    /// Executable graph `exec` was made from graph `graph`.
    pub(super) fn note_exec_source(&mut self, exec: u32, graph: u32) {
        self.profiles.sources.insert(exec, graph);
    }

    /// The client destroys graph `id` (driver handle `handle`): true when it is kept
    /// because executable graphs made from it live.
    pub(super) fn keep_destroyed_graph(&mut self, id: u32, handle: u64) -> bool {
        if self.profiles.sources.values().any(|&g| g == id) {
            self.profiles.kept.insert(id, handle);
            return true;
        }
        false
    }

    /// Executable graph `exec` is gone (or changed, `gone` false): its twin goes, and,
    /// when gone, the kept graph it was the last user of.
    pub(super) fn exec_profile_gone(&mut self, ctx: &mut WorkerCtx, exec: u32, gone: bool) {
        let mut rel = Release::default();
        if let Some(Some(twin)) = self.profiles.twins.remove(&exec) {
            twin_into(twin, &mut rel);
        }
        if gone {
            if let Some(g) = self.profiles.sources.remove(&exec) {
                if !self.profiles.sources.values().any(|&x| x == g) {
                    if let Some(h) = self.profiles.kept.remove(&g) {
                        rel.graphs.push(h);
                    }
                }
            }
        }
        if !rel.graphs.is_empty() || !rel.execs.is_empty() {
            // A twin may still run: freed once the client's work is done.
            ctx.release_later(self, rel);
        }
    }

    /// Graph `graph` changes (nodes added or cleared): executable graphs made from it no
    /// longer match it, so they lose their source (and twin), and a kept graph with no
    /// executable graph left goes.
    fn graph_profile_changed(&mut self, ctx: &mut WorkerCtx, graph: u32) {
        let stale: Vec<u32> = (self.profiles.sources.iter())
            .filter(|&(_, &g)| g == graph)
            .map(|(&e, _)| e)
            .collect();
        for e in stale {
            self.exec_profile_gone(ctx, e, true);
        }
    }

    /// A conditional-graph op (wire::graph) is about to run: what it changes.
    pub(super) fn graph_cond_profile(&mut self, ctx: &mut WorkerCtx, c: &wire::GraphCond) {
        match c.kind {
            // The executable graph takes the other graph's parameters: that graph is its
            // source from now on.
            graph::EXEC_UPDATE => {
                if let Ok(e) = u32::try_from(c.handle) {
                    if self.execs.contains_key(&e) && self.graphs.contains_key(&c.graph) {
                        self.exec_profile_gone(ctx, e, true);
                        self.note_exec_source(e, c.graph);
                    }
                }
            }
            graph::CAPTURE_TO | graph::COND_NODE | graph::COND_CLEAR | graph::CHILD_NODE => {
                self.graph_profile_changed(ctx, c.graph)
            }
            _ => {}
        }
    }

    /// The driver handle of the graph executable graph `exec` was made from.
    fn exec_source(&self, exec: u32) -> Option<u64> {
        let g = *self.profiles.sources.get(&exec)?;
        self.graphs
            .get(&g)
            .or_else(|| self.profiles.kept.get(&g))
            .copied()
    }

    /// The twin of `exec`, built at first need: Err(CUresult) when it cannot be.
    fn twin(&mut self, ctx: &mut WorkerCtx, exec: u32) -> Result<&ProfileTwin, i32> {
        if !self.profiles.twins.contains_key(&exec) {
            let built = match self.exec_source(exec) {
                Some(g) => ctx.gpu.graph_profile_twin(g).ok(),
                None => None,
            };
            self.profiles.twins.insert(exec, built);
        }
        match self.profiles.twins.get(&exec) {
            Some(Some(t)) => Ok(t),
            _ => Err(code::NOT_SUPPORTED),
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
                let funcs: HashMap<u64, u32> = self
                    .functions
                    .iter()
                    .map(|(&id, f)| (f.handle, id))
                    .collect();
                let reply = match self.twin(ctx, q.exec) {
                    Err(e) => return self.complete(q.call, e, &[]),
                    Ok(t) => {
                        let first = (q.first as usize).min(t.nodes.len());
                        let page = &t.nodes[first..];
                        let page = &page[..page.len().min(wire::PROFILED_PER_REPLY)];
                        let mut out = bytemuck::bytes_of(&wire::ProfiledNodes {
                            total: t.nodes.len() as u32,
                            count: page.len() as u32,
                        })
                        .to_vec();
                        for n in page {
                            out.extend_from_slice(bytemuck::bytes_of(&wire::ProfiledNode {
                                func: funcs.get(&n.func).copied().unwrap_or(0),
                                shared: n.shared,
                                grid: n.grid,
                                block: n.block,
                            }));
                        }
                        out
                    }
                };
                self.complete(q.call, 0, &reply)?;
            }
            Op::GraphLaunchProfiled => {
                let l = rec::<wire::GraphLaunchProfiled>(p);
                if !self.execs.contains_key(&l.exec) {
                    return bad(format!("launching unknown executable graph {}", l.exec));
                }
                let n = l.count as usize;
                if tail.len() != n * 8 {
                    return bad(format!(
                        "profiled launch: {n} nodes in {} bytes",
                        tail.len()
                    ));
                }
                let mut events = Vec::with_capacity(2 * n);
                for id in tail.chunks_exact(4) {
                    events.push(self.event(u32::from_le_bytes(id.try_into().expect("4")))?);
                }
                let Some(s) = self.stream(ctx, l.stream)? else {
                    return Ok(());
                };
                let gpu = ctx.gpu.clone();
                let twin = match self.twin(ctx, l.exec) {
                    Ok(t) if t.nodes.len() == n => t,
                    // Stale since the client asked (its graph changed): the launch runs
                    // untimed, as the program asked it to run.
                    _ => {
                        let e = self.execs[&l.exec];
                        self.client.launches.fetch_add(1, Ordering::Relaxed);
                        if let Err(err) = gpu.graph_launch(e, s) {
                            self.note_error(err);
                        }
                        return Ok(());
                    }
                };
                let mut r = Ok(());
                for (node, pair) in twin.nodes.iter().zip(events.chunks_exact(2)) {
                    r = r
                        .and_then(|()| gpu.graph_exec_set_event(twin.exec, node.start, pair[0]))
                        .and_then(|()| gpu.graph_exec_set_event(twin.exec, node.end, pair[1]));
                }
                let exec = twin.exec;
                self.client.launches.fetch_add(1, Ordering::Relaxed);
                if let Err(err) = r.and_then(|()| gpu.graph_launch(exec, s)) {
                    self.note_error(err);
                }
            }
            _ => unreachable!("dispatched to graph profiling: {op:?}"),
        }
        Ok(())
    }
}
