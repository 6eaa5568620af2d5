//! Graphs built by hand: `cuGraphCreate`, `cuGraphAdd*Node`, edges, clones. Such a graph
//! lives here, in the client, as nodes and edges. `cuGraphInstantiate` turns it into a
//! capture on the server: the nodes are issued in dependency order onto private streams
//! of this client, an edge between two streams becomes an event, and the server
//! instantiates what it captured. So the server sees only stream work it already checks
//! (launches, memsets, copies), and no new wire operation exists for graphs built by hand.
//!
//! Node kinds: kernel, memset, memcpy, empty, event record and wait, and child graphs
//! built by hand (inlined). Host, memory and conditional nodes are not supported yet.

use super::capture::{cuStreamBeginCapture_v2, cuStreamEndCapture, CUgraph, MODE_RELAXED};
use super::exec::{
    cuEventCreate, cuEventDestroy_v2, cuEventRecord, cuEventRecordWithFlags, cuLaunchKernel,
    cuStreamDestroy_v2, cuStreamWaitEvent, event, function, CUevent, CUfunction, CUstream,
};
use super::hostmem::{cuMemcpy3DAsync_v2, Memcpy3D};
use super::{entry, out};
use crate::cuda::*;
use crate::handles::{leak, resolve, GraphHandle, GraphNode, GRAPH_MAGIC, NODE_MAGIC};
use std::collections::HashMap;
use std::ffi::{c_uint, c_void};
use std::sync::Mutex;

/// CUgraphNodeType values.
pub(crate) mod node_type {
    pub const KERNEL: u32 = 0;
    pub const MEMCPY: u32 = 1;
    pub const MEMSET: u32 = 2;
    pub const GRAPH: u32 = 4;
    pub const EMPTY: u32 = 5;
    pub const WAIT_EVENT: u32 = 6;
    pub const EVENT_RECORD: u32 = 7;
}

#[derive(Clone)]
pub(crate) struct KernelNode {
    func: usize,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    /// The packed arguments, copied when the node was made or set, as the driver does.
    args: Vec<u8>,
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
    Memset {
        dst: u64,
        pitch: usize,
        value: u32,
        elem: u32,
        width: usize,
        height: usize,
    },
    Memcpy(CopyNode),
    Child(Built),
    /// An event record or wait node: the event's handle.
    EventRecord(usize),
    EventWait(usize),
}

impl Kind {
    fn type_code(&self) -> u32 {
        match self {
            Kind::Empty => node_type::EMPTY,
            Kind::Kernel(_) => node_type::KERNEL,
            Kind::Memset { .. } => node_type::MEMSET,
            Kind::Memcpy(_) => node_type::MEMCPY,
            Kind::Child(_) => node_type::GRAPH,
            Kind::EventRecord(_) => node_type::EVENT_RECORD,
            Kind::EventWait(_) => node_type::WAIT_EVENT,
        }
    }
}

#[derive(Clone)]
struct Node {
    kind: Kind,
    /// Indices of the nodes this one waits for.
    deps: Vec<usize>,
}

/// A graph built by hand. A destroyed node leaves a hole, so indices stay stable.
#[derive(Clone)]
pub(crate) struct Built {
    dev: usize,
    nodes: Vec<Option<Node>>,
}

impl Built {
    fn live(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
    }

