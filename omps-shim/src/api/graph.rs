//! Graphs and executable graphs: a captured graph and every executable graph are the
//! server's, named here by handles; a graph built by hand lives in the shim until it is
//! instantiated (graph_build.rs). A graph launch is a record in the ring, like a kernel
//! launch: no round trip.

use super::graph_build::{self as build, GraphNodeRef};
use crate::cuda::*;
use crate::handles::{
    leak, resolve, retire, GraphHandle, GraphNode, EXEC_MAGIC, GRAPH_MAGIC, NODE_MAGIC,
};
use crate::state::entry::{entry, live, out};
use crate::state::streams::{per_thread, CUstream};
use omps_ring::wire::{self, GraphInstantiate, Op};
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

pub use crate::state::capture::CUgraph;
pub type CUgraphExec = *mut GraphHandle;

fn graph(g: CUgraph) -> Result<&'static GraphHandle, CUresult> {
    // SAFETY: the caller passed a graph handle, as the API requires.
    let h = unsafe { resolve(g as *const GraphHandle, GRAPH_MAGIC) }?;
    if h.id() == crate::state::capture::IN_CAPTURE && !build::is_built(g) {
        // The graph of a capture still going lives in the server's capture; only user
        // objects can be moved into it meanwhile.
        return Err(crate::unsupported::unsupported(
            "using a graph before its capture ends (other than retaining user objects)",
        ));
    }
    Ok(h)
}

fn exec(e: CUgraphExec) -> Result<&'static GraphHandle, CUresult> {
    // SAFETY: the caller passed an executable-graph handle, as the API requires.
    unsafe { resolve(e as *const GraphHandle, EXEC_MAGIC) }
}

/// Instantiates the server's graph `graph`: the executable graph's id.
fn instantiate_id(dev: usize, graph: u32, flags: u64) -> Result<u32, CUresult> {
    let c = live()?;
    let mut ch = c.channel();
    ch.call(dev, Op::GraphInstantiate, |call| {
        bytemuck::bytes_of(&GraphInstantiate {
            call,
            graph,
            _pad: 0,
            flags,
        })
        .to_vec()
    })?;
    Ok(ch.reply::<wire::U64Reply>().value as u32)
}

/// Lets the server's graph `id` go (pushed after whatever used it).
fn release(dev: usize, op: Op, id: u32) -> Result<(), CUresult> {
    live()?.push(
        dev,
        op,
        &[bytemuck::bytes_of(&wire::Handle { id, _pad: 0 })],
    )
}

/// An executable graph of built graph `b`: captured on the server, instantiated, and the
/// captured graph let go.
/// What the capture held (api/staged.rs) goes with the executable graph: the caller
/// gives it to its handle.
fn instantiate_built(
    dev: usize,
    b: &build::Built,
    flags: u64,
) -> Result<(u32, Vec<(usize, u64)>), CUresult> {
    let r = build::capture_then(b, |g| instantiate_id(dev, g, flags));
    let held = super::staged::take_adopted();
    match r {
        Ok(id) => Ok((id, held)),
        Err(e) => {
            super::user_object::drop_taken(held);
            Err(e)
        }
    }
}

fn instantiate(pexec: *mut CUgraphExec, g: CUgraph, flags: u64) -> Result<(), CUresult> {
    if pexec.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH: a kernel would launch the graph by its
    // handle, and the handle a client holds is the shim's, not the driver's.
    const DEVICE_LAUNCH: u64 = 4;
    if flags & DEVICE_LAUNCH != 0 {
        return Err(crate::unsupported::unsupported(
            "graphs launched from the device (CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)",
        ));
    }
    let gr = graph(g)?;
    let source = build::built(g);
    let (id, held) = match &source {
        Some(b) => instantiate_built(gr.dev, b, flags)?,
        None => (instantiate_id(gr.dev, gr.id(), flags)?, Vec::new()),
    };
    let h = leak(GraphHandle::new(EXEC_MAGIC, id, gr.dev));
    super::user_object::share(g as usize, h as usize);
    super::user_object::give(h as usize, held);
    match source {
        Some(b) => {
            super::graph_mem::note_exec(h as usize, build::unfreed(&b), flags);
            build::note_source(h as usize, b, flags, Some(g as usize));
        }
        None => {
            build::note_captured_flags(h as usize, flags);
            super::graph_mem::share(g as usize, h as usize);
            let allocs = super::graph_mem::held_by(g as usize);
            super::graph_mem::note_exec(h as usize, allocs, flags);
        }
    }
    // SAFETY: checked non-null; the caller's pointer.
    unsafe { out(pexec, h) }
}

