//! Executable graphs made anew: node parameters set on an executable graph
//! (cuGraphExec*NodeSetParams) and whole-graph updates (cuGraphExecUpdate), each a new
//! driver executable swapped in behind the same handle. Apart from instantiating and
//! launching them (graph.rs).

use super::graph::*;
use super::graph_build::{self as build, GraphNodeRef};
use crate::cuda::*;
use crate::handles::{GraphHandle, GRAPH_MAGIC};
use crate::state::entry::{entry, out};
use crate::state::streams::CUstream;
use omps_ring::wire::{self, Op};
use std::ffi::{c_uint, c_void};
use std::sync::atomic::Ordering;

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
