//! Conditional graph nodes, for graphs the shim builds (omps-shim/src/api/graph_build).
//!
//! A conditional handle belongs to a driver graph, and a program bakes its value into
//! kernel arguments before instantiating. So a built graph that makes handles gets a
//! graph of its own here (its home, COND_HOME), which makes them (COND_HANDLE). The shim
//! instantiates such a graph by capturing into its home (CAPTURE_TO); at a conditional
//! node's place in the capture the server adds the node (COND_NODE) and gives the driver's
//! body graphs ids, and the shim captures each body into its body graph (CAPTURE_TO
//! again). After instantiation the home loses its nodes (COND_CLEAR) and keeps its
//! handles. The driver instantiates a graph with conditional nodes only once; new
//! parameters for its executable graph are captured into the home again and given to it
//! by an update (EXEC_UPDATE).
//!
//! A client names only its own homes, handles and bodies; a body's id dies with the
//! nodes of its home. A home being captured into is neither cleared nor destroyed.

use super::kinds::cond::MAX_HANDLES;
use super::*;
use omps_ring::wire::graph;

impl Session {
    pub(super) fn handle_graph_cond(
        &mut self,
        ctx: &mut WorkerCtx,
        c: &wire::GraphCond,
    ) -> Result<(), Malformed> {
        let gpu = ctx.gpu.clone();
        let r: Result<u64, CuError> = match c.kind {
            graph::COND_HOME => gpu.graph_create().and_then(|g| {
                let id = match self.graph_id() {
                    Ok(id) => id,
                    Err(e) => {
                        let _ = gpu.graph_destroy(g);
                        return Err(e);
                    }
                };
                self.graphs.insert(id, g);
                self.cond.homes.insert(g);
                Ok(id as u64)
            }),
            graph::COND_HANDLE => match self.graphs.get(&c.graph) {
                Some(&g) if self.cond.homes.contains(&g) => self.cond_handle(&*gpu, g, c),
                _ => Err(CuError(code::INVALID_VALUE)),
            },
            graph::COND_HANDLE_CAPTURE => {
                match self
                    .streams
                    .get(&c.stream)
                    .filter(|s| s.capturing)
                    .and_then(|s| s.pool)
                {
                    Some(s) => gpu.capture_graph(s).and_then(|g| {
                        // A capture into a body (nested conditionals) keeps its root's
                        // books: bodies and handles all name the outermost graph.
                        let root = self.cond.home_of(g).unwrap_or(g);
                        let h = self.cond_handle(&*gpu, g, c)?;
                        self.cond.handles.insert(h, root);
                        self.cond.homes.insert(root);
                        Ok(h)
                    }),
                    None => Err(CuError(code::INVALID_VALUE)),
                }
            }
            graph::COND_NODE => self.cond_node(ctx, c),
            graph::CAPTURE_TO => return self.capture_to(ctx, c),
            graph::COND_CLEAR => match self.graphs.get(&c.graph) {
                Some(&g) if self.cond.homes.contains(&g) => {
                    if self.cond.being_captured(g) {
                        Err(CuError(code::ILLEGAL_STATE))
                    } else {
                        self.cond.cleared(g);
                        gpu.graph_clear(g).map(|()| 0)
                    }
                }
                _ => Err(CuError(code::INVALID_VALUE)),
            },
            graph::EXEC_UPDATE => match (
                self.graphs.get(&c.graph).copied(),
                u32::try_from(c.handle)
                    .ok()
                    .and_then(|e| self.execs.get(&e))
                    .copied(),
            ) {
                (Some(g), Some(e)) => match self.owned_graph_ranges(ctx, g) {
                    None => Err(CuError(code::INVALID_VALUE)),
                    Some(ranges) => {
                        let r = gpu.graph_exec_update(e, g).map(|()| 0);
                        if r.is_ok() {
                            // The update's memory replaces what the executable graph used,
                            // and its graph is the one a profiling twin is made from.
                            let exec = c.handle as u32;
                            self.note_exec_ranges(ctx, exec, ranges);
                            self.update_exec_source(ctx, exec, c.graph);
                        }
                        r
                    }
                },
                _ => Err(CuError(code::INVALID_VALUE)),
            },
            graph::GRAPH_CLONE => match self.graphs.get(&c.graph) {
                Some(&g) => self
                    .room_for_graphs(1)
                    .and_then(|()| self.copied_ranges(ctx, g))
                    .and_then(|inherited| {
                        self.copy_within_limits(g, &inherited)?;
                        let copy = gpu.graph_clone(g)?;
                        let id = self.new_id().inspect_err(|_| {
                            let _ = gpu.graph_destroy(copy);
                        })?;
                        self.graphs.insert(id, copy);
                        // Its bodies are copies of g's, which the server knows only as g's.
                        if let Some(r) = inherited {
                            self.cond.inherit(copy, g, r);
                        }
                        Ok(id as u64)
                    }),
                None => Err(CuError(code::INVALID_VALUE)),
            },
            graph::CHILD_NODE => match (
                self.graphs.get(&c.graph),
                self.streams
                    .get(&c.stream)
                    .filter(|s| s.capturing)
                    .and_then(|s| s.pool),
            ) {
                // A graph being captured into cannot be its own child.
                (Some(&g), Some(s)) if !self.cond.capture_into.values().any(|&t| t == g) => {
                    // The capture's graph (a home's, a body's or a plain one) holds a copy
                    // of g's bodies from now on, as a clone does.
                    self.copied_ranges(ctx, g).and_then(|inherited| {
                        self.copy_within_limits(g, &inherited)?;
                        let into = match inherited {
                            Some(_) => Some(gpu.capture_graph(s)?),
                            None => None,
                        };
                        gpu.capture_child(s, g)?;
                        if let (Some(r), Some(into)) = (inherited, into) {
                            self.cond.inherit(into, g, r);
                        }
                        Ok(0)
                    })
                }
                _ => Err(CuError(code::INVALID_VALUE)),
            },
            k => return bad(format!("unknown conditional-graph op {k}")),
        };
        self.complete_pod(c.call, r.map(|value| wire::U64Reply { value }))
    }

