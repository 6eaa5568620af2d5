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

use super::*;
use omps_ring::wire::graph;

/// A client's conditional-node books.
#[derive(Default)]
pub(super) struct CondState {
    /// Home graphs (the driver's handles): those made for built graphs, and the graphs
    /// of captures that made handles.
    homes: std::collections::HashSet<u64>,
    /// Conditional handles -> the home that made them.
    handles: HashMap<u64, u64>,
    /// Body ids -> (the driver's body graph, the home it lies in).
    bodies: HashMap<u32, (u64, u64)>,
    /// Client streams capturing into a home or body -> that graph.
    capture_into: HashMap<u32, u64>,
    /// Graphs (the driver's handles) that are copies of graphs with bodies, or took such
    /// graphs as child nodes: the driver copies the bodies, which the server then does not
    /// know by id (see [`Inherited`]); and graphs with host nodes, whose words it lists.
    inherited: HashMap<u64, Inherited>,
}

/// What a copy of a graph (GRAPH_CLONE) or a graph that took one as a child node
/// (CHILD_NODE) replays that the driver may not list: its sources' conditional bodies, whose
/// copies it holds (CUDA 13.0 cannot read a conditional node's bodies).
#[derive(Default)]
struct Inherited {
    /// The graphs copied in, while they live: their bodies are read again at each
    /// instantiation (what they know included, transitively).
    from: Vec<u64>,
    /// The ranges their bodies (and what they knew) used when copied, kept for after the
    /// sources go: the copy's bodies are its own and outlive them.
    ranges: Vec<(u64, u64)>,
    /// The words in the client's page-locked memory its own host nodes (HostNodeAt)
    /// write and wait on at every replay: batch memory operations, which the driver's
    /// ranges leave out.
    words: Vec<u64>,
}

/// More handles than any program makes; a client asking beyond gets OUT_OF_MEMORY.
const MAX_HANDLES: usize = 1 << 16;

impl CondState {
    /// The home graph `g` (a home or a body) lies in.
    fn home_of(&self, g: u64) -> Option<u64> {
        if self.homes.contains(&g) {
            return Some(g);
        }
        self.bodies
            .values()
            .find(|&&(b, _)| b == g)
            .map(|&(_, home)| home)
    }

    fn being_captured(&self, home: u64) -> bool {
        self.capture_into
            .values()
            .any(|&g| self.home_of(g) == Some(home))
    }

    /// The driver's body graphs of home `home` (nested ones too: all name the outermost).
    pub(super) fn bodies_of(&self, home: u64) -> Vec<u64> {
        self.bodies
            .values()
            .filter(|&&(_, h)| h == home)
            .map(|&(b, _)| b)
            .collect()
    }

    /// Home `home` lost its nodes: its bodies are gone, and what it and they inherited.
    fn cleared(&mut self, home: u64) {
        for b in self.bodies_of(home).into_iter().chain([home]) {
            self.forget_inherited(b);
        }
        self.bodies.retain(|_, &mut (_, h)| h != home);
    }

    /// The bodies and inherited ranges graph `graph` replays beyond what the driver lists
    /// of it: its own bodies, and those of the graphs it copied in (transitively).
    pub(super) fn reach(&self, graph: u64) -> (Vec<u64>, Vec<(u64, u64)>) {
        let (mut bodies, mut ranges) = (Vec::new(), Vec::new());
        let mut seen = std::collections::HashSet::new();
        let mut todo = vec![graph];
        while let Some(g) = todo.pop() {
            if !seen.insert(g) {
                continue;
            }
            let own = self.bodies_of(g);
            for x in std::iter::once(g).chain(own.iter().copied()) {
                if let Some(i) = self.inherited.get(&x) {
                    ranges.extend_from_slice(&i.ranges);
                    ranges.extend(i.words.iter().map(|&w| (w, 8)));
                    todo.extend_from_slice(&i.from);
                }
            }
            bodies.extend(own);
        }
        (bodies, ranges)
    }

    /// Graph `copy` holds a copy of `source` (a clone of it, or a child node), whose
    /// bodies and what it inherited used `ranges` when copied.
    pub(super) fn inherit(&mut self, copy: u64, source: u64, ranges: Vec<(u64, u64)>) {
        let i = self.inherited.entry(copy).or_default();
        if !i.from.contains(&source) {
            i.from.push(source);
        }
        i.ranges.extend(ranges);
        i.ranges.sort_unstable();
        i.ranges.dedup();
    }

