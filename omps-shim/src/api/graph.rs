//! Graphs and executable graphs: a captured graph and every executable graph are the
//! server's, named here by handles; a graph built by hand lives in the shim until it is
//! instantiated (graph_build.rs). A graph launch is a record in the ring, like a kernel
//! launch: no round trip.

use super::graph_build::{self as build};
/// The executable-graph update entry points, under the path they always had.
pub use super::graph_update::*;
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

pub(crate) fn graph(g: CUgraph) -> Result<&'static GraphHandle, CUresult> {
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

pub(crate) fn exec(e: CUgraphExec) -> Result<&'static GraphHandle, CUresult> {
    // SAFETY: the caller passed an executable-graph handle, as the API requires.
    unsafe { resolve(e as *const GraphHandle, EXEC_MAGIC) }
}

/// Instantiates the server's graph `graph`: the executable graph's id.
pub(crate) fn instantiate_id(dev: usize, graph: u32, flags: u64) -> Result<u32, CUresult> {
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
pub(crate) fn release(dev: usize, op: Op, id: u32) -> Result<(), CUresult> {
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
pub(crate) fn instantiate_built(
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
    if op == Op::GraphLaunch {
        // A profiler traces the replay: the server launches the graph's twin, whose
        // record nodes take these events (docs/design.md 12b, design G).
        // The id read once: a rebind on another thread must not pair one graph's nodes
        // with another's launch.
        let id = ex.id();
        if let Some((begun, events)) = crate::state::profile::graph_begin(s, dev, id) {
            let l = wire::GraphLaunchProfiled {
                exec: id,
                stream,
                count: (events.len() / 2) as u32,
                _pad: 0,
            };
            let ids: Vec<u8> = events.iter().flat_map(|e| e.to_le_bytes()).collect();
            let r = live()?.push(
                dev,
                Op::GraphLaunchProfiled,
                &[bytemuck::bytes_of(&l), &ids],
            );
            crate::state::profile::end(Some(begun), r.err().unwrap_or(CUDA_SUCCESS));
            return r;
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

pub(crate) fn graph_query(g: &GraphHandle, kind: u32, index: u32) -> Result<u64, CUresult> {
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