    /// Refuses a copy of `g` (a clone, a child node) keeping `inherited` that would make a
    /// chain of copies of graphs with conditional bodies deeper than MAX_COPY_DEPTH, or the
    /// ranges copies keep more than MAX_INHERITED_RANGES: CUDA_ERROR_NOT_SUPPORTED, said in
    /// the log (kinds/cond.rs says why this code).
    fn copy_within_limits(
        &mut self,
        g: u64,
        inherited: &Option<Vec<(u64, u64)>>,
    ) -> Result<(), CuError> {
        let adding = inherited.as_ref().map_or(0, Vec::len);
        if inherited.is_none() || self.cond.may_copy(g, adding) {
            return Ok(());
        }
        self.log_refusal(format_args!(
            "graph copy refused: copies of graphs with conditional nodes may go {} levels \
             deep and keep {} ranges in all",
            super::kinds::cond::MAX_COPY_DEPTH,
            super::kinds::cond::MAX_INHERITED_RANGES
        ));
        Err(CuError(code::NOT_SUPPORTED))
    }

    /// A conditional handle of home `g`.
    fn cond_handle(
        &mut self,
        gpu: &dyn crate::gpu::Gpu,
        g: u64,
        c: &wire::GraphCond,
    ) -> Result<u64, CuError> {
        if self.cond.handles.len() >= MAX_HANDLES {
            return Err(CuError(code::OUT_OF_MEMORY));
        }
        gpu.cond_handle(g, c.value, c.flags).inspect(|&h| {
            self.cond.handles.insert(h, g);
        })
    }

