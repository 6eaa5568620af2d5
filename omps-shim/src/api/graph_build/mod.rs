//! Graphs built by hand: `cuGraphCreate`, `cuGraphAdd*Node`, edges, clones. Such a graph
//! lives here, in the client, as nodes and edges. `cuGraphInstantiate` turns it into a
//! capture on the server: the nodes are issued in dependency order onto private streams
//! of this client, an edge between two streams becomes an event, and the server
//! instantiates what it captured. So the server sees only stream work it already checks
//! (launches, memsets, copies), and no new wire operation exists for graphs built by hand.
//!
//! Node kinds: kernel, memset, memcpy, empty, event record and wait, host, memory
//! allocation and free (mem_nodes.rs), child graphs built by hand (inlined), and
//! conditional nodes (cond.rs: these need a graph op of the server's).

use super::capture::{cuStreamBeginCapture_v2, cuStreamEndCapture};
use super::hostmem::{cuMemcpy3DAsync_v2, Memcpy3D};
use crate::api::exec::{
    cuEventCreate, cuEventDestroy_v2, cuEventRecord, cuEventRecordWithFlags, cuLaunchKernel,
    cuStreamDestroy_v2, cuStreamWaitEvent,
};
use crate::cuda::*;
use crate::handles::{leak, resolve, GraphHandle, GraphNode, GRAPH_MAGIC, NODE_MAGIC};
use crate::state::capture::{CUgraph, MODE_RELAXED};
use crate::state::entry::{entry, out};
use crate::state::streams::{event, function, CUevent, CUfunction, CUstream};
use std::collections::HashMap;
use std::ffi::{c_uint, c_void};
use std::sync::Mutex;

mod cond;
mod edges;
mod emit;
mod exec_source;
mod mem_nodes;
mod nodes;
mod queries;
mod server_child;
mod server_graph;
mod to_graph;
pub use cond::*;
pub use edges::*;
pub(crate) use emit::capture_then;
pub(crate) use exec_source::*;
pub use mem_nodes::*;
pub use nodes::*;
pub use queries::*;
pub(crate) use server_graph::cond_call;
use server_graph::{copy_of, ServerGraph};
pub use to_graph::*;

/// CUgraphNodeType values.
pub(crate) mod node_type {
    pub const KERNEL: u32 = 0;
    pub const MEMCPY: u32 = 1;
    pub const MEMSET: u32 = 2;
    pub const HOST: u32 = 3;
    pub const GRAPH: u32 = 4;
    pub const EMPTY: u32 = 5;
    pub const WAIT_EVENT: u32 = 6;
    pub const EVENT_RECORD: u32 = 7;
    pub const MEM_ALLOC: u32 = 10;
    pub const MEM_FREE: u32 = 11;
    pub const CONDITIONAL: u32 = 13;
}

#[derive(Clone)]
pub(crate) struct KernelNode {
    func: usize,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    /// The packed arguments, copied when the node was made or set, as the driver does.
    args: Vec<u8>,
    /// Launch attributes set on the node (CUlaunchAttribute records: id, value).
    attrs: Vec<[u8; omps_ring::wire::LAUNCH_ATTR_BYTES]>,
}

/// A copy's description; the host pointers in it are the caller's, used only to issue
/// the copy, as the driver keeps them.
#[derive(Clone, Copy)]
pub(crate) struct CopyNode(Memcpy3D);
// SAFETY: the raw pointers are addresses the caller owns; nothing here dereferences them
// except the copy issued on the caller's behalf, from whichever thread instantiates.
unsafe impl Send for CopyNode {}

#[derive(Clone)]
pub(crate) enum Kind {
    Empty,
    Kernel(KernelNode),
    Memset(MemsetNodeParams),
    Memcpy(CopyNode),
    /// A child graph: the handle address of a built graph the node owns (a copy made when
    /// the node was; cuGraphChildGraphNodeGetGraph hands it out, and changes to it are
    /// the node's).
    Child(usize),
    /// A child graph the server captured: the node holds the server's copy.
    ServerChild(std::sync::Arc<ServerGraph>),
    /// An event record or wait node: the event's handle.
    EventRecord(usize),
    EventWait(usize),
    /// A host node: the function and its argument.
    Host(HostFn, usize),
    MemAlloc(MemAllocNode),
    /// A free node: the address it frees.
    MemFree(u64),
    Conditional(CondNode),
}