    /// Node kinds and edges, in index order: what an executable graph's update must keep.
    fn topology(&self) -> Vec<(u32, Vec<usize>)> {
        self.live()
            .map(|(_, n)| (n.kind.type_code(), n.deps.clone()))
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
    /// Executable graph handle address -> the node types of the captured graph an update
    /// made it from (for the next update's topology check).
    captured: HashMap<usize, Vec<u64>>,
}

static REG: Mutex<Option<Registry>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut g = REG.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(|| Registry {
        graphs: HashMap::new(),
        nodes: HashMap::new(),
        handles: HashMap::new(),
        sources: HashMap::new(),
        captured: HashMap::new(),
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
    with(|r| {
        r.graphs.remove(&(g as usize));
        r.nodes.retain(|_, &mut (gr, _)| gr != g as usize);
        r.handles.retain(|&(gr, _), _| gr != g as usize);
    })
}

/// Remembers what executable graph `e` was made from, for updates of its parameters.
pub(crate) fn note_source(e: usize, b: Built, flags: u64) {
    with(|r| r.sources.insert(e, (b, flags)));
}

pub(crate) fn note_captured_source(e: usize, types: Vec<u64>) {
    with(|r| r.captured.insert(e, types));
}

pub(crate) fn captured_source(e: usize) -> Option<Vec<u64>> {
    with(|r| r.captured.get(&e).cloned())
}

pub(crate) fn forget_exec(e: usize) {
    with(|r| {
        r.sources.remove(&e);
        r.captured.remove(&e);
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
        b.nodes.push(Some(Node { kind, deps }));
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
        let dev = super::ctx::current_dev()?;
        let h = leak(GraphHandle::new(GRAPH_MAGIC, 0, dev));
        with(|r| {
            r.graphs.insert(
                h as usize,
                Built {
                    dev,
                    nodes: Vec::new(),
                },
            )
        });
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(ph, h) }
    })
}

/// CUDA_KERNEL_NODE_PARAMS (v1); v2 appends a CUkernel and a context.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParams {
    pub func: CUfunction,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParamsV2 {
    pub v1: KernelNodeParams,
    pub kern: CUfunction,
    pub ctx: *mut c_void,
}

/// The node a kernel's parameters describe: arguments packed now, as the driver copies them.
///
/// # Safety
/// `p`'s argument pointers follow cuLaunchKernel's contract for its function.
unsafe fn kernel_node(p: &KernelNodeParams, kern: CUfunction) -> Result<KernelNode, CUresult> {
    let f = if p.func.is_null() { kern } else { p.func };
    let func = function(f)?;
    let mut args = vec![0u8; func.args_size];
    // SAFETY: forwarded contract.
    unsafe { super::exec::pack_args(func, p.kernel_params, p.extra, &mut args) }?;
    Ok(KernelNode {
        func: f as usize,
        grid: p.grid,
        block: p.block,
        shared: p.shared,
        args,
    })
}

/// # Safety
/// As cuGraphAddKernelNode.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    p: *const KernelNodeParams,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters, per the contract.
        let k = unsafe {
            kernel_node(
                p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?,
                std::ptr::null_mut(),
            )
        }?;
        // SAFETY: forwarded contract.
        unsafe { add(ph, g, deps, n, Kind::Kernel(k)) }
    })
}

/// # Safety
/// As cuGraphAddKernelNode_v2.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    p: *const KernelNodeParamsV2,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters, per the contract.
        let p = unsafe { p.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: as above.
        let k = unsafe { kernel_node(&p.v1, p.kern) }?;
        // SAFETY: forwarded contract.
        unsafe { add(ph, g, deps, n, Kind::Kernel(k)) }
    })
}

/// The kernel node behind `node`, for reading or replacing its parameters.
fn kernel_of(node: *mut GraphNode, f: impl FnOnce(&mut KernelNode)) -> Result<(), CUresult> {
    let (g, i) = locate(node).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    with(|r| {
        match r
            .graphs
            .get_mut(&g)
            .and_then(|b| b.nodes.get_mut(i))
            .and_then(|n| n.as_mut())
        {
            Some(Node {
                kind: Kind::Kernel(k),
                ..
            }) => {
                f(k);
                Ok(())
            }
            Some(_) => Err(CUDA_ERROR_INVALID_VALUE),
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    })
}

/// # Safety
/// `p` is null or valid, as cuGraphKernelNodeSetParams.
#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeSetParams(
    node: *mut GraphNode,
    p: *const KernelNodeParams,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters.
        let k = unsafe {
            kernel_node(
                p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?,
                std::ptr::null_mut(),
            )
        }?;
        kernel_of(node, |old| *old = k)
    })
}

/// # Safety
/// As cuGraphKernelNodeSetParams_v2.
#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeSetParams_v2(
    node: *mut GraphNode,
    p: *const KernelNodeParamsV2,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters.
        let p = unsafe { p.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: as above.
        let k = unsafe { kernel_node(&p.v1, p.kern) }?;
        kernel_of(node, |old| *old = k)
    })
}

/// CUDA_MEMSET_NODE_PARAMS.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemsetNodeParams {
    pub dst: u64,
    pub pitch: usize,
    pub value: c_uint,
    pub elem: c_uint,
    pub width: usize,
    pub height: usize,
}

fn memset_kind(p: &MemsetNodeParams) -> Result<Kind, CUresult> {
    if !matches!(p.elem, 1 | 2 | 4) || p.width == 0 || p.height == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Kind::Memset {
        dst: p.dst,
        pitch: p.pitch,
        value: p.value,
        elem: p.elem,
        width: p.width,
        height: p.height,
    })
}

/// # Safety
/// As cuGraphAddMemsetNode.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemsetNode(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    p: *const MemsetNodeParams,
    _ctx: *mut c_void,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters.
        let kind = memset_kind(unsafe { p.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?)?;
        // SAFETY: forwarded contract.
        unsafe { add(ph, g, deps, n, kind) }
    })
}

