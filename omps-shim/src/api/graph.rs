//! Stream capture and graphs: the capture runs in the server, on the client stream's own
//! work stream (see omps-server/src/session/graphs.rs); graphs and executable graphs are
//! the server's, named here by handles. A graph launch is a record in the ring, like a
//! kernel launch: no round trip.

use super::exec::{per_thread, stream_dev, CUstream};
use super::{entry, live, out};
use crate::cuda::*;
use crate::handles::{
    leak, resolve, retire, GraphHandle, GraphNode, EXEC_MAGIC, GRAPH_MAGIC, NODE_MAGIC,
};
use omps_ring::wire::{self, CaptureCall, GraphInstantiate, Op};
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

pub type CUgraph = *mut GraphHandle;
pub type CUgraphExec = *mut GraphHandle;

/// Captures this process began and has not ended: while there are none, the capture
/// queries PyTorch makes before nearly every copy are answered here.
static CAPTURES: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn any_capture() -> bool {
    CAPTURES.load(Ordering::Acquire) > 0
}

/// CUstreamCaptureMode: global, thread-local, relaxed.
const MODE_RELAXED: c_uint = 2;

fn capture_call(op: Op, s: CUstream, mode: c_uint) -> Result<(usize, u64), CUresult> {
    let (id, dev) = stream_dev(s)?;
    let c = live()?;
    let mut ch = c.channel();
    ch.call(dev, op, |call| {
        bytemuck::bytes_of(&CaptureCall {
            call,
            stream: id,
            mode,
        })
        .to_vec()
    })?;
    let v = if op == Op::CaptureEnd {
        ch.reply::<wire::U64Reply>().value
    } else {
        0
    };
    Ok((dev, v))
}

fn begin(s: CUstream, mode: c_uint) -> Result<(), CUresult> {
    if mode > MODE_RELAXED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    capture_call(Op::CaptureBegin, s, mode)?;
    CAPTURES.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(s: CUstream, mode: c_uint) -> CUresult {
    entry(|| begin(s, mode))
}

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2_ptsz(s: CUstream, mode: c_uint) -> CUresult {
    per_thread(|| cuStreamBeginCapture_v2(s, mode))
}

/// CUDA 10.0's form, before capture modes: global.
#[no_mangle]
pub extern "C" fn cuStreamBeginCapture(s: CUstream) -> CUresult {
    cuStreamBeginCapture_v2(s, 0)
}

#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_ptsz(s: CUstream) -> CUresult {
    per_thread(|| cuStreamBeginCapture(s))
}

/// # Safety
/// `graph` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(s: CUstream, graph: *mut CUgraph) -> CUresult {
    entry(|| {
        if graph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let r = capture_call(Op::CaptureEnd, s, 0);
        // A capture ended (or ended invalidated): one fewer. Any other error (not
        // capturing, not the capture's origin) leaves the count alone.
        const INVALIDATED: CUresult = 901;
        if r.is_ok() || r == Err(INVALIDATED) {
            let _ =
                CAPTURES.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
        let (dev, id) = r?;
        let h = leak(GraphHandle {
            magic: AtomicU32::new(GRAPH_MAGIC),
            id: id as u32,
            dev,
        });
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(graph, h) }
    })
}

/// # Safety
/// As [`cuStreamEndCapture`].
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(s: CUstream, graph: *mut CUgraph) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamEndCapture(s, graph) })
}

/// The capture status and id of stream `s`, from the server while this process captures.
pub(crate) fn capture_info(s: CUstream) -> Result<(c_uint, u64), CUresult> {
    let (id, dev) = stream_dev(s)?;
    if !any_capture() {
        return Ok((wire::graph::STATUS_NONE, 0));
    }
    let c = live()?;
    let mut ch = c.channel();
    ch.call(dev, Op::CaptureStatus, |call| {
        bytemuck::bytes_of(&wire::HandleCall { call, id, _pad: 0 }).to_vec()
    })?;
    let i: wire::CaptureInfo = ch.reply();
    Ok((i.status, i.id))
}

fn graph(g: CUgraph) -> Result<&'static GraphHandle, CUresult> {
    // SAFETY: the caller passed a graph handle, as the API requires.
    unsafe { resolve(g as *const GraphHandle, GRAPH_MAGIC) }
}

fn exec(e: CUgraphExec) -> Result<&'static GraphHandle, CUresult> {
    // SAFETY: the caller passed an executable-graph handle, as the API requires.
    unsafe { resolve(e as *const GraphHandle, EXEC_MAGIC) }
}

fn instantiate(pexec: *mut CUgraphExec, g: CUgraph, flags: u64) -> Result<(), CUresult> {
    if pexec.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let gr = graph(g)?;
    let c = live()?;
    let mut ch = c.channel();
    ch.call(gr.dev, Op::GraphInstantiate, |call| {
        bytemuck::bytes_of(&GraphInstantiate {
            call,
            graph: gr.id,
            _pad: 0,
            flags,
        })
        .to_vec()
    })?;
    let id = ch.reply::<wire::U64Reply>().value as u32;
    let h = leak(GraphHandle {
        magic: AtomicU32::new(EXEC_MAGIC),
        id,
        dev: gr.dev,
    });
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
    let (stream, dev) = stream_dev(s)?;
    if dev != ex.dev {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let l = wire::GraphLaunch {
        exec: ex.id,
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
        &[bytemuck::bytes_of(&wire::Handle { id: h.id, _pad: 0 })],
    )
}

#[no_mangle]
pub extern "C" fn cuGraphDestroy(g: CUgraph) -> CUresult {
    entry(|| destroy(graph(g)?, GRAPH_MAGIC, Op::GraphDestroy))
}

#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(e: CUgraphExec) -> CUresult {
    entry(|| destroy(exec(e)?, EXEC_MAGIC, Op::GraphExecDestroy))
}

fn graph_query(g: &GraphHandle, kind: u32, index: u32) -> Result<u64, CUresult> {
    let c = live()?;
    let mut ch = c.channel();
    ch.call(g.dev, Op::GraphQuery, |call| {
        bytemuck::bytes_of(&wire::GraphQuery {
            call,
            graph: g.id,
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
        .entry((g.dev, g.id, index))
        .or_insert_with(|| {
            leak(GraphNode {
                magic: AtomicU32::new(NODE_MAGIC),
                graph: g.id,
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
        let g = GraphHandle {
            magic: AtomicU32::new(GRAPH_MAGIC),
            id: n.graph,
            dev: n.dev,
        };
        let t = graph_query(&g, wire::graph::NODE_TYPE, n.index)? as c_uint;
        // SAFETY: the caller's pointer.
        unsafe { out(ty, t) }
    })
}
