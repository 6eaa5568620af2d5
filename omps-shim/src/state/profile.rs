//! The seam between the API families and the profiler above them (`crate::cupti`): a
//! family says what GPU work it is about to queue (a kernel, a copy, a memset) and which
//! waits it makes; the profiler, once a program has turned CUPTI activity on, times them.
//! The profiler registers its hooks here because it sits above the families (it queues
//! its timing events through their entry points), and a family may not call up.
//!
//! With no activity on, every report costs one relaxed load.

use crate::cuda::*;
use crate::handles::Function;
use crate::state::streams::{CUevent, CUstream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// GPU work a family is about to queue on a stream.
pub enum Work<'a> {
    /// A kernel launch; `cbid` is CUPTI's driver callback id of the entry point (0 where
    /// none is known: no API record is written for it).
    Kernel {
        func: &'a Function,
        grid: [u32; 3],
        block: [u32; 3],
        dynamic_shared: u32,
        cbid: u32,
    },
    /// A copy of `bytes`; the kinds are CUPTI's (`CUpti_ActivityMemcpyKind`,
    /// `CUpti_ActivityMemoryKind`); `asynchronous` when the call returns before the copy
    /// is done.
    Copy {
        copy_kind: u8,
        src_kind: u8,
        dst_kind: u8,
        bytes: u64,
        asynchronous: bool,
    },
    /// A memset of `bytes` to `value`.
    Memset { value: u32, bytes: u64 },
}

/// `CUpti_ActivityMemcpyKind` values.
pub mod copy_kind {
    pub const HTOD: u8 = 1;
    pub const DTOH: u8 = 2;
    pub const DTOD: u8 = 8;
    pub const PTOP: u8 = 10;
}

/// `CUpti_ActivityMemoryKind` values.
pub mod memory_kind {
    pub const PAGEABLE: u8 = 1;
    pub const PINNED: u8 = 2;
    pub const DEVICE: u8 = 3;
}

/// CUPTI's driver callback ids of the launch entry points (`cupti_driver_cbid.h`); the
/// per-thread-stream forms (`_ptsz`) report as their plain names.
pub const CBID_LAUNCH_KERNEL: u32 = 307;
pub const CBID_LAUNCH_KERNEL_EX: u32 = 652;
pub const CBID_LAUNCH_COOPERATIVE_KERNEL: u32 = 477;
pub const CBID_GRAPH_LAUNCH: u32 = 514;

/// A wait the program made (CUPTI's synchronization records).
#[derive(Clone, Copy)]
pub enum Wait {
    Stream(CUstream),
    Event(CUevent),
    Context,
    StreamWaitEvent(CUstream, CUevent),
}

/// A traced graph launch: the token for `after`, and the event ids the launch carries.
pub type GraphReport = (u64, Vec<u32>);

/// What the profiler does with the reports.
pub struct Hooks {
    /// Before `work` is queued on `stream` of device `dev`: a token for `after`, or None
    /// when this work is not timed (activity off for its kind, or a capturing stream).
    pub before: fn(stream: CUstream, dev: usize, work: &Work) -> Option<u64>,
    /// After it was queued (or refused, `result`). May run while the caller holds a
    /// channel: it must not wait for the server.
    pub after: fn(token: u64, result: CUresult),
    /// A wait that ran from `start_ns` to `end_ns` (CLOCK_MONOTONIC).
    pub waited: fn(wait: Wait, start_ns: u64, end_ns: u64, result: CUresult),
    /// Before executable graph `exec` (the server's id) is launched on `stream`: a token
    /// for `after` and the event ids the launch carries (GraphLaunchProfiled), a start and
    /// an end per timed node; None: launched untimed.
    pub graph: fn(stream: CUstream, dev: usize, exec: u32) -> Option<GraphReport>,
}

static HOOKS: OnceLock<&'static Hooks> = OnceLock::new();
static ON: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set while the profiler itself calls the API (its timing events and waits).
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with this thread's reports off, in relaxed capture mode: the profiler's own
/// calls are not the program's work, and its waits and queries (on events of its own,
/// never on a capturing stream) must not invalidate a capture the program is making, as
/// CUPTI's never do.
pub fn quiet<R>(f: impl FnOnce() -> R) -> R {
    use crate::state::capture::{CAPTURE_MODE, MODE_RELAXED};
    let was = QUIET.with(|q| q.replace(true));
    let mode = CAPTURE_MODE.with(|m| m.replace(MODE_RELAXED));
    let r = f();
    CAPTURE_MODE.with(|m| m.set(mode));
    QUIET.with(|q| q.set(was));
    r
}

/// Installs the profiler's hooks (once) and turns the reports on or off.
pub fn set_hooks(hooks: &'static Hooks, on: bool) {
    let _ = HOOKS.set(hooks);
    ON.store(on, Ordering::Relaxed);
}

fn hooks() -> Option<&'static Hooks> {
    if ON.load(Ordering::Relaxed) && !QUIET.with(|q| q.get()) {
        HOOKS.get().copied()
    } else {
        None
    }
}

/// A report begun (`begin`) and not yet ended.
pub(crate) struct Begun {
    hooks: &'static Hooks,
    token: u64,
}

/// Reports work about to be queued on `stream` (`work` is built only when the profiler
/// is on). Called before the caller holds a channel: the profiler's hooks may need one.
pub(crate) fn begin<'a>(
    stream: CUstream,
    dev: usize,
    work: impl FnOnce() -> Work<'a>,
) -> Option<Begun> {
    let h = hooks()?;
    let token = (h.before)(stream, dev, &work())?;
    Some(Begun { hooks: h, token })
}

/// Reports that the work `begin` named was queued (or refused, `result`). Needs no
/// channel: it may be called while the caller holds one.
pub(crate) fn end(b: Option<Begun>, result: CUresult) {
    if let Some(b) = b {
        (b.hooks.after)(b.token, result);
    }
}

/// Runs `queue`, which queues the work `work` describes on `stream`, reported to the
/// profiler around it.
pub(crate) fn around<'a, R>(
    stream: CUstream,
    dev: usize,
    work: impl FnOnce() -> Work<'a>,
    queue: impl FnOnce() -> Result<R, CUresult>,
) -> Result<R, CUresult> {
    let b = begin(stream, dev, work);
    let r = queue();
    end(b, r.as_ref().err().copied().unwrap_or(CUDA_SUCCESS));
    r
}

/// Reports a graph launch about to be queued: the token for `end` and the event ids the
/// profiled launch carries, or None to launch it as usual.
pub(crate) fn graph_begin(stream: CUstream, dev: usize, exec: u32) -> Option<(Begun, Vec<u32>)> {
    let h = hooks()?;
    let (token, events) = (h.graph)(stream, dev, exec)?;
    Some((Begun { hooks: h, token }, events))
}

/// Runs the wait `body`, reported to the profiler with its host times.
pub(crate) fn waiting(wait: Wait, body: impl FnOnce() -> CUresult) -> CUresult {
    let Some(h) = hooks() else {
        return body();
    };
    let t0 = monotonic_ns();
    let r = body();
    (h.waited)(wait, t0, monotonic_ns(), r);
    r
}

pub use omps_ring::clock::monotonic_ns;