/// A host node's function (CUhostFn).
pub type HostFn = unsafe extern "C" fn(*mut c_void);

impl Kind {
    /// New parameters for a node that was `old`: a kernel keeps the launch attributes set
    /// on the node, which parameters do not carry.
    pub(super) fn keeping(self, old: &Kind) -> Kind {
        match (self, old) {
            (Kind::Kernel(mut k), Kind::Kernel(o)) => {
                k.attrs = o.attrs.clone();
                Kind::Kernel(k)
            }
            (k, _) => k,
        }
    }

    fn type_code(&self) -> u32 {
        match self {
            Kind::Empty => node_type::EMPTY,
            Kind::Kernel(_) => node_type::KERNEL,
            Kind::Memset(_) => node_type::MEMSET,
            Kind::Memcpy(_) => node_type::MEMCPY,
            Kind::Child(_) | Kind::ServerChild(_) => node_type::GRAPH,
            Kind::EventRecord(_) => node_type::EVENT_RECORD,
            Kind::EventWait(_) => node_type::WAIT_EVENT,
            Kind::Host(..) => node_type::HOST,
            Kind::MemAlloc(_) => node_type::MEM_ALLOC,
            Kind::MemFree(_) => node_type::MEM_FREE,
            Kind::Conditional(_) => node_type::CONDITIONAL,
        }
    }

    /// The built graphs the node owns: a child node's graph, a conditional node's bodies.
    pub(super) fn owned(&self) -> Vec<usize> {
        match self {
            &Kind::Child(c) => vec![c],
            Kind::Conditional(c) => c.bodies.to_vec(),
            _ => Vec::new(),
        }
    }
}

#[derive(Clone)]
struct Node {
    kind: Kind,
    /// Indices of the nodes this one waits for.
    deps: Vec<usize>,
    /// Disabled in an executable graph (cuGraphNodeSetEnabled): it orders as an empty node.
    disabled: bool,
}

/// A graph built by hand. A destroyed node leaves a hole, so indices stay stable.
#[derive(Clone)]
pub(crate) struct Built {
    dev: usize,
    nodes: Vec<Option<Node>>,
    /// The server graph its conditional handles belong to, once it made one.
    home: Option<std::sync::Arc<Home>>,
}

impl Built {
    fn live(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
    }

    /// Node kinds and edges, the nodes by their rank among the live ones and each node's
    /// dependencies sorted: what an executable graph's update must keep.
    fn topology(&self) -> Vec<(u32, Vec<usize>)> {
        let rank: HashMap<usize, usize> =
            self.live().enumerate().map(|(r, (i, _))| (i, r)).collect();
        self.live()
            .map(|(_, n)| {
                let mut deps: Vec<usize> = n.deps.iter().map(|d| rank[d]).collect();
                deps.sort_unstable();
                (n.kind.type_code(), deps)
            })
            .collect()
    }
}

struct Registry {
    /// Graph handle address -> the graph.
    graphs: HashMap<usize, Built>,
    /// Node handle address -> (graph handle address, index).
    nodes: HashMap<usize, (usize, usize)>,
    /// (graph handle address, index) -> node handle address.
    handles: HashMap<(usize, usize), usize>,
    /// Executable graph handle address -> the built graph it was made from and its
    /// instantiation flags, for updates.
    sources: HashMap<usize, (Built, u64)>,
    /// Executable graph handle address -> the graph handle it was instantiated from, whose
    /// nodes name its nodes.
    origins: HashMap<usize, usize>,
    /// Executable graph handle address -> the node types of the captured graph an update
    /// made it from (for the next update's topology check).
    captured: HashMap<usize, Vec<u64>>,
    /// Executable graph handle address -> the flags a captured graph was instantiated with.
    captured_flags: HashMap<usize, u64>,
}