/// # Safety
/// `pexec` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    pexec: *mut CUgraphExec,
    g: CUgraph,
    flags: u64,
) -> CUresult {
    entry(|| instantiate(pexec, g, flags))
}

/// CUDA 10 and 11's form: an error node and a log, which omps leaves empty (the driver's
/// own instantiation errors come back as the result).
///
/// # Safety
/// `pexec` is null or writable; `err_node` null or writable; `log` null or `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    pexec: *mut CUgraphExec,
    g: CUgraph,
    err_node: *mut *mut c_void,
    log: *mut u8,
    size: usize,
) -> CUresult {
    entry(|| {
        if !err_node.is_null() {
            // SAFETY: checked non-null; the caller's pointer.
            unsafe { err_node.write(std::ptr::null_mut()) };
        }
        if !log.is_null() && size > 0 {
            // SAFETY: the caller gave `size` bytes.
            unsafe { log.write(0) };
        }
        instantiate(pexec, g, 0)
    })
}

/// # Safety
/// As [`cuGraphInstantiate_v2`].
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate(
    pexec: *mut CUgraphExec,
    g: CUgraph,
    err_node: *mut *mut c_void,
    log: *mut u8,
    size: usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuGraphInstantiate_v2(pexec, g, err_node, log, size) }
}

/// CUDA_GRAPH_INSTANTIATE_PARAMS.
#[repr(C)]
pub struct InstantiateParams {
    flags: u64,
    upload_stream: CUstream,
    err_node_out: *mut c_void,
    result_out: c_uint,
}

/// # Safety
/// `pexec` is null or writable; `params` null or a readable and writable struct.
#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    pexec: *mut CUgraphExec,
    g: CUgraph,
    params: *mut InstantiateParams,
) -> CUresult {
    entry(|| {
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-null; the caller's struct.
        let p = unsafe { &mut *params };
        // CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD belongs to this call, not to the driver's
        // cuGraphInstantiateWithFlags: the upload is queued here.
        const UPLOAD: u64 = 2;
        let r = instantiate(pexec, g, p.flags & !UPLOAD);
        p.err_node_out = std::ptr::null_mut();
        // CUgraphInstantiateResult: success, or a generic error.
        p.result_out = if r.is_ok() { 0 } else { 1 };
        r?;
        if p.flags & UPLOAD != 0 {
            // SAFETY: instantiate() wrote a valid executable graph.
            return launch(Op::GraphUpload, unsafe { pexec.read() }, p.upload_stream);
        }
        Ok(())
    })
}

