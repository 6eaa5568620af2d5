//! What the lanes of one GPU share ([`GpuShared`]): on its own, below the lane context
//! and the sessions, so that what needs only the GPU's shared state (a session's work off
//! the lane, a release held for other GPUs' fences, the control thread) does not depend on
//! the lanes.

use crate::gpu::Gpu;
use crate::sched::placement::Binding;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Failed context recreations after which the server starts itself again (0.1 s: lane 0
/// tries every 5 ms). A context the driver will not reset in a process is new in
/// a new process, and by then no client is connected to lose.
pub const RESETS_BEFORE_RESTART: u32 = 20;

/// What the lanes of one GPU share. A GPU is served by several worker threads (lanes),
/// each owning a subset of its clients, so that launches from many clients are submitted
/// in parallel (one thread caps near 300k launches/s); what must be decided for the whole
/// GPU lives here.
pub struct GpuShared {
    /// Per work stream: the client whose streams are bound to it, and how many.
    pub(super) bindings: std::sync::Mutex<Vec<Binding>>,
    pub limits: Arc<std::sync::Mutex<crate::client::limits::ContextLimits>>,
    /// Shared with the control thread, which refuses new clients while it is set.
    pub faulted: Arc<std::sync::atomic::AtomicBool>,
    /// The sticky error of a fault, 0 when none: every lane fails its clients with it.
    pub(super) fault_code: std::sync::atomic::AtomicI32,
    /// Failed attempts to recreate the context after a fault, in a row (the control
    /// thread restarts the server past [`RESETS_BEFORE_RESTART`]).
    pub reset_failures: std::sync::atomic::AtomicU32,
    /// Sessions on all lanes; the context is recreated after a fault once it is 0.
    pub(super) sessions: std::sync::atomic::AtomicUsize,
    /// Bumped when the context is recreated: every lane then remakes its events.
    pub(super) generation: Arc<std::sync::atomic::AtomicU64>,
    pub lanes: usize,
    /// Gives back what clients released, off the workers.
    pub releaser: crate::release::releaser::Releaser,
    /// Read-held by each lane for a pass; written by the context reset.
    pub(super) pass_lock: std::sync::RwLock<()>,
    /// One per lane, read by `omps-ctl stats`.
    pub stats: Vec<crate::worker::stats::LaneStats>,
    pub(super) layout: crate::sched::placement::Layout,
    /// Hardware queues one client may hold streams on ([`crate::sched::placement::queue_share`]).
    pub(super) queue_share: std::sync::atomic::AtomicUsize,
    /// Modules shared by clients that load the same image.
    pub modules: crate::image::module_cache::ModuleCache,
    /// Allocations exported for IPC.
    pub ipc: std::sync::Mutex<crate::client::ipc::Registry>,
    /// VMM memory exported as shareable handles: one registry for all GPUs, since a
    /// client imports memory into its own device's session (session/vmm.rs), whichever
    /// GPU it lives on.
    pub vmm_ipc: Arc<std::sync::Mutex<crate::client::ipc::Registry>>,
    /// Releases of this GPU's memory held until other GPUs' fences pass
    /// (crate::release::peer_fence): the context is not reset, and an allocation that ran out of
    /// memory does not give up, while any is held.
    pub held: std::sync::atomic::AtomicUsize,
    /// When the newest of them was held (microseconds since [`epoch`]).
    pub(super) held_at: std::sync::atomic::AtomicU64,
    /// Module loads, JIT compiles and links off the lanes (crate::image::compile).
    pub compiler: crate::image::compile::Compiler,
    /// Bytes the lanes keep for quick frees (worker/kept.rs), and whether an allocation
    /// that ran out of memory asks them all back now.
    pub(super) kept_bytes: std::sync::atomic::AtomicU64,
    pub(super) give_back_kept: std::sync::atomic::AtomicBool,
}

/// The process's clock origin, for instants kept in atomics.
fn epoch() -> Instant {
    static E: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *E.get_or_init(Instant::now)
}

impl GpuShared {
    /// A release of this GPU's memory is held for other GPUs' fences (crate::release::peer_fence).
    pub fn note_held(&self) {
        self.held.fetch_add(1, Ordering::SeqCst);
        let now = epoch().elapsed().as_micros() as u64;
        self.held_at.fetch_max(now, Ordering::SeqCst);
    }

    /// Whether a release is held for other GPUs' fences that was held less than `age`
    /// ago. One held just now (the free right before an allocation that ran out) may come
    /// back any moment; one older waits for a GPU busy for long, or stuck, and an
    /// allocation waiting for it would only be late with its answer.
    pub fn held_young(&self, age: Duration) -> bool {
        let since = epoch().elapsed().as_micros() as u64;
        self.held.load(Ordering::SeqCst) > 0
            && since.saturating_sub(self.held_at.load(Ordering::SeqCst)) < age.as_micros() as u64
    }

    /// The context generation, bumped by each reset (the segment pool's too).
    pub fn generation(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.generation.clone()
    }

    pub fn new(
        gpu: &Arc<dyn Gpu>,
        lanes: usize,
        faulted: Arc<std::sync::atomic::AtomicBool>,
        vmm_ipc: Arc<std::sync::Mutex<crate::client::ipc::Registry>>,
    ) -> Arc<Self> {
        let streams = gpu.stream_count();
        let generation: Arc<std::sync::atomic::AtomicU64> = Default::default();
        Arc::new(GpuShared {
            releaser: crate::release::releaser::Releaser::start(gpu.clone(), generation.clone()),
            bindings: std::sync::Mutex::new(vec![Binding::default(); streams]),
            limits: Default::default(),
            faulted,
            fault_code: Default::default(),
            reset_failures: Default::default(),
            sessions: Default::default(),
            generation,
            pass_lock: Default::default(),
            lanes: lanes.max(1),
            stats: (0..lanes.max(1)).map(|_| Default::default()).collect(),
            layout: gpu.layout(),
            queue_share: crate::sched::placement::queue_share(&gpu.layout(), None).into(),
            ipc: Default::default(),
            vmm_ipc,
            held: Default::default(),
            held_at: Default::default(),
            compiler: Default::default(),
            kept_bytes: Default::default(),
            give_back_kept: Default::default(),
            modules: crate::image::module_cache::ModuleCache::new({
                // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR.
                let snap = gpu.snapshot();
                (snap.attributes[75] * 10 + snap.attributes[76]) as u32
            }),
        })
    }

    /// Sets the hardware queues one client may hold streams on (None: half of them).
    pub fn set_queue_share(&self, asked: Option<usize>) {
        let n = crate::sched::placement::queue_share(&self.layout, asked);
        self.queue_share.store(n, Ordering::Relaxed);
    }

    /// The work-stream bindings, locked.
    pub(super) fn bindings(&self) -> std::sync::MutexGuard<'_, Vec<Binding>> {
        self.bindings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many work streams of each class `client`'s streams are bound to.
    pub fn bound_by_class(&self, client: u32) -> [u32; crate::sched::placement::CLASSES] {
        let mut n = [0; crate::sched::placement::CLASSES];
        let b = self.bindings();
        for (i, x) in b.iter().enumerate() {
            if x.refs > 0 && x.client == client {
                if let Some(c) = self.layout.class_at(i) {
                    n[c] += 1;
                }
            }
        }
        n
    }
}