static REG: Mutex<Option<Registry>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut g = REG.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(|| Registry {
        graphs: HashMap::new(),
        nodes: HashMap::new(),
        handles: HashMap::new(),
        sources: HashMap::new(),
        origins: HashMap::new(),
        captured: HashMap::new(),
        captured_flags: HashMap::new(),
    }))
}

/// Whether `g` is a graph built here (and not one the server captured).
pub(crate) fn is_built(g: CUgraph) -> bool {
    with(|r| r.graphs.contains_key(&(g as usize)))
}

/// A copy of built graph `g`.
pub(crate) fn built(g: CUgraph) -> Option<Built> {
    with(|r| r.graphs.get(&(g as usize)).cloned())
}

/// Forgets built graph `g` and its node handles (cuGraphDestroy).
pub(crate) fn forget(g: CUgraph) {
    with(|r| forget_in(r, g as usize))
}

/// Forgets built graph `g` and, with it, the child graphs its nodes own.
fn forget_in(r: &mut Registry, g: usize) {
    if let Some(b) = r.graphs.remove(&g) {
        forget_children(r, &b);
    }
    r.nodes.retain(|_, &mut (gr, _)| gr != g);
    r.handles.retain(|&(gr, _), _| gr != g);
}

fn forget_children(r: &mut Registry, b: &Built) {
    for c in children(b).collect::<Vec<_>>() {
        drop_child(r, c);
    }
}

/// A child graph whose node is gone: its handle is refused from now on.
fn drop_child(r: &mut Registry, c: usize) {
    // SAFETY: a handle own_copy made, never freed (handles stay readable).
    let h = unsafe { &*(c as *const GraphHandle) };
    let _ = crate::handles::retire(&h.magic, GRAPH_MAGIC);
    forget_in(r, c);
    crate::api::user_object::graph_gone(c);
}

/// A copy of `b` whose child and conditional nodes own copies of their graphs (a
/// graph's children are its own: copies never share them).
fn deep(r: &mut Registry, b: &Built) -> Built {
    let mut b = b.clone();
    for n in b.nodes.iter_mut().flatten() {
        let copies: Vec<usize> = n
            .kind
            .owned()
            .into_iter()
            .map(|c| own_copy(r, c).unwrap_or(c))
            .collect();
        match &mut n.kind {
            Kind::Child(c) => *c = copies[0],
            Kind::Conditional(c) => *c = c.with_bodies(copies),
            _ => {}
        }
    }
    b
}

/// A new built graph, a copy of built graph `g`, owned by whoever asked: its handle.
fn own_copy(r: &mut Registry, g: usize) -> Option<usize> {
    let b = r.graphs.get(&g)?.clone();
    let copy = deep(r, &b);
    let h = leak(GraphHandle::new(GRAPH_MAGIC, 0, copy.dev)) as usize;
    r.graphs.insert(h, copy);
    // The copy holds the user objects its original holds.
    crate::api::user_object::share(g, h);
    Some(h)
}

/// A child node's kind: a copy of built graph `child`, owned by the node. A graph with
/// memory nodes cannot be a child, as natively.
pub(crate) fn child_kind(child: CUgraph) -> Result<Kind, CUresult> {
    graph_ref(child)?;
    let memory = with(|r| {
        r.graphs.get(&(child as usize)).map(|b| {
            b.live()
                .any(|(_, n)| matches!(n.kind, Kind::MemAlloc(_) | Kind::MemFree(_)))
        })
    });
    if memory == Some(true) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(c) = with(|r| own_copy(r, child as usize)) {
        return Ok(Kind::Child(c));
    }
    // A graph the server captured; one whose graph memory it holds cannot be a child.
    if !crate::api::graph_mem::held_by(child as usize).is_empty() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: resolved by graph_ref above.
    server_child_kind(unsafe { &*child })
}

