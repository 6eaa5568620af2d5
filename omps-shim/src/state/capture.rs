//! The captures this process began: their origin streams, modes and graphs, what the
//! capture modes forbid the calling thread, and the capture status of a stream. The
//! capture entry points are api/capture.rs and api/stream_info.rs.

use super::entry::live;
use super::streams::{handle_call, resolve_stream, stream_dev, CUstream};
use crate::cuda::*;
use crate::handles::GraphHandle;
use omps_ring::wire::{self, Op};
use std::collections::HashMap;
use std::ffi::c_uint;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

/// The server's id of stream `s` for a copy or memset on GPU `dev`, and whether the
/// caller must wait for that work before it returns.
///
/// The driver runs such work on whatever GPU's stream the program names (cufftXtMemcpy
/// fills GPU 1's piece on a GPU 0 stream), but each GPU's session knows only its own
/// streams. Work on another GPU than the stream's is therefore put in the stream's order
/// from the host, as cross-GPU event waits are: the stream's earlier work is waited for
/// here, the work goes on this process's default stream of `dev`, and the caller waits
/// for it (`true`), so that what the stream queues next comes after it. A capture cannot
/// hold that, and is refused by name.
pub(crate) fn stream_for(dev: usize, s: CUstream) -> Result<(u32, bool), CUresult> {
    match resolve_stream(s)? {
        None => Ok((wire::STREAM_DEFAULT, false)),
        Some(st) if st.dev == dev => Ok((st.id, false)),
        Some(st) => {
            ordered_on_host(s, "a copy or memset of another GPU's memory in a capture")?;
            handle_call(st.dev, Op::StreamSync, st.id)?;
            Ok((wire::STREAM_DEFAULT, true))
        }
    }
}

/// Whether work across GPUs may be put in stream `s`'s order from the host (a wait on the
/// host takes the stream's place, for what one GPU's session cannot queue on another's):
/// not in a capture of `s`, which cannot hold a host wait (refused by name, as `what`),
/// nor where another thread's capture forbids waiting, as the driver refuses a
/// synchronization there.
pub(crate) fn ordered_on_host(s: CUstream, what: &'static str) -> Result<(), CUresult> {
    if capture_info(s)?.0 != wire::graph::STATUS_NONE {
        crate::unsupported::unsupported(what);
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    unsafe_call_allowed()
}

thread_local! {
    /// CU_STREAM_CAPTURE_MODE_GLOBAL (0) until the thread exchanges it.
    pub(crate) static CAPTURE_MODE: std::cell::Cell<c_uint> = const { std::cell::Cell::new(0) };
}

/// The calling thread's capture mode (cuThreadExchangeStreamCaptureMode).
pub(crate) fn thread_capture_mode() -> c_uint {
    CAPTURE_MODE.get()
}

pub type CUgraph = *mut GraphHandle;

/// Captures this process began and has not ended: while there are none, the capture
/// queries PyTorch makes before nearly every copy are answered here.
pub(crate) static CAPTURES: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn any_capture() -> bool {
    CAPTURES.load(Ordering::Acquire) > 0
}

/// CUstreamCaptureMode: global, thread-local, relaxed.
pub(crate) const MODE_RELAXED: c_uint = 2;

/// A capture into a graph built by hand: the graph and the nodes (handles) that what it
/// captured follows.
pub(crate) struct IntoBuilt {
    pub(crate) graph: usize,
    pub(crate) deps: Vec<usize>,
    /// How what was captured joins the graph at the capture's end (graph_build's
    /// `add_captured`), named by the code that began it, which sits above this layer.
    pub(crate) add: AddCaptured,
}

/// Adds the server graph `id` a capture ended in (on device `dev`, named by `handle`) to
/// built graph `g` as a child-graph node after nodes `deps`.
pub(crate) type AddCaptured = fn(
    g: CUgraph,
    deps: &[usize],
    dev: usize,
    id: u32,
    handle: *mut GraphHandle,
) -> Result<(), CUresult>;

pub(crate) fn thread_id() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// CUstreamCaptureMode: global.
pub(crate) const MODE_GLOBAL: c_uint = 0;

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
    let mode = thread_capture_mode();
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
pub(crate) struct Capture {
    pub(crate) id: u64,
    /// The graph handle it ends in, and whether that handle is the caller's
    /// (cuStreamBeginCaptureToGraph).
    pub(crate) graph: usize,
    pub(crate) given: bool,
    /// Its CUstreamCaptureMode and the thread that began it, for unsafe_call_allowed.
    pub(crate) mode: c_uint,
    pub(crate) thread: i32,
    pub(crate) into: Option<IntoBuilt>,
    /// An unsafe call it forbade invalidated it: until it ends, it still forbids them,
    /// and launches into it fail at once with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
    pub(crate) invalidated: bool,
}

/// Capturing origin stream (device, the server's stream id: the per-thread default
/// streams of two threads are two streams) -> its capture.
pub(crate) type Captures = HashMap<(usize, u32), Capture>;

pub(crate) static IDS: LazyLock<Mutex<Captures>> = LazyLock::new(Default::default);

pub(crate) fn lock_ids() -> std::sync::MutexGuard<'static, Captures> {
    IDS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The graph handle capture `id` will end in.
pub(crate) fn capture_graph(id: u64) -> Option<usize> {
    lock_ids().values().find(|c| c.id == id).map(|c| c.graph)
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