/// # Safety
/// As cuGraphAddMemcpyNode.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemcpyNode(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    p: *const Memcpy3D,
    _ctx: *mut c_void,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters.
        let p = unsafe { p.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: forwarded contract.
        unsafe { add(ph, g, deps, n, Kind::Memcpy(CopyNode(*p))) }
    })
}

/// # Safety
/// As cuGraphAddEmptyNode.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { add(ph, g, deps, n, Kind::Empty) })
}

/// An event record or wait node of event `e`.
fn event_kind(ty: u32, e: CUevent) -> Result<Kind, CUresult> {
    event(e)?;
    Ok(if ty == node_type::EVENT_RECORD {
        Kind::EventRecord(e as usize)
    } else {
        Kind::EventWait(e as usize)
    })
}

/// # Safety
/// As cuGraphAddEventRecordNode.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddEventRecordNode(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    e: CUevent,
) -> CUresult {
    entry(|| {
        let kind = event_kind(node_type::EVENT_RECORD, e)?;
        // SAFETY: forwarded contract.
        unsafe { add(ph, g, deps, n, kind) }
    })
}

/// # Safety
/// As cuGraphAddEventWaitNode.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddEventWaitNode(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    e: CUevent,
) -> CUresult {
    entry(|| {
        let kind = event_kind(node_type::WAIT_EVENT, e)?;
        // SAFETY: forwarded contract.
        unsafe { add(ph, g, deps, n, kind) }
    })
}

/// Reads (`set` None) or replaces the event of an event node of type `ty`.
fn node_event(node: *mut GraphNode, ty: u32, set: Option<CUevent>) -> Result<CUevent, CUresult> {
    let (g, i) = locate(node).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if let Some(e) = set {
        event(e)?;
    }
    with(|r| {
        let n = r
            .graphs
            .get_mut(&g)
            .and_then(|b| b.nodes.get_mut(i))
            .and_then(|n| n.as_mut())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if n.kind.type_code() != ty {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if let Some(e) = set {
            n.kind = event_kind(ty, e)?;
        }
        match n.kind {
            Kind::EventRecord(e) | Kind::EventWait(e) => Ok(e as CUevent),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    })
}

/// The get and set calls of one kind of event node.
macro_rules! event_node_calls {
    ($($get:ident, $set:ident, $ty:expr;)*) => {$(
        /// # Safety
        /// `pe` is null or writable.
        #[no_mangle]
        pub unsafe extern "C" fn $get(node: *mut GraphNode, pe: *mut CUevent) -> CUresult {
            entry(|| {
                let e = node_event(node, $ty, None)?;
                // SAFETY: the caller's pointer.
                unsafe { out(pe, e) }
            })
        }

        #[no_mangle]
        pub extern "C" fn $set(node: *mut GraphNode, e: CUevent) -> CUresult {
            entry(|| node_event(node, $ty, Some(e)).map(drop))
        }
    )*};
}

event_node_calls! {
    cuGraphEventRecordNodeGetEvent, cuGraphEventRecordNodeSetEvent, node_type::EVENT_RECORD;
    cuGraphEventWaitNodeGetEvent, cuGraphEventWaitNodeSetEvent, node_type::WAIT_EVENT;
}

/// # Safety
/// As cuGraphAddChildGraphNode.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    child: CUgraph,
) -> CUresult {
    entry(|| {
        graph_ref(child)?;
        // The child is copied, as natively; a captured child is not supported yet.
        let Some(c) = built(child) else {
            return Err(crate::unsupported::unsupported(
                "a captured graph as a child node",
            ));
        };
        // SAFETY: forwarded contract.
        unsafe { add(ph, g, deps, n, Kind::Child(c)) }
    })
}

/// Adds (or removes) the edges `from[k] -> to[k]`.
///
/// # Safety
/// `from` and `to` hold `n` node handles each.
unsafe fn edges(
    g: CUgraph,
    from: *const *mut GraphNode,
    to: *const *mut GraphNode,
    n: usize,
    add: bool,
) -> Result<(), CUresult> {
    graph_ref(g)?;
    if !is_built(g) {
        return Err(crate::unsupported::unsupported(
            "editing the edges of a captured graph",
        ));
    }
    // SAFETY: forwarded contract.
    let (f, t) = unsafe { (dep_indices(g, from, n)?, dep_indices_loose(g, to, n)?) };
    with(|r| {
        let b = r
            .graphs
            .get_mut(&(g as usize))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        for (&a, &z) in f.iter().zip(&t) {
            let node = b.nodes[z].as_mut().ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let has = node.deps.contains(&a);
            match (add, has) {
                (true, false) if a != z => node.deps.push(a),
                (false, true) => node.deps.retain(|&d| d != a),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
        }
        Ok(())
    })
}

/// CUgraphNodeParams: the node type, then (at byte 16) the union of every kind's
/// parameters, 232 bytes, then 8 reserved.
#[repr(C)]
pub struct NodeParams {
    pub ty: c_uint,
    pub reserved0: [i32; 3],
    pub params: [u64; 29],
    pub reserved2: i64,
}

// The layouts cuda.h gives these structures.
const _: () = assert!(std::mem::size_of::<NodeParams>() == 256);
const _: () = assert!(std::mem::size_of::<KernelNodeParamsV2>() == 72);
const _: () = assert!(std::mem::size_of::<MemsetNodeParams>() == 40);
const _: () = assert!(std::mem::size_of::<Memcpy3D>() == 200);

/// CUDA_MEMCPY_NODE_PARAMS: flags, reserved, the copy's context, the copy.
#[repr(C)]
struct MemcpyNodeParams {
    flags: i32,
    reserved: i32,
    ctx: *mut c_void,
    copy: Memcpy3D,
}

/// The node a generic CUgraphNodeParams describes, for the kinds built graphs hold.
///
/// # Safety
/// `p` is a valid CUgraphNodeParams whose union member matches its type.
unsafe fn kind_from(p: &NodeParams) -> Result<Kind, CUresult> {
    let u = p.params.as_ptr() as *const u8;
    // SAFETY: each arm reads the union member its type names, at the union's start.
    unsafe {
        match p.ty {
            node_type::KERNEL => {
                let k = &*(u as *const KernelNodeParamsV2);
                Ok(Kind::Kernel(kernel_node(&k.v1, k.kern)?))
            }
            node_type::MEMSET => {
                let m = &*(u as *const MemsetNodeParams);
                memset_kind(m)
            }
            node_type::MEMCPY => {
                let m = &*(u as *const MemcpyNodeParams);
                Ok(Kind::Memcpy(CopyNode(m.copy)))
            }
            node_type::EMPTY => Ok(Kind::Empty),
            node_type::EVENT_RECORD | node_type::WAIT_EVENT => {
                let e = *(u as *const CUevent);
                event_kind(p.ty, e)
            }
            node_type::GRAPH => {
                let child = *(u as *const CUgraph);
                graph_ref(child)?;
                built(child).map(Kind::Child).ok_or_else(|| {
                    crate::unsupported::unsupported("a captured graph as a child node")
                })
            }
            _ => Err(crate::unsupported::unsupported(
                "cuGraphAddNode of this node type (host, memory, conditional)",
            )),
        }
    }
}

/// # Safety
/// As cuGraphAddNode.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    p: *const NodeParams,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters, per the contract.
        let kind = unsafe { kind_from(p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?) }?;
        // SAFETY: forwarded contract.
        unsafe { add(ph, g, deps, n, kind) }
    })
}