/// A child node's kind for graph `child`, which the server captured.
pub(crate) fn server_child_kind(child: &GraphHandle) -> Result<Kind, CUresult> {
    let (id, handle) = copy_of(child)?;
    // The copy replays what the original does: it holds the same objects (the buffers of
    // its staged copies).
    crate::api::user_object::share(child as *const GraphHandle as usize, handle as usize);
    Ok(server_graph(child.dev, id, handle as usize))
}

/// A child node's graph: server graph `id` under graph handle `handle`, both the node's.
pub(crate) fn server_graph(dev: usize, id: u32, handle: usize) -> Kind {
    Kind::ServerChild(std::sync::Arc::new(ServerGraph { dev, id, handle }))
}

/// Forgets the graphs a child or conditional kind made for a node that was not kept.
pub(crate) fn forget_kind(kind: &Kind) {
    with(|r| kind.owned().into_iter().for_each(|c| drop_child(r, c)));
}

/// The graph child node `c` owns, as emission reads it.
pub(crate) fn child_graph(c: usize) -> Option<Built> {
    with(|r| r.graphs.get(&c).cloned())
}

/// A copy of graph `g` for a new handle (cuGraphClone): children copied too.
pub(crate) fn clone_graph(g: usize, h: usize) -> bool {
    with(|r| {
        let Some(b) = r.graphs.get(&g).cloned() else {
            return false;
        };
        let copy = deep(r, &b);
        r.graphs.insert(h, copy);
        true
    })
}

/// Remembers what executable graph `e` was made from, for updates of its parameters.
/// Remembers what executable graph `e` is made from now, and at its instantiation
/// (`origin`: the graph handle) the graph whose nodes name its nodes.
pub(crate) fn note_source(e: usize, b: Built, flags: u64, origin: Option<usize>) {
    with(|r| {
        // Its own copies of the children: later changes to the graph's are not its.
        let b = deep(r, &b);
        if let Some((old, _)) = r.sources.insert(e, (b, flags)) {
            forget_children(r, &old);
        }
        if let Some(g) = origin {
            r.origins.insert(e, g);
        }
    });
}

/// Executable graph `e` now made from `b`, a changed copy of its own source: the children
/// it still names stay its own; those it no longer names go.
pub(crate) fn note_changed_source(e: usize, b: Built, flags: u64) {
    with(|r| {
        let keep: Vec<usize> = children(&b).collect();
        if let Some((old, _)) = r.sources.insert(e, (b, flags)) {
            for c in children(&old)
                .filter(|c| !keep.contains(c))
                .collect::<Vec<_>>()
            {
                drop_child(r, c);
            }
        }
    });
}

/// The graphs `b`'s nodes own.
fn children(b: &Built) -> impl Iterator<Item = usize> + '_ {
    b.live().flat_map(|(_, n)| n.kind.owned())
}

pub(crate) fn note_captured_source(e: usize, types: Vec<u64>) {
    with(|r| r.captured.insert(e, types));
}

pub(crate) fn note_captured_flags(e: usize, flags: u64) {
    with(|r| r.captured_flags.insert(e, flags));
}

pub(crate) fn captured_flags(e: usize) -> u64 {
    with(|r| r.captured_flags.get(&e).copied().unwrap_or(0))
}

pub(crate) fn captured_source(e: usize) -> Option<Vec<u64>> {
    with(|r| r.captured.get(&e).cloned())
}

pub(crate) fn forget_exec(e: usize) {
    with(|r| {
        if let Some((old, _)) = r.sources.remove(&e) {
            forget_children(r, &old);
        }
        r.origins.remove(&e);
        r.captured.remove(&e);
        r.captured_flags.remove(&e);
    });
}

/// A node handle as the API passes it.
pub type GraphNodeRef = *mut GraphNode;

/// The handle of node `index` of built graph `g`, made once.
fn node_handle(r: &mut Registry, g: usize, index: usize, dev: usize) -> *mut GraphNode {
    let h = *r.handles.entry((g, index)).or_insert_with(|| {
        leak(GraphNode {
            magic: std::sync::atomic::AtomicU32::new(NODE_MAGIC),
            graph: 0,
            index: index as u32,
            dev,
        }) as usize
    });
    r.nodes.insert(h, (g, index));
    h as *mut GraphNode
}

