//! Stream capture: the capture runs in the server, on the client stream's own work
//! stream (see omps-server/src/session/graphs.rs); what it ends in is a graph of the
//! server's, named here by a handle.

use crate::cuda::*;
use crate::handles::{leak, retire, GraphHandle, GRAPH_MAGIC};
use crate::state::capture::*;
use crate::state::entry::{entry, live, out};
use crate::state::streams::{per_thread, stream_dev, CUstream};
use omps_ring::wire::{self, CaptureCall, Op};
use std::ffi::c_uint;
use std::sync::atomic::Ordering;

/// The handle types of this family, named where the program sees them.
pub use crate::state::capture::CUgraph;

pub(crate) fn capture_call(op: Op, s: CUstream, mode: c_uint) -> Result<(usize, u64), CUresult> {
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
    begun(s, None, mode, None)
}

/// Stream `s` begins capturing into the server's graph `graph` (a conditional node's
/// home or body, omps-server/src/session/conditional.rs); it ends as any capture does,
/// in a handle naming that graph: `handle`, or a new one.
pub(crate) fn begin_to(
    s: CUstream,
    graph: u32,
    handle: Option<CUgraph>,
    mode: c_uint,
) -> Result<(), CUresult> {
    let (stream, dev) = stream_dev(s)?;
    let c = live()?;
    c.channel().call(dev, Op::GraphCond, |call| {
        bytemuck::bytes_of(&wire::GraphCond {
            call,
            kind: wire::graph::CAPTURE_TO,
            stream,
            graph,
            ..Default::default()
        })
        .to_vec()
    })?;
    begun(s, handle, mode, None)
}

/// The books of a capture the server began on stream `s` in `mode`, which ends in
/// `handle` (a graph the caller holds) or in a handle made now; `into` names the graph
/// built by hand that receives what it captured (cuStreamBeginCaptureToGraph).
pub(crate) fn begun(
    s: CUstream,
    handle: Option<CUgraph>,
    mode: c_uint,
    into: Option<IntoBuilt>,
) -> Result<(), CUresult> {
    CAPTURES.fetch_add(1, Ordering::AcqRel);
    // The capture's id (for the graph memory it allocates: an invalidated capture no
    // longer tells its id at its end) and the graph handle it ends in, which
    // cuStreamGetCaptureInfo gives out meanwhile (user objects can be moved into it).
    let (_, id) = capture_info(s)?;
    let (stream, dev) = stream_dev(s)?;
    let (g, given) = match handle {
        Some(h) => (h as usize, true),
        None => (
            leak(GraphHandle::new(GRAPH_MAGIC, IN_CAPTURE, dev)) as usize,
            false,
        ),
    };
    lock_ids().insert(
        (dev, stream),
        Capture {
            id,
            graph: g,
            given,
            mode,
            thread: thread_id(),
            into,
            invalidated: false,
        },
    );
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
        if graph.is_null() && !ends_in_given_graph(s) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let r = capture_call(Op::CaptureEnd, s, 0);
        // A capture ended (or ended invalidated, or with a fork never joined back): one
        // fewer. Any other error (not capturing, not the capture's origin) leaves the
        // count alone.
        const INVALIDATED: CUresult = 901;
        const UNJOINED: CUresult = 904;
        let ended = r.is_ok() || r == Err(INVALIDATED) || r == Err(UNJOINED);
        // Graph memory allocated during the capture goes with its graph, or is freed.
        let capture = if ended {
            let _ =
                CAPTURES.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            let (stream, dev) = stream_dev(s)?;
            lock_ids().remove(&(dev, stream))
        } else {
            None
        };
        let (id, h) = match r {
            Ok((dev, id)) => match capture.map(|c| (c.id, c.graph, c.into)) {
                Some((c, h, Some(into))) => {
                    super::graph_mem::capture_ended(c, Some(h));
                    // SAFETY: a handle made at the capture's start, never freed.
                    unsafe { &*(h as *const GraphHandle) }
                        .id
                        .store(id as u32, Ordering::Release);
                    let g = into.graph as CUgraph;
                    (into.add)(g, &into.deps, dev, id as u32, h as *mut GraphHandle)?;
                    if graph.is_null() {
                        return Ok(());
                    }
                    // SAFETY: checked non-null; the caller's pointer.
                    return unsafe { out(graph, g) };
                }
                Some((c, h, None)) => {
                    super::graph_mem::capture_ended(c, Some(h));
                    (id, h as *mut GraphHandle)
                }
                // Begun through another handle of the stream: a handle of its own.
                None => (id, leak(GraphHandle::new(GRAPH_MAGIC, IN_CAPTURE, dev))),
            },
            Err(e) => {
                if let Some(Capture {
                    id: c,
                    graph: h,
                    given,
                    ..
                }) = capture
                {
                    super::graph_mem::capture_ended(c, None);
                    if given {
                        // The caller's graph stays the caller's.
                        return Err(e);
                    }
                    // No graph came of it: what was moved into it goes.
                    super::user_object::graph_gone(h);
                    // SAFETY: a handle made at the capture's start, never freed.
                    let _ = retire(&unsafe { &*(h as *const GraphHandle) }.magic, GRAPH_MAGIC);
                }
                return Err(e);
            }
        };
        // SAFETY: a handle made at the capture's start, never freed.
        unsafe { &*h }.id.store(id as u32, Ordering::Release);
        if graph.is_null() {
            // A capture into a conditional body: the body is the caller's already.
            return Ok(());
        }
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(graph, h) }
    })
}

/// Whether stream `s`'s capture was begun into a graph the caller holds
/// (cuStreamBeginCaptureToGraph), for which cuStreamEndCapture needs no out-pointer.
fn ends_in_given_graph(s: CUstream) -> bool {
    let Ok((stream, dev)) = stream_dev(s) else {
        return false;
    };
    lock_ids()
        .get(&(dev, stream))
        .is_some_and(|c| c.given || c.into.is_some())
}

/// # Safety
/// As [`cuStreamEndCapture`].
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(s: CUstream, graph: *mut CUgraph) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamEndCapture(s, graph) })
}