/// # Safety
/// As cuGraphAddNode_v2.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    data: *const u64,
    n: usize,
    p: *const NodeParams,
) -> CUresult {
    entry(|| {
        // SAFETY: forwarded contract.
        unsafe { default_edges(data, n) }?;
        // SAFETY: the caller's parameters, per the contract.
        let kind = unsafe { kind_from(p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?) }?;
        // SAFETY: forwarded contract.
        unsafe { add(ph, g, deps, n, kind) }
    })
}

/// As [`dep_indices`], but one node may appear more than once (several edges into it).
///
/// # Safety
/// `nodes` holds `n` node handles.
unsafe fn dep_indices_loose(
    g: CUgraph,
    nodes: *const *mut GraphNode,
    n: usize,
) -> Result<Vec<usize>, CUresult> {
    (0..n)
        .map(|k| {
            // SAFETY: per the contract, n readable handles.
            let d = unsafe { *nodes.add(k) };
            match locate(d) {
                Some((gr, i)) if gr == g as usize => Ok(i),
                _ => Err(CUDA_ERROR_INVALID_VALUE),
            }
        })
        .collect()
}

/// # Safety
/// As cuGraphAddDependencies.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddDependencies(
    g: CUgraph,
    from: *const *mut GraphNode,
    to: *const *mut GraphNode,
    n: usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { edges(g, from, to, n, true) })
}