/// The handles of built graph `g`'s live nodes, in order.
pub(crate) fn node_handles(g: CUgraph) -> Option<Vec<*mut GraphNode>> {
    with(|r| {
        let b = r.graphs.get(&(g as usize))?;
        let (dev, idx): (usize, Vec<usize>) = (b.dev, b.live().map(|(i, _)| i).collect());
        Some(
            idx.into_iter()
                .map(|i| node_handle(r, g as usize, i, dev))
                .collect(),
        )
    })
}

/// The (graph, index) of a node handle of a built graph.
fn locate(node: *mut GraphNode) -> Option<(usize, usize)> {
    with(|r| r.nodes.get(&(node as usize)).copied())
}

/// The type of a node of a built graph; None for other handles.
pub(crate) fn built_node_type(node: *mut GraphNode) -> Option<Result<u32, CUresult>> {
    let (g, i) = locate(node)?;
    Some(with(|r| {
        r.graphs
            .get(&g)
            .and_then(|b| b.nodes.get(i).and_then(|n| n.as_ref()))
            .map(|n| n.kind.type_code())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }))
}

fn graph_ref(g: CUgraph) -> Result<&'static GraphHandle, CUresult> {
    // SAFETY: the caller passed a graph handle, as the API requires.
    unsafe { resolve(g as *const GraphHandle, GRAPH_MAGIC) }
}

/// Resolves a dependency list of nodes of graph `g` into indices.
///
/// # Safety
/// `deps` is null or holds `n` node handles.
unsafe fn dep_indices(
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
) -> Result<Vec<usize>, CUresult> {
    if n > 0 && deps.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut out = Vec::with_capacity(n);
    for k in 0..n {
        // SAFETY: per the contract, n readable handles.
        let d = unsafe { *deps.add(k) };
        match locate(d) {
            Some((gr, i)) if gr == g as usize => {
                if out.contains(&i) {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                out.push(i);
            }
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
    Ok(out)
}

/// Adds a node to built graph `g` and writes its handle.
///
/// # Safety
/// `ph` is null or writable; `deps` is null or holds `n` node handles.
unsafe fn add(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    kind: Kind,
) -> Result<(), CUresult> {
    // A child node's graph copy (a conditional node's bodies) is the node's: refused,
    // the node is not made, and they go too.
    let owned = kind.owned();
    // SAFETY: forwarded contract.
    let r = unsafe { add_node(ph, g, deps, n, kind) };
    if r.is_err() {
        with(|reg| owned.into_iter().for_each(|c| drop_child(reg, c)));
    }
    r
}

/// # Safety
/// As [`add`].
unsafe fn add_node(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    kind: Kind,
) -> Result<(), CUresult> {
    if ph.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    graph_ref(g)?;
    if !is_built(g) {
        // Adding to a graph the server captured: not yet.
        return Err(crate::unsupported::unsupported(
            "adding nodes to a captured graph",
        ));
    }
    // SAFETY: forwarded contract.
    let deps = unsafe { dep_indices(g, deps, n) }?;
    let h = with(|r| {
        let b = r
            .graphs
            .get_mut(&(g as usize))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        b.nodes.push(Some(Node {
            kind,
            deps,
            disabled: false,
        }));
        let (i, dev) = (b.nodes.len() - 1, b.dev);
        Ok::<_, CUresult>(node_handle(r, g as usize, i, dev))
    })?;
    // SAFETY: checked non-null; the caller's pointer.
    unsafe { out(ph, h) }
}

/// # Safety
/// `ph` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(ph: *mut CUgraph, flags: c_uint) -> CUresult {
    entry(|| {
        if ph.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = crate::state::ctx::current_dev()?;
        let h = leak(GraphHandle::new(GRAPH_MAGIC, 0, dev));
        with(|r| {
            r.graphs.insert(
                h as usize,
                Built {
                    dev,
                    nodes: Vec::new(),
                    home: None,
                },
            )
        });
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(ph, h) }
    })
}