fn launch(op: Op, e: CUgraphExec, s: CUstream) -> Result<(), CUresult> {
    let ex = exec(e)?;
    let resolved = crate::state::streams::resolve_stream(s)?;
    let (stream, dev) = crate::state::streams::resolved_id_dev(resolved)?;
    if dev != ex.dev {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    if op == Op::GraphLaunch {
        super::graph_mem::launching(e as usize)?;
        // The stream itself, not the handle: a per-thread default stream's handle names
        // another stream in another thread, where an update or a destroy may run.
        let last = resolved.map_or(crate::state::streams::CU_STREAM_LEGACY, |st| {
            st as *const _ as usize
        });
        ex.last_stream.store(last, Ordering::Release);
        let ev = ex.wait_first.swap(0, Ordering::AcqRel);
        if ev != 0 {
            // The first launch since an update: after the last one before it.
            let ev = ev as crate::state::streams::CUevent;
            let waited = super::exec::cuStreamWaitEvent(s, ev, 0);
            super::exec::cuEventDestroy_v2(ev);
            if waited != CUDA_SUCCESS {
                return Err(waited);
            }
        }
    }
    let l = wire::GraphLaunch {
        exec: ex.id(),
        stream,
    };
    live()?.push(dev, op, &[bytemuck::bytes_of(&l)])
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch(e: CUgraphExec, s: CUstream) -> CUresult {
    entry(|| launch(Op::GraphLaunch, e, s))
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch_ptsz(e: CUgraphExec, s: CUstream) -> CUresult {
    per_thread(|| cuGraphLaunch(e, s))
}

#[no_mangle]
pub extern "C" fn cuGraphUpload(e: CUgraphExec, s: CUstream) -> CUresult {
    entry(|| launch(Op::GraphUpload, e, s))
}

#[no_mangle]
pub extern "C" fn cuGraphUpload_ptsz(e: CUgraphExec, s: CUstream) -> CUresult {
    per_thread(|| cuGraphUpload(e, s))
}

fn destroy(h: &GraphHandle, magic: u32, op: Op) -> Result<(), CUresult> {
    retire(&h.magic, magic)?;
    live()?.push(
        h.dev,
        op,
        &[bytemuck::bytes_of(&wire::Handle {
            id: h.id(),
            _pad: 0,
        })],
    )
}

#[no_mangle]
pub extern "C" fn cuGraphDestroy(g: CUgraph) -> CUresult {
    entry(|| {
        let gr = graph(g)?;
        if build::is_built(g) {
            retire(&gr.magic, GRAPH_MAGIC)?;
            build::forget(g);
        } else {
            destroy(gr, GRAPH_MAGIC, Op::GraphDestroy)?;
            super::graph_mem::release(g as usize);
        }
        super::user_object::graph_gone(g as usize);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(e: CUgraphExec) -> CUresult {
    entry(|| {
        let ex = exec(e)?;
        destroy(ex, EXEC_MAGIC, Op::GraphExecDestroy)?;
        build::forget_exec(e as usize);
        super::graph_mem::release(e as usize);
        super::user_object::exec_gone(ex);
        let ev = ex.wait_first.swap(0, Ordering::AcqRel);
        if ev != 0 {
            super::exec::cuEventDestroy_v2(ev as crate::state::streams::CUevent);
        }
        Ok(())
    })
}

/// `ex` became a new driver executable graph: its next launch must come after the last
/// launch of the old one, as launches of one executable graph do.
fn order_after_last_launch(ex: &GraphHandle) {
    let last = ex.last_stream.load(Ordering::Acquire);
    // None yet, or an earlier update's event already orders after the last launch.
    if last == crate::handles::NEVER || ex.wait_first.load(Ordering::Acquire) != 0 {
        return;
    }
    let mut ev = std::ptr::null_mut();
    const DISABLE_TIMING: c_uint = 2;
    // SAFETY: a valid out-pointer.
    if unsafe { super::exec::cuEventCreate(&mut ev, DISABLE_TIMING) } != CUDA_SUCCESS {
        return;
    }
    if super::exec::cuEventRecord(ev, last as CUstream) == CUDA_SUCCESS {
        ex.wait_first.store(ev as usize, Ordering::Release);
    } else {
        super::exec::cuEventDestroy_v2(ev);
    }
}

/// Points executable graph `ex` at a new server executable; the old one is let go after
/// the launches already queued (the server frees it once they are done).
/// Executable graph `ex` made anew from built graph `b`: instantiated again and swapped
/// in; or, for a graph with conditional nodes (which the driver instantiates only once),
/// captured again and given to the same executable graph by the driver's update.
fn remake_built(ex: &GraphHandle, b: &build::Built, flags: u64) -> Result<(), CUresult> {
    if !build::has_conditionals(b) {
        let (id, held) = instantiate_built(ex.dev, b, flags)?;
        rebind(ex, id)?;
        // The old one's staged copies go after its last launch.
        super::user_object::exec_remade(ex, held);
        return Ok(());
    }
    let r = build::capture_then(b, |g| {
        let e = ex.id();
        build::cond_call(ex.dev, wire::graph::EXEC_UPDATE, |c| {
            c.graph = g;
            c.handle = e as u64;
        })?;
        Ok(e)
    });
    let held = super::staged::take_adopted();
    match r {
        Ok(_) => {
            super::user_object::exec_remade(ex, held);
            Ok(())
        }
        Err(e) => {
            super::user_object::drop_taken(held);
            Err(e)
        }
    }
}

fn rebind(ex: &GraphHandle, id: u32) -> Result<(), CUresult> {
    order_after_last_launch(ex);
    let old = ex.id.swap(id, Ordering::AcqRel);
    release(ex.dev, Op::GraphExecDestroy, old)
}

/// An executable graph's node takes new parameters (of its kind): the executable graph is
/// made again from its source with them (the driver's results; it costs an
/// instantiation).
fn set_exec_node(e: CUgraphExec, node: GraphNodeRef, kind: build::Kind) -> Result<(), CUresult> {
    let ex = exec(e)?;
    let Some((b, flags)) = build::set_exec_node(e as usize, node, kind)? else {
        return Err(crate::unsupported::unsupported(
            "setting node parameters of an executable graph made from a captured graph",
        ));
    };
    remake_built(ex, &b, flags)?;
    build::note_changed_source(e as usize, b, flags);
    Ok(())
}

/// The calls that give an executable graph's node new parameters of its kind (memset and
/// memcpy also name a context, the graph's device's here).
macro_rules! exec_set_calls {
    ($($name:ident($params:ty) => $kind:path $(, $ctx:ident)?;)*) => {$(
        /// # Safety
        /// `p` is null or valid.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            e: CUgraphExec,
            node: GraphNodeRef,
            p: *const $params,
            $($ctx: *mut c_void,)?
        ) -> CUresult {
            entry(|| {
                // SAFETY: the caller's parameters.
                #[allow(unused_unsafe)]
                let kind = unsafe { $kind(p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?) }?;
                set_exec_node(e, node, kind)
            })
        }
    )*};
}

exec_set_calls! {
    cuGraphExecKernelNodeSetParams(build::KernelNodeParams) => build::kernel_kind_v1;
    cuGraphExecKernelNodeSetParams_v2(build::KernelNodeParamsV2) => build::kernel_kind_v2;
    cuGraphExecMemsetNodeSetParams(build::MemsetNodeParams) => build::memset_kind, _ctx;
    cuGraphExecMemcpyNodeSetParams(super::hostmem::Memcpy3D) => build::copy_kind, _ctx;
    cuGraphExecHostNodeSetParams(build::HostNodeParams) => build::host_kind;
}

/// The calls that give an executable graph's event node another event.
macro_rules! exec_event_calls {
    ($($name:ident => $ty:expr;)*) => {$(
        #[no_mangle]
        pub extern "C" fn $name(e: CUgraphExec, node: GraphNodeRef, ev: crate::state::streams::CUevent) -> CUresult {
            entry(|| set_exec_node(e, node, build::event_kind($ty, ev)?))
        }
    )*};
}

exec_event_calls! {
    cuGraphExecEventRecordNodeSetEvent => build::node_type::EVENT_RECORD;
    cuGraphExecEventWaitNodeSetEvent => build::node_type::WAIT_EVENT;
}

/// CUgraphExecUpdateResultInfo.
#[repr(C)]
pub struct ExecUpdateResultInfo {
    pub result: c_uint,
    pub error_node: GraphNodeRef,
    pub error_from_node: GraphNodeRef,
}

/// CUgraphExecUpdateResult: success, or the topology changed.
const UPDATE_SUCCESS: c_uint = 0;
const UPDATE_TOPOLOGY_CHANGED: c_uint = 2;
/// CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE.
const GRAPH_EXEC_UPDATE_FAILURE: CUresult = 910;

/// Updates executable graph `e` to the parameters of graph `g`, which must have its
/// topology: for a built graph, the same node kinds and edges; for a captured one, the
/// same node kinds in order. The executable graph is made again from `g`.
fn exec_update(e: CUgraphExec, g: CUgraph) -> Result<c_uint, CUresult> {
    let ex = exec(e)?;
    let gr = graph(g)?;
    if gr.dev != ex.dev {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let id = match (build::source_of(e as usize), build::built(g)) {
        (Some((from, flags)), Some(to)) => {
            if !build::same_topology(&from, &to) {
                return Ok(UPDATE_TOPOLOGY_CHANGED);
            }
            remake_built(ex, &to, flags)?;
            build::note_source(e as usize, to, flags, None);
            return Ok(UPDATE_SUCCESS);
        }
        (None, None) => {
            let types = |id: u32| -> Result<Vec<u64>, CUresult> {
                let h = GraphHandle::new(GRAPH_MAGIC, id, gr.dev);
                let n = graph_query(&h, wire::graph::NODE_COUNT, 0)?;
                (0..n as u32)
                    .map(|i| graph_query(&h, wire::graph::NODE_TYPE, i))
                    .collect()
            };
            let now = types(gr.id())?;
            if build::captured_source(e as usize).is_some_and(|before| before != now) {
                return Ok(UPDATE_TOPOLOGY_CHANGED);
            }
            let id = instantiate_id(ex.dev, gr.id(), build::captured_flags(e as usize))?;
            build::note_captured_source(e as usize, now);
            let flags = build::captured_flags(e as usize);
            super::graph_mem::exec_remade(g as usize, e as usize, flags);
            id
        }
        _ => return Ok(UPDATE_TOPOLOGY_CHANGED),
    };
    rebind(ex, id)?;
    // It replays `g`'s staged copies now: it holds their buffers, and lets its old ones go
    // after its last launch.
    super::user_object::exec_remade(ex, super::user_object::internal_of(g as usize));
    Ok(UPDATE_SUCCESS)
}

/// # Safety
/// `info` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecUpdate_v2(
    e: CUgraphExec,
    g: CUgraph,
    info: *mut ExecUpdateResultInfo,
) -> CUresult {
    entry(|| {
        if info.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let r = exec_update(e, g)?;
        let v = ExecUpdateResultInfo {
            result: r,
            error_node: std::ptr::null_mut(),
            error_from_node: std::ptr::null_mut(),
        };
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(info, v) }?;
        if r == UPDATE_SUCCESS {
            Ok(())
        } else {
            Err(GRAPH_EXEC_UPDATE_FAILURE)
        }
    })
}

/// CUDA 11's form: the failing node and the result through two pointers.
///
/// # Safety
/// `error_node` and `result` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecUpdate(
    e: CUgraphExec,
    g: CUgraph,
    error_node: *mut GraphNodeRef,
    result: *mut c_uint,
) -> CUresult {
    entry(|| {
        let r = exec_update(e, g)?;
        // SAFETY: the caller's pointers, each written only when given.
        unsafe {
            if !error_node.is_null() {
                error_node.write(std::ptr::null_mut());
            }
            if !result.is_null() {
                result.write(r);
            }
        }
        if r == UPDATE_SUCCESS {
            Ok(())
        } else {
            Err(GRAPH_EXEC_UPDATE_FAILURE)
        }
    })
}

fn graph_query(g: &GraphHandle, kind: u32, index: u32) -> Result<u64, CUresult> {
    let c = live()?;
    let mut ch = c.channel();
    ch.call(g.dev, Op::GraphQuery, |call| {
        bytemuck::bytes_of(&wire::GraphQuery {
            call,
            graph: g.id(),
            kind,
            index,
            _pad: 0,
        })
        .to_vec()
    })?;
    Ok(ch.reply::<wire::U64Reply>().value)
}

/// One handle per (graph, index), so a node compares equal to itself across calls.
fn node_handle(g: &GraphHandle, index: u32) -> *mut GraphNode {
    type Nodes = std::collections::HashMap<(usize, u32, u32), usize>;
    static NODES: std::sync::Mutex<Option<Nodes>> = std::sync::Mutex::new(None);
    let mut m = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let p = *m
        .get_or_insert_with(Default::default)
        .entry((g.dev, g.id(), index))
        .or_insert_with(|| {
            leak(GraphNode {
                magic: AtomicU32::new(NODE_MAGIC),
                graph: g.id(),
                index,
                dev: g.dev,
            }) as usize
        });
    p as *mut GraphNode
}

/// The nodes of a graph (PyTorch counts a captured graph's nodes to warn of an empty
/// capture). A null array asks for the count.
///
/// # Safety
/// `num` is null or readable and writable; `nodes` null or room for `*num` handles.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(
    g: CUgraph,
    nodes: *mut *mut GraphNode,
    num: *mut usize,
) -> CUresult {
    entry(|| {
        let gr = graph(g)?;
        if let Some(v) = build::node_handles(g) {
            // SAFETY: forwarded contract.
            return unsafe { build::write_nodes(nodes, num, &v) };
        }
        if num.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let count = graph_query(gr, wire::graph::NODE_COUNT, 0)? as usize;
        if nodes.is_null() {
            // SAFETY: checked non-null; the caller's pointer.
            return unsafe { out(num, count) };
        }
        // SAFETY: the caller's pointers: `*num` slots.
        unsafe {
            let room = num.read();
            for i in 0..room {
                let h = if i < count {
                    node_handle(gr, i as u32)
                } else {
                    std::ptr::null_mut()
                };
                nodes.add(i).write(h);
            }
            num.write(room.min(count));
        }
        Ok(())
    })
}

/// # Safety
/// `ty` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetType(node: *mut GraphNode, ty: *mut c_uint) -> CUresult {
    entry(|| {
        // SAFETY: the caller passed a node handle, as the API requires.
        let n = unsafe { resolve(node as *const GraphNode, NODE_MAGIC) }?;
        if let Some(t) = build::built_node_type(node) {
            // SAFETY: the caller's pointer.
            return unsafe { out(ty, t?) };
        }
        let g = GraphHandle::new(GRAPH_MAGIC, n.graph, n.dev);
        let t = graph_query(&g, wire::graph::NODE_TYPE, n.index)? as c_uint;
        // SAFETY: the caller's pointer.
        unsafe { out(ty, t) }
    })
}

/// The flags an executable graph was instantiated with.
///
/// # Safety
/// `flags` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecGetFlags(e: CUgraphExec, flags: *mut u64) -> CUresult {
    entry(|| {
        exec(e)?;
        let f = match build::source_of(e as usize) {
            Some((_, f)) => f,
            None => build::captured_flags(e as usize),
        };
        // SAFETY: the caller's pointer.
        unsafe { out(flags, f) }
    })
}