/// Edge data other than the default (all zero) is not supported.
///
/// # Safety
/// `data` is null or holds `n` CUgraphEdgeData (8 bytes each).
unsafe fn default_edges(data: *const u64, n: usize) -> Result<(), CUresult> {
    if data.is_null() {
        return Ok(());
    }
    for k in 0..n {
        // SAFETY: per the contract.
        if unsafe { *data.add(k) } != 0 {
            return Err(crate::unsupported::unsupported(
                "graph edges with edge data",
            ));
        }
    }
    Ok(())
}

/// # Safety
/// As cuGraphAddDependencies_v2.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddDependencies_v2(
    g: CUgraph,
    from: *const *mut GraphNode,
    to: *const *mut GraphNode,
    data: *const u64,
    n: usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe {
        default_edges(data, n)?;
        edges(g, from, to, n, true)
    })
}

/// # Safety
/// As cuGraphRemoveDependencies.
#[no_mangle]
pub unsafe extern "C" fn cuGraphRemoveDependencies(
    g: CUgraph,
    from: *const *mut GraphNode,
    to: *const *mut GraphNode,
    n: usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { edges(g, from, to, n, false) })
}

/// Writes a node list the CUDA way: a null array asks for the count; otherwise up to
/// `*num` handles, the rest null, and `*num` becomes how many there are (at most `*num`).
///
/// # Safety
/// `num` is readable and writable; `list` null or room for `*num` handles.
pub(crate) unsafe fn write_nodes(
    list: *mut *mut GraphNode,
    num: *mut usize,
    v: &[*mut GraphNode],
) -> Result<(), CUresult> {
    if num.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if list.is_null() {
        // SAFETY: checked non-null.
        return unsafe { out(num, v.len()) };
    }
    // SAFETY: the caller's room for *num handles.
    unsafe {
        let room = num.read();
        for k in 0..room {
            list.add(k)
                .write(v.get(k).copied().unwrap_or(std::ptr::null_mut()));
        }
        num.write(room.min(v.len()));
    }
    Ok(())
}

/// The nodes `node` depends on (`dependents` false) or that depend on it.
fn neighbours(node: *mut GraphNode, dependents: bool) -> Result<Vec<*mut GraphNode>, CUresult> {
    let (g, i) = locate(node).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    with(|r| {
        let b = r.graphs.get(&g).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let dev = b.dev;
        let idx: Vec<usize> = if dependents {
            b.live()
                .filter(|(_, n)| n.deps.contains(&i))
                .map(|(k, _)| k)
                .collect()
        } else {
            b.nodes
                .get(i)
                .and_then(|n| n.as_ref())
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?
                .deps
                .clone()
        };
        Ok(idx.into_iter().map(|k| node_handle(r, g, k, dev)).collect())
    })
}

/// # Safety
/// As cuGraphNodeGetDependencies.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetDependencies(
    node: *mut GraphNode,
    deps: *mut *mut GraphNode,
    num: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { write_nodes(deps, num, &neighbours(node, false)?) })
}

/// # Safety
/// As cuGraphNodeGetDependentNodes.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetDependentNodes(
    node: *mut GraphNode,
    deps: *mut *mut GraphNode,
    num: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { write_nodes(deps, num, &neighbours(node, true)?) })
}

/// Writes default (all-zero) edge data for `n` edges where the caller asked for it.
///
/// # Safety
/// `data` is null or has room for `n` CUgraphEdgeData (8 bytes each).
unsafe fn zero_edges(data: *mut u64, n: usize) {
    if !data.is_null() {
        // SAFETY: per the contract.
        unsafe { std::ptr::write_bytes(data, 0, n) };
    }
}

/// As [`neighbours`] into the caller's list, with default edge data.
///
/// # Safety
/// As cuGraphNodeGetDependencies_v2.
unsafe fn neighbours_v2(
    node: *mut GraphNode,
    dependents: bool,
    list: *mut *mut GraphNode,
    data: *mut u64,
    num: *mut usize,
) -> Result<(), CUresult> {
    let v = neighbours(node, dependents)?;
    // SAFETY: forwarded contract.
    unsafe {
        write_nodes(list, num, &v)?;
        if !list.is_null() {
            zero_edges(data, num.read());
        }
    }
    Ok(())
}

/// # Safety
/// As cuGraphNodeGetDependencies_v2.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetDependencies_v2(
    node: *mut GraphNode,
    deps: *mut *mut GraphNode,
    data: *mut u64,
    num: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { neighbours_v2(node, false, deps, data, num) })
}

/// # Safety
/// As cuGraphNodeGetDependentNodes_v2.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetDependentNodes_v2(
    node: *mut GraphNode,
    deps: *mut *mut GraphNode,
    data: *mut u64,
    num: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { neighbours_v2(node, true, deps, data, num) })
}

