//! Stream capture: the capture runs in the server, on the client stream's own work
//! stream (see omps-server/src/session/graphs.rs); what it ends in is a graph of the
//! server's, named here by a handle.

use super::exec::{per_thread, stream_dev, CUstream};
use super::{entry, live, out};
use crate::cuda::*;
use crate::handles::{leak, retire, GraphHandle, GRAPH_MAGIC};
use omps_ring::wire::{self, CaptureCall, Op};
use std::collections::HashMap;
use std::ffi::c_uint;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

pub type CUgraph = *mut GraphHandle;

/// Captures this process began and has not ended: while there are none, the capture
/// queries PyTorch makes before nearly every copy are answered here.
static CAPTURES: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn any_capture() -> bool {
    CAPTURES.load(Ordering::Acquire) > 0
}

/// CUstreamCaptureMode: global, thread-local, relaxed.
pub(crate) const MODE_RELAXED: c_uint = 2;

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
    begun(s)
}

/// Stream `s` begins capturing into the server's graph `graph` (a conditional node's
/// home or body, omps-server/src/session/conditional.rs); it ends as any capture does,
/// in a handle naming that graph.
pub(crate) fn begin_to(s: CUstream, graph: u32) -> Result<(), CUresult> {
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
    begun(s)
}

/// The books of a capture the server began on stream `s`.
fn begun(s: CUstream) -> Result<(), CUresult> {
    CAPTURES.fetch_add(1, Ordering::AcqRel);
    // The capture's id (for the graph memory it allocates: an invalidated capture no
    // longer tells its id at its end) and the graph handle it ends in, which
    // cuStreamGetCaptureInfo gives out meanwhile (user objects can be moved into it).
    let (_, id) = capture_info(s)?;
    let (stream, dev) = stream_dev(s)?;
    let g = leak(GraphHandle::new(GRAPH_MAGIC, IN_CAPTURE, dev)) as usize;
    lock_ids().insert((dev, stream), (id, g));
    Ok(())
}

/// The id of a graph handle whose capture has not ended: no server graph has it (the
/// server's ids start at 1).
pub(crate) const IN_CAPTURE: u32 = 0;

/// Capturing origin stream (device, the server's stream id: the per-thread default
/// streams of two threads are two streams) -> its capture's id and graph handle.
type Captures = HashMap<(usize, u32), (u64, usize)>;
static IDS: LazyLock<Mutex<Captures>> = LazyLock::new(Default::default);

fn lock_ids() -> std::sync::MutexGuard<'static, Captures> {
    IDS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The graph handle capture `id` will end in.
pub(crate) fn capture_graph(id: u64) -> Option<usize> {
    lock_ids()
        .values()
        .find(|&&(c, _)| c == id)
        .map(|&(_, g)| g)
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
            Ok((dev, id)) => match capture {
                Some((c, h)) => {
                    super::graph_mem::capture_ended(c, Some(h));
                    (id, h as *mut GraphHandle)
                }
                // Begun through another handle of the stream: a handle of its own.
                None => (id, leak(GraphHandle::new(GRAPH_MAGIC, IN_CAPTURE, dev))),
            },
            Err(e) => {
                if let Some((c, h)) = capture {
                    super::graph_mem::capture_ended(c, None);
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
