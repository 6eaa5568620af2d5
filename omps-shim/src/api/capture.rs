//! Stream capture: the capture runs in the server, on the client stream's own work
//! stream (see omps-server/src/session/graphs.rs); what it ends in is a graph of the
//! server's, named here by a handle.

use super::exec::{per_thread, stream_dev, CUstream};
use crate::cuda::*;
use crate::handles::{leak, retire, GraphHandle, GRAPH_MAGIC};
use crate::state::entry::{entry, live, out};
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
fn begun(
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

/// A capture into a graph built by hand: the graph and the nodes (handles) that what it
/// captured follows.
struct IntoBuilt {
    graph: usize,
    deps: Vec<usize>,
}

fn thread_id() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// CUstreamCaptureMode: global.
const MODE_GLOBAL: c_uint = 0;

/// Whether the calling thread may make a call the capture modes restrict (the CUDA
/// guide's potentially unsafe calls) now. A thread in relaxed mode always may; otherwise
/// not while it captures itself in a mode other than relaxed, nor, in global mode, while
/// any thread of the process captures in global mode. Refused, the call fails with
/// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the captures that forbade it are
/// invalidated, as the driver does. Captures of other clients never count.
pub(crate) fn unsafe_call_allowed() -> Result<(), CUresult> {
    if !any_capture() {
        return Ok(());
    }
    let mode = super::stream_info::thread_capture_mode();
    if mode == MODE_RELAXED {
        return Ok(());
    }
    let me = thread_id();
    let forbidding: Vec<(usize, u32)> = lock_ids()
        .iter_mut()
        .filter(|(_, c)| {
            c.mode != MODE_RELAXED
                && (c.thread == me || (mode == MODE_GLOBAL && c.mode == MODE_GLOBAL))
        })
        .map(|(&k, c)| {
            c.invalidated = true;
            k
        })
        .collect();
    if forbidding.is_empty() {
        return Ok(());
    }
    let c = live()?;
    for (dev, stream) in forbidding {
        // Querying a capturing stream is illegal: the server invalidates its capture.
        let mut ch = c.channel();
        let _ = ch.call(dev, Op::StreamQuery, |call| {
            bytemuck::bytes_of(&wire::HandleCall {
                call,
                id: stream,
                _pad: 0,
            })
            .to_vec()
        });
    }
    Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
}

/// A launch into stream `s` fails at once, as natively, if this process invalidated the
/// capture `s` is the origin of (an unsafe call it forbade); the server would only note
/// the driver's error for a later call.
pub(crate) fn launch_allowed(s: CUstream) -> Result<(), CUresult> {
    const INVALIDATED: CUresult = 901;
    if !any_capture() {
        return Ok(());
    }
    let (stream, dev) = stream_dev(s)?;
    match lock_ids().get(&(dev, stream)) {
        Some(c) if c.invalidated => Err(INVALIDATED),
        _ => Ok(()),
    }
}

/// The capturing origin stream (device, server stream id) whose capture will end in
/// graph handle `g`.
pub(crate) fn capture_stream_of(g: CUgraph) -> Option<(usize, u32)> {
    lock_ids()
        .iter()
        .find(|(_, c)| c.graph == g as usize)
        .map(|(&k, _)| k)
}

/// The id of a graph handle whose capture has not ended: no server graph has it (the
/// server's ids start at 1).
pub(crate) const IN_CAPTURE: u32 = 0;

/// A capture this process began and has not ended.
struct Capture {
    id: u64,
    /// The graph handle it ends in, and whether that handle is the caller's
    /// (cuStreamBeginCaptureToGraph).
    graph: usize,
    given: bool,
    /// Its CUstreamCaptureMode and the thread that began it, for unsafe_call_allowed.
    mode: c_uint,
    thread: i32,
    into: Option<IntoBuilt>,
    /// An unsafe call it forbade invalidated it: until it ends, it still forbids them,
    /// and launches into it fail at once with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
    invalidated: bool,
}

/// Capturing origin stream (device, the server's stream id: the per-thread default
/// streams of two threads are two streams) -> its capture.
type Captures = HashMap<(usize, u32), Capture>;
static IDS: LazyLock<Mutex<Captures>> = LazyLock::new(Default::default);

fn lock_ids() -> std::sync::MutexGuard<'static, Captures> {
    IDS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The graph handle capture `id` will end in.
pub(crate) fn capture_graph(id: u64) -> Option<usize> {
    lock_ids().values().find(|c| c.id == id).map(|c| c.graph)
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
                    super::graph_build::add_captured(
                        g,
                        &into.deps,
                        dev,
                        id as u32,
                        h as *mut GraphHandle,
                    )?;
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

/// Capturing into an existing graph: the bodies of a conditional node added to a capture
/// (how the CUDA guide and PyTorch fill them), with no dependencies; or a graph built by
/// hand, which receives what was captured as one child-graph node after `deps` (the
/// capture is an ordinary one on the server, and its graph the node's). Graphs the server
/// captured are not captured into.
fn begin_to_graph(
    s: CUstream,
    g: CUgraph,
    deps: *const *mut crate::handles::GraphNode,
    n: usize,
    mode: c_uint,
) -> Result<(), CUresult> {
    if mode > MODE_RELAXED || (n > 0 && deps.is_null()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passed a graph handle, as the API requires.
    let h = unsafe { crate::handles::resolve(g as *const GraphHandle, GRAPH_MAGIC) }?;
    if super::graph_build::is_built(g) {
        // SAFETY: forwarded contract: n node handles.
        let deps = unsafe { super::graph_build::check_deps(g, deps, n) }?;
        let (_, dev) = stream_dev(s)?;
        if dev != h.dev {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        capture_call(Op::CaptureBegin, s, mode)?;
        let into = IntoBuilt {
            graph: g as usize,
            deps,
        };
        return begun(s, None, mode, Some(into));
    }
    if !super::graph_build::is_captured_body(g) {
        return Err(crate::unsupported::unsupported(
            "cuStreamBeginCaptureToGraph into a graph other than a conditional node's body",
        ));
    }
    if n > 0 {
        return Err(crate::unsupported::unsupported(
            "cuStreamBeginCaptureToGraph with dependencies",
        ));
    }
    begin_to(s, h.id(), Some(g), mode)
}

/// # Safety
/// `deps` is null or holds `n` node handles.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph(
    s: CUstream,
    g: CUgraph,
    deps: *const *mut crate::handles::GraphNode,
    _data: *const u8,
    n: usize,
    mode: c_uint,
) -> CUresult {
    entry(|| begin_to_graph(s, g, deps, n, mode))
}

/// # Safety
/// As [`cuStreamBeginCaptureToGraph`].
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph_ptsz(
    s: CUstream,
    g: CUgraph,
    deps: *const *mut crate::handles::GraphNode,
    data: *const u8,
    n: usize,
    mode: c_uint,
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamBeginCaptureToGraph(s, g, deps, data, n, mode) })
}

/// What omps takes of cuStreamUpdateCaptureDependencies: moving a capture past the
/// conditional node just added to it, which the server already did when it added the
/// node (graph_build/cond.rs). The capture's other nodes are the server's and have no
/// handles here.
fn update_dependencies(
    s: CUstream,
    deps: *const *mut crate::handles::GraphNode,
    n: usize,
    flags: c_uint,
) -> Result<(), CUresult> {
    const SET: c_uint = 1;
    if flags > SET || (n > 0 && deps.is_null()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (stream, dev) = stream_dev(s)?;
    // SAFETY: n > 0 and non-null: the caller's array of n handles.
    let first = (n == 1).then(|| unsafe { *deps });
    match first {
        Some(node) if flags == SET && super::graph_build::added_on(node, dev, stream) => Ok(()),
        _ => Err(crate::unsupported::unsupported(
            "cuStreamUpdateCaptureDependencies beyond moving a capture past a conditional node added to it",
        )),
    }
}

/// # Safety
/// `deps` is null or holds `n` node handles.
#[no_mangle]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies(
    s: CUstream,
    deps: *const *mut crate::handles::GraphNode,
    n: usize,
    flags: c_uint,
) -> CUresult {
    entry(|| update_dependencies(s, deps, n, flags))
}

/// # Safety
/// As [`cuStreamUpdateCaptureDependencies`]; `data` (edge data) is null or default.
#[no_mangle]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies_v2(
    s: CUstream,
    deps: *const *mut crate::handles::GraphNode,
    _data: *const u8,
    n: usize,
    flags: c_uint,
) -> CUresult {
    entry(|| update_dependencies(s, deps, n, flags))
}

/// # Safety
/// As [`cuStreamUpdateCaptureDependencies`].
#[no_mangle]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies_ptsz(
    s: CUstream,
    deps: *const *mut crate::handles::GraphNode,
    n: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamUpdateCaptureDependencies(s, deps, n, flags) })
}

/// # Safety
/// As [`cuStreamUpdateCaptureDependencies_v2`].
#[no_mangle]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies_v2_ptsz(
    s: CUstream,
    deps: *const *mut crate::handles::GraphNode,
    data: *const u8,
    n: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamUpdateCaptureDependencies_v2(s, deps, data, n, flags) })
}