/// # Safety
/// As cuGraphRemoveDependencies_v2.
#[no_mangle]
pub unsafe extern "C" fn cuGraphRemoveDependencies_v2(
    g: CUgraph,
    from: *const *mut GraphNode,
    to: *const *mut GraphNode,
    data: *const u64,
    n: usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe {
        default_edges(data, n)?;
        edges(g, from, to, n, false)
    })
}

/// A node's counterpart in a clone: the clone keeps every node's index.
///
/// # Safety
/// `ph` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeFindInClone(
    ph: *mut *mut GraphNode,
    original: *mut GraphNode,
    clone: CUgraph,
) -> CUresult {
    entry(|| {
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (_, i) = locate(original).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let h = with(|r| {
            let b = r
                .graphs
                .get(&(clone as usize))
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let dev = b.dev;
            b.nodes
                .get(i)
                .and_then(|n| n.as_ref())
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            Ok::<_, CUresult>(node_handle(r, clone as usize, i, dev))
        })?;
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(ph, h) }
    })
}

/// The nodes of built graph `g` that wait for none.
///
/// # Safety
/// As cuGraphGetRootNodes.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetRootNodes(
    g: CUgraph,
    roots: *mut *mut GraphNode,
    num: *mut usize,
) -> CUresult {
    entry(|| {
        graph_ref(g)?;
        let v = with(|r| {
            let b = r.graphs.get(&(g as usize))?;
            let (dev, idx): (usize, Vec<usize>) = (
                b.dev,
                b.live()
                    .filter(|(_, n)| n.deps.is_empty())
                    .map(|(i, _)| i)
                    .collect(),
            );
            Some(
                idx.into_iter()
                    .map(|i| node_handle(r, g as usize, i, dev))
                    .collect::<Vec<_>>(),
            )
        });
        let Some(v) = v else {
            return Err(crate::unsupported::unsupported(
                "cuGraphGetRootNodes of a captured graph",
            ));
        };
        // SAFETY: forwarded contract.
        unsafe { write_nodes(roots, num, &v) }
    })
}

#[no_mangle]
pub extern "C" fn cuGraphDestroyNode(node: *mut GraphNode) -> CUresult {
    entry(|| {
        let (g, i) = locate(node).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        with(|r| {
            let b = r.graphs.get_mut(&g).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            b.nodes
                .get_mut(i)
                .and_then(|n| n.take())
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            for n in b.nodes.iter_mut().flatten() {
                n.deps.retain(|&d| d != i);
            }
            r.nodes.remove(&(node as usize));
            r.handles.remove(&(g, i));
            Ok(())
        })
    })
}

/// # Safety
/// `ph` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphClone(ph: *mut CUgraph, original: CUgraph) -> CUresult {
    entry(|| {
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let gr = graph_ref(original)?;
        let Some(b) = built(original) else {
            return Err(crate::unsupported::unsupported(
                "cuGraphClone of a captured graph",
            ));
        };
        let h = leak(GraphHandle::new(GRAPH_MAGIC, 0, gr.dev));
        with(|r| r.graphs.insert(h as usize, b));
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(ph, h) }
    })
}

/// A node of the flat graph that is issued: a child graph's nodes are inlined.
struct Flat {
    kind: Kind,
    deps: Vec<usize>,
}

/// Inlines child graphs: a child's roots wait for what the child node waited for, and
/// whatever waited for the child node waits for all the child's nodes.
fn flatten(b: &Built, out: &mut Vec<Flat>, outer_deps: &[usize]) -> Vec<Option<Vec<usize>>> {
    // For each node of `b`, the flat indices that stand for its completion.
    let mut done: Vec<Option<Vec<usize>>> = vec![None; b.nodes.len()];
    let order = topo(b).unwrap_or_default();
    for i in order {
        let n = b.nodes[i].as_ref().expect("topo lists live nodes");
        let mut deps: Vec<usize> = n
            .deps
            .iter()
            .flat_map(|&d| done[d].clone().unwrap_or_default())
            .collect();
        if n.deps.is_empty() {
            deps.extend_from_slice(outer_deps);
        }
        match &n.kind {
            Kind::Child(c) => {
                let inner = flatten(c, out, &deps);
                let mut ends: Vec<usize> = inner.into_iter().flatten().flatten().collect();
                if ends.is_empty() {
                    ends = deps;
                }
                ends.sort_unstable();
                ends.dedup();
                done[i] = Some(ends);
            }
            k => {
                out.push(Flat {
                    kind: k.clone(),
                    deps,
                });
                done[i] = Some(vec![out.len() - 1]);
            }
        }
    }
    done
}

