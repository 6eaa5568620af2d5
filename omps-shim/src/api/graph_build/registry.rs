//! The registry of graphs built by hand: built graphs, their node handles and executable
//! graphs' sources, and adding nodes. Below the files that make and read nodes, which all
//! go through it; mod.rs keeps only declarations, re-exports and cuGraphCreate.

use super::server_graph::{copy_of, ServerGraph};
use super::types::{Built, Kind, Node};
use crate::cuda::*;
use crate::handles::{leak, resolve, GraphHandle, GraphNode, GRAPH_MAGIC, NODE_MAGIC};
use crate::state::capture::CUgraph;
use crate::state::entry::out;
use std::collections::HashMap;
use std::sync::Mutex;

pub(super) struct Registry {
    /// Graph handle address -> the graph.
    pub(super) graphs: HashMap<usize, Built>,
    /// Node handle address -> (graph handle address, index).
    pub(super) nodes: HashMap<usize, (usize, usize)>,
    /// (graph handle address, index) -> node handle address.
    pub(super) handles: HashMap<(usize, usize), usize>,
    /// Executable graph handle address -> the built graph it was made from and its
    /// instantiation flags, for updates.
    pub(super) sources: HashMap<usize, (Built, u64)>,
    /// Executable graph handle address -> the graph handle it was instantiated from, whose
    /// nodes name its nodes.
    pub(super) origins: HashMap<usize, usize>,
    /// Executable graph handle address -> the node types of the captured graph an update
    /// made it from (for the next update's topology check).
    pub(super) captured: HashMap<usize, Vec<u64>>,
    /// Executable graph handle address -> the flags a captured graph was instantiated with.
    pub(super) captured_flags: HashMap<usize, u64>,
}

static REG: Mutex<Option<Registry>> = Mutex::new(None);

pub(super) fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
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
pub(super) fn forget_in(r: &mut Registry, g: usize) {
    if let Some(b) = r.graphs.remove(&g) {
        forget_children(r, &b);
    }
    r.nodes.retain(|_, &mut (gr, _)| gr != g);
    r.handles.retain(|&(gr, _), _| gr != g);
}

pub(super) fn forget_children(r: &mut Registry, b: &Built) {
    for c in children(b).collect::<Vec<_>>() {
        drop_child(r, c);
    }
}

/// A child graph whose node is gone: its handle is refused from now on.
pub(super) fn drop_child(r: &mut Registry, c: usize) {
    // SAFETY: a handle own_copy made, never freed (handles stay readable).
    let h = unsafe { &*(c as *const GraphHandle) };
    let _ = crate::handles::retire(&h.magic, GRAPH_MAGIC);
    forget_in(r, c);
    crate::api::user_object::graph_gone(c);
}

/// A copy of `b` whose child and conditional nodes own copies of their graphs (a
/// graph's children are its own: copies never share them).
pub(super) fn deep(r: &mut Registry, b: &Built) -> Built {
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
pub(super) fn own_copy(r: &mut Registry, g: usize) -> Option<usize> {
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
pub(super) fn children(b: &Built) -> impl Iterator<Item = usize> + '_ {
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
pub(super) fn node_handle(r: &mut Registry, g: usize, index: usize, dev: usize) -> *mut GraphNode {
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
pub(super) fn locate(node: *mut GraphNode) -> Option<(usize, usize)> {
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

pub(super) fn graph_ref(g: CUgraph) -> Result<&'static GraphHandle, CUresult> {
    // SAFETY: the caller passed a graph handle, as the API requires.
    unsafe { resolve(g as *const GraphHandle, GRAPH_MAGIC) }
}

/// Resolves a dependency list of nodes of graph `g` into indices.
///
/// # Safety
/// `deps` is null or holds `n` node handles.
pub(super) unsafe fn dep_indices(
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
pub(super) unsafe fn add(
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
pub(super) unsafe fn add_node(
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

/// A copy of node `node`'s kind and parameters.
pub(super) fn node_kind(node: *mut GraphNode) -> Result<Kind, CUresult> {
    let (g, i) = locate(node).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    with(|r| {
        r.graphs
            .get(&g)
            .and_then(|b| b.nodes.get(i))
            .and_then(|n| n.as_ref())
            .map(|n| n.kind.clone())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    })
}

/// Gives node `node` new parameters of its own kind.
/// Gives node `node` new parameters of its own kind (a kernel keeps its launch
/// attributes).
pub(super) fn set_node(node: *mut GraphNode, kind: Kind) -> Result<(), CUresult> {
    edit_node(node, |old| kind.keeping(old))
}

/// Replaces node `node`'s kind and parameters as they are (`make` sees the old ones), the
/// node kind unchanged.
pub(super) fn edit_node(
    node: *mut GraphNode,
    make: impl FnOnce(&Kind) -> Kind,
) -> Result<(), CUresult> {
    let (g, i) = locate(node).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    with(|r| {
        let n = r
            .graphs
            .get_mut(&g)
            .and_then(|b| b.nodes.get_mut(i))
            .and_then(|n| n.as_mut())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let kind = make(&n.kind);
        if n.kind.type_code() != kind.type_code() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        n.kind = kind;
        Ok(())
    })
}