    /// A host node of graph `g` (being captured) uses the two words at `words`.
    pub(super) fn host_words(&mut self, g: u64, words: u64) {
        let i = self.inherited.entry(g).or_default();
        if !i.words.contains(&words) {
            i.words.push(words);
        }
    }

    /// Graph `g` is gone: what it inherited, and the links to it (the driver may give its
    /// handle to a new graph), go; its copies keep the ranges they inherited from it.
    fn forget_inherited(&mut self, g: u64) {
        self.inherited.remove(&g);
        for i in self.inherited.values_mut() {
            i.from.retain(|&f| f != g);
        }
    }

    /// Graph `g` (any of the client's) is destroyed: Err when a capture goes into it.
    pub(super) fn destroying(&mut self, g: u64) -> Result<(), Malformed> {
        if !self.homes.contains(&g) {
            self.forget_inherited(g);
            return Ok(());
        }
        if self.being_captured(g) {
            return bad("destroying a graph a capture goes into");
        }
        self.forget_home(g);
        self.forget_inherited(g);
        Ok(())
    }

    /// Home `g` is gone (destroyed, or a capture's graph the driver threw away).
    pub(super) fn forget_home(&mut self, g: u64) {
        self.cleared(g);
        self.handles.retain(|_, &mut h| h != g);
        self.homes.remove(&g);
    }

    /// Whether any home is tracked (so a capture's end must look at its graph).
    pub(super) fn any(&self) -> bool {
        !self.homes.is_empty() || !self.inherited.is_empty()
    }

    /// Client streams capturing into bodies of homes that are the graphs of captures
    /// still going (they have no id yet): a plain capture's end may throw such a home,
    /// and its bodies, away, so captures into them end first.
    pub(super) fn captures_into_capture_homes(&self, graphs: &HashMap<u32, u64>) -> Vec<u32> {
        self.capture_into
            .iter()
            .filter(|(_, &g)| {
                self.home_of(g)
                    .is_some_and(|root| !graphs.values().any(|&h| h == root))
            })
            .map(|(&s, _)| s)
            .collect()
    }

    /// After a capture ended: homes that are neither one of the client's graphs nor the
    /// graph of a capture still going are gone (the driver threw them away with a failed
    /// capture), and with them their bodies and handles, before any id of theirs could
    /// name freed memory.
    pub(super) fn prune(&mut self, graphs: &HashMap<u32, u64>, capturing: &[u64]) {
        let gone: Vec<u64> = self
            .homes
            .iter()
            .copied()
            .filter(|h| !graphs.values().any(|g| g == h) && !capturing.contains(h))
            .collect();
        for h in gone {
            self.forget_home(h);
        }
        // And what graphs thrown away with a capture had inherited.
        let gone: Vec<u64> = self
            .inherited
            .keys()
            .copied()
            .filter(|g| {
                !graphs.values().any(|h| h == g)
                    && !capturing.contains(g)
                    && !self.bodies.values().any(|&(b, _)| b == *g)
            })
            .collect();
        for g in gone {
            self.forget_inherited(g);
        }
    }

    /// Client stream `id`'s capture ended (or the stream stopped capturing).
    pub(super) fn capture_over(&mut self, id: u32) {
        self.capture_into.remove(&id);
    }

    /// Whether client stream `id` captures into a home or body.
    pub(super) fn is_capturing_into(&self, id: u32) -> bool {
        self.capture_into.contains_key(&id)
    }

    /// The id a graph handle a capture ended in already has (a home or body).
    pub(super) fn known_id(&self, graphs: &HashMap<u32, u64>, g: u64) -> Option<u32> {
        graphs
            .iter()
            .chain(self.bodies.iter().map(|(id, (b, _))| (id, b)))
            .find(|(_, &h)| h == g)
            .map(|(&id, _)| id)
    }
}

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
                            // The update's memory replaces what the executable graph used.
                            self.note_exec_ranges(ctx, c.handle as u32, ranges);
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
        let held = self.graphs.len() + self.execs.len() + self.cond.bodies.len();
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