/// The live nodes in an order where every node follows its dependencies; None if the
/// edges form a cycle.
fn topo(b: &Built) -> Option<Vec<usize>> {
    let mut pending: HashMap<usize, usize> = b.live().map(|(i, n)| (i, n.deps.len())).collect();
    let mut ready: Vec<usize> = {
        let mut v: Vec<usize> = pending
            .iter()
            .filter(|(_, &k)| k == 0)
            .map(|(&i, _)| i)
            .collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v
    };
    let mut order = Vec::with_capacity(pending.len());
    while let Some(i) = ready.pop() {
        order.push(i);
        let mut next: Vec<usize> = b
            .live()
            .filter(|(_, n)| n.deps.contains(&i))
            .filter_map(|(k, _)| {
                let left = pending.get_mut(&k)?;
                *left -= 1;
                (*left == 0).then_some(k)
            })
            .collect();
        next.sort_unstable_by(|a, b| b.cmp(a));
        ready.extend(next);
    }
    (order.len() == pending.len()).then_some(order)
}

/// Which private stream each flat node goes on: a node continues the stream of one of
/// its dependencies when that dependency is the stream's last node, and otherwise opens
/// a new stream. Returns the stream of each node and how many streams there are.
fn lanes(flat: &[Flat]) -> (Vec<usize>, usize) {
    let mut lane_of: Vec<usize> = Vec::with_capacity(flat.len());
    let mut tails: Vec<Option<usize>> = vec![None];
    for (i, n) in flat.iter().enumerate() {
        let lane = n
            .deps
            .iter()
            .map(|&d| lane_of[d])
            .find(|&l| tails[l].is_some_and(|t| n.deps.contains(&t)))
            .or_else(|| tails.iter().position(|t| t.is_none()))
            .unwrap_or_else(|| {
                tails.push(None);
                tails.len() - 1
            });
        tails[lane] = Some(i);
        lane_of.push(lane);
    }
    (lane_of, tails.len())
}

/// Streams and events made for one instantiation, destroyed with it.
struct Scratch {
    streams: Vec<CUstream>,
    events: Vec<CUevent>,
}

impl Scratch {
    fn stream(&mut self) -> Result<CUstream, CUresult> {
        let mut s = std::ptr::null_mut();
        const NON_BLOCKING: c_uint = 1;
        // SAFETY: a valid out-pointer.
        ok(unsafe { super::exec::cuStreamCreate(&mut s, NON_BLOCKING) })?;
        self.streams.push(s);
        Ok(s)
    }

    fn event_on(&mut self, s: CUstream) -> Result<CUevent, CUresult> {
        let mut e = std::ptr::null_mut();
        const DISABLE_TIMING: c_uint = 2;
        // SAFETY: a valid out-pointer.
        ok(unsafe { cuEventCreate(&mut e, DISABLE_TIMING) })?;
        self.events.push(e);
        ok(cuEventRecord(e, s))?;
        Ok(e)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for &e in &self.events {
            cuEventDestroy_v2(e);
        }
        for &s in &self.streams {
            // SAFETY: a stream this instantiation made and nothing else holds.
            unsafe { cuStreamDestroy_v2(s) };
        }
    }
}

fn ok(r: CUresult) -> Result<(), CUresult> {
    if r == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(r)
    }
}

/// Issues one node on stream `s`.
fn issue(kind: &Kind, s: CUstream) -> Result<(), CUresult> {
    match kind {
        Kind::Empty | Kind::Child(_) => Ok(()),
        Kind::Kernel(k) => {
            const BUFFER_POINTER: usize = 1;
            const BUFFER_SIZE: usize = 2;
            let mut size = k.args.len();
            let mut extra: [*mut c_void; 5] = [
                BUFFER_POINTER as *mut c_void,
                k.args.as_ptr() as *mut c_void,
                BUFFER_SIZE as *mut c_void,
                &mut size as *mut usize as *mut c_void,
                std::ptr::null_mut(),
            ];
            let [gx, gy, gz] = k.grid;
            let [bx, by, bz] = k.block;
            // SAFETY: `extra` lays out the packed arguments of this very function.
            ok(unsafe {
                cuLaunchKernel(
                    k.func as CUfunction,
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    k.shared,
                    s,
                    std::ptr::null_mut(),
                    extra.as_mut_ptr(),
                )
            })
        }
        &Kind::Memset {
            dst,
            pitch,
            value,
            elem,
            width,
            height,
        } => super::mem::memset_2d(dst, pitch, value, elem, width, height, s),
        Kind::Memcpy(c) => {
            // SAFETY: the description the caller gave; its host pointers are the caller's.
            ok(unsafe { cuMemcpy3DAsync_v2(&c.0, s) })
        }
        // The external forms: in a capture, nodes of the graph rather than edges.
        &Kind::EventRecord(e) => ok(cuEventRecordWithFlags(e as CUevent, s, 1)),
        &Kind::EventWait(e) => ok(cuStreamWaitEvent(s, e as CUevent, 1)),
    }
}