    /// A new id for a graph, body or executable graph of this client.
    /// An id for a new graph, executable graph or conditional body, within
    /// OMPS_MAX_GRAPHS of them for the client on this GPU.
    pub(super) fn graph_id(&mut self) -> Result<u32, CuError> {
        self.room_for_graphs(1)?;
        self.new_id()
    }

    /// Room for `n` more graphs within what the client was granted (OMPS_MAX_GRAPHS, or
    /// less where the server-wide total is shared out: crate::client::account::Grant).
    pub(super) fn room_for_graphs(&self, n: usize) -> Result<(), CuError> {
        let held =
            self.graphs.len() + self.execs.len() + self.cond.bodies.len() + self.profiles.held();
        match held.saturating_add(n) > self.client.max_graphs() {
            true => Err(CuError(code::OUT_OF_MEMORY)),
            false => Ok(()),
        }
    }

    pub(super) fn new_id(&mut self) -> Result<u32, CuError> {
        let id = self.next_id;
        self.next_id = id.checked_add(1).ok_or(CuError(code::OUT_OF_MEMORY))?;
        Ok(id)
    }

    /// COND_NODE: the first body's id.
    fn cond_node(&mut self, ctx: &mut WorkerCtx, c: &wire::GraphCond) -> Result<u64, CuError> {
        let (Some(&home), Some(s)) = (
            self.cond.handles.get(&c.handle),
            self.streams
                .get(&c.stream)
                .filter(|s| s.capturing)
                .and_then(|s| s.pool),
        ) else {
            return Err(CuError(code::INVALID_VALUE));
        };
        // CU_GRAPH_COND_TYPE_IF has one body or two (an else), WHILE one, SWITCH up to the
        // bound: the server reads as many bodies as it says, so the driver is not trusted
        // to refuse a count its kind cannot have.
        const IF: u32 = 0;
        const WHILE: u32 = 1;
        let fits = match c.value {
            IF => (1..=2).contains(&c.size),
            WHILE => c.size == 1,
            2 => (1..=graph::MAX_BODIES).contains(&c.size),
            _ => false,
        };
        if !fits {
            return Err(CuError(code::INVALID_VALUE));
        }
        self.room_for_graphs(c.size as usize)?;
        let first = self.next_id;
        if first.checked_add(c.size).is_none() {
            return Err(CuError(code::OUT_OF_MEMORY));
        }
        let cond = &self.cond;
        let bodies = ctx
            .gpu
            .capture_conditional(s, c.handle, c.value, c.size, &|g| {
                cond.home_of(g) == Some(home)
            })?;
        for (k, b) in bodies.into_iter().enumerate() {
            self.cond.bodies.insert(first + k as u32, (b, home));
        }
        self.next_id = first + c.size;
        Ok(first as u64)
    }

    /// CAPTURE_TO: begins a capture into a home or body, on a work stream of its own.
    fn capture_to(&mut self, ctx: &mut WorkerCtx, c: &wire::GraphCond) -> Result<(), Malformed> {
        let target = match self.graphs.get(&c.graph) {
            Some(&g) if self.cond.homes.contains(&g) => Some(g),
            _ => self.cond.bodies.get(&c.graph).map(|&(b, _)| b),
        };
        let code = match target {
            None => code::INVALID_VALUE,
            // One capture at a time goes into a graph.
            Some(g) if self.cond.capture_into.values().any(|&t| t == g) => code::ILLEGAL_STATE,
            Some(g) => self.begin_capture_into(ctx, c.stream, g)?,
        };
        self.complete(c.call, code, &[])
    }

    fn begin_capture_into(
        &mut self,
        ctx: &mut WorkerCtx,
        stream: u32,
        g: u64,
    ) -> Result<i32, Malformed> {
        let r = self.begin_capture_with(ctx, stream, |gpu, s| gpu.capture_begin_to(s, g))?;
        if r == code::SUCCESS {
            self.cond.capture_into.insert(stream, g);
        }
        Ok(r)
    }
}