/// Enables or disables a kernel, memset or memcpy node of an executable graph made from a
/// graph built by hand: the executable graph is made again with the node doing nothing
/// (its place in the order kept), as its parameters are set.
#[no_mangle]
pub extern "C" fn cuGraphNodeSetEnabled(
    e: CUgraphExec,
    node: GraphNodeRef,
    enabled: c_uint,
) -> CUresult {
    entry(|| {
        let ex = exec(e)?;
        let Some((b, flags)) = build::set_exec_enabled(e as usize, node, enabled != 0)? else {
            return Err(crate::unsupported::unsupported(
                "enabling nodes of an executable graph made from a captured graph",
            ));
        };
        remake_built(ex, &b, flags)?;
        build::note_changed_source(e as usize, b, flags);
        Ok(())
    })
}

/// # Safety
/// `enabled` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetEnabled(
    e: CUgraphExec,
    node: GraphNodeRef,
    enabled: *mut c_uint,
) -> CUresult {
    entry(|| {
        exec(e)?;
        let v = build::exec_enabled(e as usize, node)?;
        // SAFETY: the caller's pointer.
        unsafe { out(enabled, c_uint::from(v)) }
    })
}

/// # Safety
/// `p` is null or a valid CUgraphNodeParams.
#[no_mangle]
pub unsafe extern "C" fn cuGraphExecNodeSetParams(
    e: CUgraphExec,
    node: GraphNodeRef,
    p: *mut build::NodeParams,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| set_exec_node(e, node, unsafe { build::settable_kind(node, p) }?))
}

/// An executable graph's child node takes a copy of graph `child` (of the same shape, as
/// natively; it is made again from its changed source).
#[no_mangle]
pub extern "C" fn cuGraphExecChildGraphNodeSetParams(
    e: CUgraphExec,
    node: GraphNodeRef,
    child: CUgraph,
) -> CUresult {
    entry(|| {
        let kind = build::child_kind(child)?;
        let r = set_exec_node(e, node, kind.clone());
        if r.is_err() {
            // Not taken: the copy made for it goes.
            build::forget_kind(&kind);
        }
        r
    })
}