/// Captures built graph `b` on the server and returns the server's graph id: the
/// caller instantiates it and then lets it go.
pub(crate) fn capture(b: &Built) -> Result<u32, CUresult> {
    topo(b).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut flat = Vec::new();
    flatten(b, &mut flat, &[]);
    let (lane_of, n_lanes) = lanes(&flat);
    // Which nodes another stream waits for: those get an event after them.
    let mut needed = vec![false; flat.len()];
    for (i, n) in flat.iter().enumerate() {
        for &d in &n.deps {
            if lane_of[d] != lane_of[i] {
                needed[d] = true;
            }
        }
    }
    let mut sc = Scratch {
        streams: Vec::new(),
        events: Vec::new(),
    };
    let streams: Vec<CUstream> = (0..n_lanes)
        .map(|_| sc.stream())
        .collect::<Result<_, _>>()?;
    ok(cuStreamBeginCapture_v2(streams[0], MODE_RELAXED))?;
    let issued = (|| {
        let fork = sc.event_on(streams[0])?;
        let mut started = vec![false; n_lanes];
        started[0] = true;
        let mut after: Vec<Option<CUevent>> = vec![None; flat.len()];
        for (i, n) in flat.iter().enumerate() {
            let s = streams[lane_of[i]];
            let mut joined = started[lane_of[i]];
            for &d in &n.deps {
                if lane_of[d] != lane_of[i] {
                    ok(cuStreamWaitEvent(
                        s,
                        after[d].expect("recorded after it"),
                        0,
                    ))?;
                    joined = true;
                }
            }
            if !joined {
                // A root on a stream of its own joins the capture at its start.
                ok(cuStreamWaitEvent(s, fork, 0))?;
            }
            started[lane_of[i]] = true;
            issue(&n.kind, s)?;
            if needed[i] {
                after[i] = Some(sc.event_on(s)?);
            }
        }
        for (l, &s) in streams.iter().enumerate().skip(1) {
            if started[l] {
                let e = sc.event_on(s)?;
                ok(cuStreamWaitEvent(streams[0], e, 0))?;
            }
        }
        Ok(())
    })();
    let mut g: CUgraph = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let ended = ok(unsafe { cuStreamEndCapture(streams[0], &mut g) });
    issued.and(ended)?;
    let h = graph_ref(g)?;
    let id = h.id();
    // The handle was only the vehicle; the server's graph is the caller's to release.
    let _ = crate::handles::retire(&h.magic, GRAPH_MAGIC);
    Ok(id)
}

/// Whether executable graph `e` (made from `from`) can take the parameters of `to`.
pub(crate) fn same_topology(from: &Built, to: &Built) -> bool {
    from.topology() == to.topology()
}

/// The graph an executable graph was made from, and its flags, if it was built here.
pub(crate) fn source_of(e: usize) -> Option<(Built, u64)> {
    with(|r| r.sources.get(&e).cloned())
}

/// Sets kernel node `node`'s parameters in the graph executable graph `e` was made from
/// (the node belongs to the original graph; its index is the same in the copy). Ok(None)
/// when `e` was not made from a built graph.
pub(crate) fn set_exec_kernel(
    e: usize,
    node: *mut GraphNode,
    k: KernelNode,
) -> Result<Option<(Built, u64)>, CUresult> {
    let Some((_, i)) = locate(node) else {
        return if source_of(e).is_some() {
            Err(CUDA_ERROR_INVALID_VALUE)
        } else {
            Ok(None)
        };
    };
    with(|r| {
        let Some((b, flags)) = r.sources.get_mut(&e) else {
            return Ok(None);
        };
        match b.nodes.get_mut(i).and_then(|n| n.as_mut()) {
            Some(Node {
                kind: Kind::Kernel(old),
                ..
            }) => {
                *old = k;
                Ok(Some((b.clone(), *flags)))
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    })
}

/// A kernel node from v1 or v2 parameters, for an executable graph's update.
///
/// # Safety
/// As [`kernel_node`].
pub(crate) unsafe fn kernel_from(
    p: &KernelNodeParams,
    kern: CUfunction,
) -> Result<KernelNode, CUresult> {
    // SAFETY: forwarded contract.
    unsafe { kernel_node(p, kern) }
}
