//! One worker thread per GPU: polls every client's ring for that GPU, runs the commands,
//! wakes clients whose completions the GPU wrote, and frees what clients released once the
//! GPU is done with it. It never waits for the GPU.

use crate::client::ClientShared;
use crate::gpu::{CuError, Gpu, GpuResult};
use crate::sched::placement::{Binding, StreamSet};
use crate::session::{Release, Session};
use omps_ring::futex::{self, Doorbell};
use omps_ring::segment::{state, Word};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub enum ToWorker {
    Add(Arc<ClientShared>),
    Remove(u32),
    /// Release a pinned range of a client once its queued work on this GPU is done (the
    /// last GPU's worker unregisters it).
    Unpin(u32, crate::session::PinnedRelease),
    Quit,
}

#[derive(Clone, Copy, Debug)]
pub struct WorkerConfig {
    /// How long the worker keeps spinning after its last piece of work before it sleeps.
    pub spin: Duration,
    /// CPU to pin to, if any.
    pub cpu: Option<usize>,
}

/// A completion the GPU will write; the worker wakes the client if it sleeps on it.
struct Marker {
    client: Arc<ClientShared>,
    channel: u32,
    word: Word,
    seq: u32,
    stream: usize,
    since: Instant,
    /// Said in the log that it has waited for over LONG_WAIT.
    warned: bool,
}

/// A completion outstanding this long is worth a line in the log: a kernel that never
/// ends holds its client (and, in one shared context, nothing else) until someone acts.
const LONG_WAIT: Duration = Duration::from_secs(60);

/// Resources freed once `fence` completes.
struct Deferred {
    fence: u64,
    client: Arc<ClientShared>,
    /// Counts toward `client.released` once done (the client's whole session ended).
    final_for_client: bool,
    release: Release,
}

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
    bindings: std::sync::Mutex<Vec<Binding>>,
    pub limits: std::sync::Mutex<crate::client::limits::ContextLimits>,
    /// Shared with the control thread, which refuses new clients while it is set.
    pub faulted: Arc<std::sync::atomic::AtomicBool>,
    /// The sticky error of a fault, 0 when none: every lane fails its clients with it.
    fault_code: std::sync::atomic::AtomicI32,
    /// Failed attempts to recreate the context after a fault, in a row (the control
    /// thread restarts the server past [`RESETS_BEFORE_RESTART`]).
    pub reset_failures: std::sync::atomic::AtomicU32,
    /// Sessions on all lanes; the context is recreated after a fault once it is 0.
    sessions: std::sync::atomic::AtomicUsize,
    /// Bumped when the context is recreated: every lane then remakes its events.
    generation: Arc<std::sync::atomic::AtomicU64>,
    pub lanes: usize,
    /// Gives back what clients released, off the workers.
    pub releaser: crate::release::releaser::Releaser,
    /// Read-held by each lane for a pass; written by the context reset.
    pass_lock: std::sync::RwLock<()>,
    /// One per lane, read by `omps-ctl stats`.
    pub stats: Vec<crate::worker::stats::LaneStats>,
    layout: crate::sched::placement::Layout,
    /// Hardware queues one client may hold streams on ([`crate::sched::placement::queue_share`]).
    queue_share: std::sync::atomic::AtomicUsize,
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
    held_at: std::sync::atomic::AtomicU64,
    /// Module loads, JIT compiles and links off the lanes (crate::image::compile).
    pub compiler: crate::image::compile::Compiler,
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
    fn bindings(&self) -> std::sync::MutexGuard<'_, Vec<Binding>> {
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

pub struct WorkerCtx {
    pub gpu: Arc<dyn Gpu>,
    pub shared: Arc<GpuShared>,
    /// This lane's index among the GPU's lanes.
    lane: usize,
    /// At most one per (client, channel, word): a client waits on one sequence per word.
    markers: Vec<Marker>,
    /// Per sync stream, in the order their fences were recorded there, which is the
    /// order they complete in: only each queue's first fence is ever asked about.
    deferred: Vec<std::collections::VecDeque<Deferred>>,
    deferred_len: usize,
    /// One per work stream, to make a sync stream wait for it (this lane's own).
    scratch_events: Vec<u64>,
    generation: u64,
    next_work: usize,
    last_fault_check: Instant,
    /// When lane 0 last tried to recreate a faulted context (tries are 5 ms apart).
    last_reset_try: Option<Instant>,
    pub fault: Option<i32>,
    /// Dead clients and the host-node slots of their graphs: acknowledged on every pass
    /// until the client's last fence has passed, so replays it queued run through.
    dead_host_nodes: Vec<(Arc<ClientShared>, Vec<u32>, Vec<u64>)>,
}

impl WorkerCtx {
    /// A lone worker for `gpu` (tests and fuzzing).
    pub fn new(gpu: Arc<dyn Gpu>) -> GpuResult<Self> {
        let shared = GpuShared::new(&gpu, 1, Default::default(), Default::default());
        Self::lane(gpu, shared, 0)
    }

    pub fn lane(gpu: Arc<dyn Gpu>, shared: Arc<GpuShared>, lane: usize) -> GpuResult<Self> {
        let scratch_events = Self::scratch_events(&*gpu)?;
        Ok(WorkerCtx {
            gpu,
            generation: shared.generation.load(Ordering::SeqCst),
            shared,
            lane,
            markers: Vec::new(),
            deferred: Vec::new(),
            deferred_len: 0,
            scratch_events,
            next_work: 0,
            last_fault_check: Instant::now(),
            last_reset_try: None,
            fault: None,
            dead_host_nodes: Vec::new(),
        })
    }

    /// Follows the other lanes: a fault one of them found, a context one of them recreated.
    fn sync_with_lanes(&mut self) {
        let code = self.shared.fault_code.load(Ordering::SeqCst);
        if code != 0 && self.fault.is_none() {
            self.enter_fault(code);
        }
        let g = self.shared.generation.load(Ordering::SeqCst);
        if g != self.generation {
            self.generation = g;
            // The reset destroyed this lane's events and whatever its frees were waiting on.
            match Self::scratch_events(&*self.gpu) {
                Ok(ev) => self.scratch_events = ev,
                Err(e) => tracing::error!("events after the reset: CUDA error {}", e.0),
            }
            // Nothing of theirs exists any more; only the books are left to settle.
            for d in std::mem::take(&mut self.deferred).into_iter().flatten() {
                self.free(d.client, d.release, d.final_for_client, false);
            }
            self.deferred_len = 0;
            self.fault = None;
        }
    }

    /// One slot per stream, each made at first use (most confined streams never are).
    fn scratch_events(gpu: &dyn Gpu) -> GpuResult<Vec<u64>> {
        Ok(vec![0; gpu.stream_count()])
    }

    /// The events the worker holds for itself (a scratch event per work stream it used),
    /// which no client's retirement frees.
    pub fn own_events(&self) -> usize {
        self.scratch_events.iter().filter(|&&e| e != 0).count()
    }

    /// The scratch event of stream `i`, made now if it never was.
    fn scratch_event(&mut self, i: usize) -> GpuResult<u64> {
        let slot = self
            .scratch_events
            .get_mut(i)
            .ok_or(CuError(crate::gpu::code::INVALID_HANDLE))?;
        if *slot == 0 {
            *slot = self.gpu.event_create(0x2)?;
        }
        Ok(*slot)
    }

    /// Once every client of a faulted GPU is gone and released, recreate its context, as
    /// MPS does, and accept clients again.
    fn recover(&mut self) {
        let dev = self.gpu.ordinal();
        // Only lane 0 resets, once no lane has a client left and nothing of theirs is
        // still being released into the old context.
        if self.lane != 0
            || self.shared.sessions.load(Ordering::SeqCst) != 0
            || !self.shared.releaser.idle()
            // A load of a client gone meanwhile may still be in the driver.
            || self.shared.compiler.busy()
            || self
                .last_reset_try
                .is_some_and(|t| t.elapsed() < Duration::from_millis(5))
        {
            return;
        }
        self.last_reset_try = Some(Instant::now());
        // No release runs across the reset: one sent meanwhile by a lane that has not seen
        // the reset yet carries the old generation and only settles the books.
        let shared = self.shared.clone();
        let no_pass = shared.pass_lock.write().unwrap_or_else(|e| e.into_inner());
        let releases_held = shared.releaser.exclusive();
        let reset = self.gpu.reset();
        // The reset unloaded every module, shared ones too.
        shared.modules.clear();
        if reset.is_ok() {
            // The fault is cleared before the new generation shows: a lane that sees the
            // generation and drops its fault must not find the old code and fault again
            // (it then failed the first new client it served).
            shared.fault_code.store(0, Ordering::SeqCst);
            self.generation = shared.generation.fetch_add(1, Ordering::SeqCst) + 1;
        }
        drop(releases_held);
        drop(no_pass);
        match reset.and_then(|_| Self::scratch_events(&*self.gpu)) {
            Ok(events) => {
                self.scratch_events = events;
                self.fault = None;
                self.shared.reset_failures.store(0, Ordering::SeqCst);
                self.shared.faulted.store(false, Ordering::SeqCst);
                tracing::info!(
                    gpu = dev,
                    "context recreated after the fault; accepting clients again"
                );
            }
            Err(e) => {
                let n = self.shared.reset_failures.fetch_add(1, Ordering::SeqCst);
                if n.is_multiple_of(100) {
                    tracing::error!(
                        gpu = dev,
                        "recreating the context failed: CUDA error {} ({} tries)",
                        e.0,
                        n + 1
                    );
                }
            }
        }
    }

    /// Binds a client stream, at its first work, to a work stream of its class
    /// ([`crate::sched::placement::pick`]: no other client's work on its CUDA stream, nor on its
    /// hardware queue while the queues allow). `capped`: within the client's share of the
    /// hardware queues (all but its sync stream, which only waits for its own work). None:
    /// nothing is left to it (the caller refuses the work).
    pub fn bind_work_stream(
        &mut self,
        client: u32,
        place: crate::sched::placement::Placement,
        stream_priority: i32,
        capped: bool,
    ) -> Option<usize> {
        let c = crate::sched::placement::class_of(place.qos, stream_priority);
        let class = self.gpu.layout().class_in(place.slot, c);
        self.next_work += 1;
        let mut bindings = self.shared.bindings();
        let gpu = self.gpu.clone();
        let picked = crate::sched::placement::pick(
            &gpu.layout(),
            &bindings,
            class,
            client,
            capped.then_some(self.shared.queue_share.load(Ordering::Relaxed)),
            self.next_work,
            // A stream whose query fails (a capture left on it) is not idle.
            &mut |i| gpu.stream_query(i).unwrap_or(false),
        );
        let Some((pick, shared)) = picked else {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    client,
                    "a client's streams hold every work stream left to it \
                     (OMPS_CLIENT_QUEUES); its further streams are refused"
                )
            });
            return None;
        };
        if shared {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!("every work stream is held by other clients; sharing one")
            });
        }
        let b = &mut bindings[pick];
        if b.refs == 0 {
            b.client = client;
        }
        b.refs += 1;
        Some(pick)
    }

    /// A work stream that only this client stream will use (for a capture): `old` if it
    /// is bound to it alone, else a free idle one of its class within the client's share
    /// of the queues, bound now; None when there is none. Neither may be the last stream of
    /// its class that is not held for a capture ([`crate::sched::placement::may_capture`]).
    pub fn bind_alone(
        &mut self,
        client: u32,
        place: crate::sched::placement::Placement,
        stream_priority: i32,
        old: Option<usize>,
    ) -> Option<usize> {
        use crate::sched::placement::{may_capture, queues_held, within_share};
        let c = crate::sched::placement::class_of(place.qos, stream_priority);
        let layout = self.gpu.layout();
        let class = layout.class_in(place.slot, c);
        let mut bindings = self.shared.bindings();
        if let Some(o) = old.filter(|&o| {
            bindings.get(o).is_some_and(|b| b.refs == 1) && may_capture(&layout, &bindings, o)
        }) {
            bindings[o].exclusive = true;
            return Some(o);
        }
        let held = queues_held(&layout, &bindings, client);
        let share = self.shared.queue_share.load(Ordering::Relaxed);
        let free = class.clone().find(|&i| {
            bindings[i].refs == 0
                && within_share(&layout, &held, share, i)
                && may_capture(&layout, &bindings, i)
                && self.gpu.stream_query(i).unwrap_or(false)
        })?;
        bindings[free] = Binding {
            client,
            refs: 1,
            exclusive: true,
        };
        Some(free)
    }

    /// A client stream bound to work stream `i` is gone.
    pub fn unbind_work_stream(&mut self, i: usize) {
        let mut bindings = self.shared.bindings();
        if let Some(b) = bindings.get_mut(i) {
            b.refs = b.refs.saturating_sub(1);
            if b.refs == 0 {
                b.exclusive = false;
            }
        }
    }

    /// A capture on work stream `i` ended: it may be shared again.
    pub fn share_again(&mut self, i: usize) {
        let mut bindings = self.shared.bindings();
        if let Some(b) = bindings.get_mut(i) {
            b.exclusive = false;
        }
    }

    /// Makes stream `m` (a client's sync stream) wait for the work already queued on every
    /// stream in `streams`, and for the events `left` (work of streams the client gave up).
    pub fn join_streams(&mut self, streams: &StreamSet, left: &[u64], m: usize) -> GpuResult<()> {
        for i in streams.iter() {
            let ev = self.scratch_event(i)?;
            self.gpu.event_record(ev, i)?;
            self.gpu.stream_wait_event(m, ev)?;
        }
        for &ev in left {
            self.gpu.stream_wait_event(m, ev)?;
        }
        Ok(())
    }

    /// Makes work stream `after` wait for what is queued on work stream `before` now.
    pub fn order(&mut self, before: usize, after: usize) -> GpuResult<()> {
        let ev = self.scratch_event(before)?;
        self.gpu.event_record(ev, before)?;
        self.gpu.stream_wait_event(after, ev)
    }

    pub(crate) fn add_marker(
        &mut self,
        client: Arc<ClientShared>,
        channel: u32,
        word: Word,
        seq: u32,
        stream: usize,
    ) {
        let marker = Marker {
            client,
            channel,
            word,
            seq,
            stream,
            since: Instant::now(),
            warned: false,
        };
        // A new wait on the same word replaces the old one: the client no longer waits
        // for it, and a client that forges its words cannot grow this list.
        if let Some(old) = self
            .markers
            .iter_mut()
            .find(|m| m.client.id == marker.client.id && m.channel == channel && m.word == word)
        {
            *old = marker;
            return;
        }
        self.markers.push(marker);
    }

    /// Frees `release` once everything the session queued so far has finished.
    pub fn release_later(&mut self, s: &mut Session, release: Release) {
        let Some(m) = s.sync_stream(self) else {
            // Unreachable (see sync_stream); kept, never freed early: its work may run.
            tracing::error!(client = s.client.id, "no stream to fence a release on");
            return;
        };
        let left = s.left_events(self);
        // The fence's joins and its record count toward the client's depth (depth.rs):
        // frees behind a long kernel fill its streams as launches do.
        s.queued_join(self, &s.fence_streams(), left.len(), m, 1);
        self.defer(
            s.client.clone(),
            &s.fence_streams(),
            &left,
            m,
            release,
            false,
        );
    }

    fn defer(
        &mut self,
        client: Arc<ClientShared>,
        streams: &StreamSet,
        left: &[u64],
        m: usize,
        release: Release,
        final_for_client: bool,
    ) {
        let fence = self.gpu.event_create(0x2).and_then(|ev| {
            self.join_streams(streams, left, m)?;
            self.gpu.event_record(ev, m)?;
            Ok(ev)
        });
        match fence {
            Ok(fence) => {
                if self.deferred.len() <= m {
                    self.deferred.resize_with(m + 1, Default::default);
                }
                self.deferred[m].push_back(Deferred {
                    fence,
                    client,
                    final_for_client,
                    release,
                });
                self.deferred_len += 1;
            }
            Err(e) => {
                // No fence means the context is broken: nothing can still be running.
                tracing::warn!("fence failed ({}); releasing at once", e.0);
                self.free(client, release, final_for_client, true);
            }
        }
    }

    /// A block of exactly `size` bytes that `client` freed and the GPU is done with, handed
    /// back instead of freed: cuMemFree and cuMemAlloc of a fresh block each map or unmap
    /// pages (25-30 us each on an H100, `scripts/probe/free_costs.cu`), a fence query
    /// costs 0.3 us. Only the client's own memory: another client's data is never shown.
    pub fn reuse_freed(&mut self, client: &ClientShared, size: u64) -> Option<u64> {
        let gpu = &self.gpu;
        // Only fences that have passed qualify, and on one stream they pass in order: the
        // search stops at the first that has not.
        let (q, i) = self.deferred.iter().enumerate().find_map(|(q, queue)| {
            queue
                .iter()
                .take_while(|d| gpu.event_query(d.fence).unwrap_or(false))
                .position(|d| {
                    d.client.id == client.id
                        && !d.final_for_client
                        && d.release.is_one_alloc_of(size)
                })
                .map(|i| (q, i))
        })?;
        let d = self.deferred[q].remove(i).expect("found above");
        self.deferred_len -= 1;
        let _ = self.gpu.event_destroy(d.fence);
        let (p, len) = d.release.allocs[0];
        client.uncharge(self.gpu.ordinal(), len);
        Some(p)
    }

    /// Hands what a client released to the releaser thread (see [`crate::release::releaser`]).
    /// After a context reset the handles are gone with the old context (`in_context`
    /// false): only the books are settled.
    fn free(
        &self,
        client: Arc<ClientShared>,
        rel: Release,
        final_for_client: bool,
        in_context: bool,
    ) {
        free_on(
            &self.shared,
            &self.gpu,
            client,
            rel,
            final_for_client,
            in_context.then_some(self.generation),
        );
    }

    /// Releases `rel` of session `s` once the client's work on every GPU it sees has
    /// passed a fence (it enabled peer access: crate::release::peer_fence).
    pub fn release_everywhere(&mut self, s: &mut Session, rel: Release) {
        let token = crate::release::peer_fence::hold(
            &self.shared,
            &self.gpu,
            self.generation,
            &s.client,
            rel,
            false,
        );
        self.release_later(s, Release::fencing(vec![token], false));
    }

    /// Fences other GPUs asked of session `s` (crate::release::peer_fence), once its ring has been
    /// read as far as the client had written it when they asked.
    pub fn fence_for_peers(&mut self, s: &mut Session) {
        let tokens =
            crate::release::peer_fence::take(&s.client, self.gpu.ordinal(), s.ring_position());
        if !tokens.is_empty() {
            self.release_later(s, Release::fencing(tokens, false));
        }
    }

    pub fn retire(&mut self, mut s: Session) {
        // Captures it left going end here: their streams go back clean; host functions it
        // never ran are acknowledged.
        s.end_captures(self);
        s.release_host_functions();
        let (host_nodes, host_words) = (s.take_host_nodes(), s.take_host_words());
        if !host_nodes.is_empty() || !host_words.is_empty() {
            self.dead_host_nodes
                .push((s.client.clone(), host_nodes, host_words));
        }
        let _ = self
            .shared
            .sessions
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        // Always there (see sync_stream); else one of its own streams carries the fence.
        let (m, extra) = match s.sync_stream(self) {
            Some(m) => (m, None),
            None => {
                tracing::error!(client = s.client.id, "no sync stream to fence its end on");
                let m = s.fence_streams().iter().next().unwrap_or(0);
                (m, Some(m))
            }
        };
        let (fence_streams, left) = (s.fence_streams(), s.left_events(self));
        let bound = s.bound_work_streams();
        let raised_limits = !s.limits_set().is_empty();
        let (client, mut rel) = s.into_release(&self.shared);
        if raised_limits {
            rel.limits = Some(self.shared.clone());
        }
        self.markers.retain(|mk| mk.client.id != client.id);
        // Fences other GPUs asked of it pass with its last work; so does, for a client with
        // peer access, what it held here, once its work on the other GPUs is done too.
        let asked = crate::release::peer_fence::retire(&client, self.gpu.ordinal());
        client.forget_allocs(self.gpu.ordinal());
        if client.leaves_wait_everywhere() {
            let held = crate::release::peer_fence::hold(
                &self.shared,
                &self.gpu,
                self.generation,
                &client,
                rel,
                true,
            );
            let mut tokens = asked;
            tokens.push(held);
            let rel = Release::fencing(tokens, true);
            self.defer(client, &fence_streams, &left, m, rel, false);
        } else {
            rel.cross = crate::release::peer_fence::CrossPart {
                tokens: asked,
                settles: true,
            };
            self.defer(client, &fence_streams, &left, m, rel, true);
        }
        // Only now, its fence queued: a stream given back earlier could be bound (and
        // captured) by another client before the fence joins it. Handed out again only
        // once idle.
        for i in bound {
            self.unbind_work_stream(i);
        }
        if extra.is_none() {
            self.unbind_work_stream(m);
        }
    }

    /// Completes what the GPU finished and frees what is idle, and waits until the
    /// releaser has given it back: one pass of the worker's housekeeping, made
    /// deterministic for tests and the fuzz targets (the worker itself never waits).
    pub fn poll(&mut self) {
        self.poll_markers();
        self.poll_deferred();
        self.shared.releaser.wait_idle(Duration::from_secs(10));
    }

    /// Gives back what the GPU is done with, and waits a little for the releaser: an
    /// allocation that ran out of memory retries after it. Returns whether anything could
    /// have come back. Only on that path does a worker wait (at most 200 ms).
    pub fn reclaim(&mut self) -> bool {
        let had = self.deferred_len > 0
            || !self.shared.releaser.memory_back()
            || self.shared.held.load(Ordering::SeqCst) > 0;
        // Only releases that give memory back: a fence behind another client's long kernel
        // that frees only events or modules is not worth the lane's wait.
        self.reclaim_until(Duration::from_millis(200), |d| d.release.gives_memory());
        let _ = self.gpu.settle_frees();
        had
    }

    /// As [`WorkerCtx::reclaim`], for a client over its memory limit: only when it has
    /// frees of its own still waiting for their fence here, or the releaser has work (its
    /// own may be there), so that a client with nothing to come back waits for nothing.
    /// The wait is short (20 ms at most): a client at its limit must not hold up the
    /// other clients of its lane; it gets CUDA_ERROR_OUT_OF_MEMORY sooner instead.
    pub fn reclaim_for(&mut self, client: u32) -> bool {
        let own = |d: &Deferred| d.client.id == client;
        if !self.deferred.iter().flatten().any(own)
            && self.shared.releaser.memory_back()
            && self.shared.held.load(Ordering::SeqCst) == 0
        {
            return false;
        }
        self.reclaim_until(Duration::from_millis(20), own);
        true
    }

    /// Hands the releaser each deferred release as its fence passes, until none that
    /// `wanted` picks is left, then waits for the releaser, all within `limit`. A fence
    /// the worker recorded a moment ago (the free just before a retried allocation) has
    /// not passed yet: one look would find it not done (PyTorch's empty_cache and retry
    /// come microseconds apart), so it is looked at again until the limit.
    /// Releases held for other GPUs' fences (crate::release::peer_fence) are waited for too, while
    /// the newest is younger than `limit`: their fences pass on other threads, and one
    /// that has not passed by then waits for a GPU stuck or busy for long (one of those
    /// once cost every out-of-memory answer on every other GPU 200 ms).
    fn reclaim_until(&mut self, limit: Duration, wanted: impl Fn(&Deferred) -> bool) {
        let t = Instant::now();
        loop {
            self.poll_deferred();
            let waiting =
                self.deferred.iter().flatten().any(&wanted) || self.shared.held_young(limit);
            if !waiting || t.elapsed() >= limit {
                break;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        // Not its unloads: one may wait for a kernel that never ends.
        self.shared
            .releaser
            .wait_memory(limit.saturating_sub(t.elapsed()));
    }

    /// Completions the lane watches for (tests).
    pub fn marker_count(&self) -> usize {
        self.markers.len()
    }

    pub fn has_pending(&self) -> bool {
        !self.markers.is_empty() || self.deferred_len > 0
    }

    /// Wakes clients whose completions landed; detects a GPU fault behind a stuck marker.
    fn poll_markers(&mut self) {
        let mut stuck_stream = None;
        self.markers.retain_mut(|mk| {
            let Some(ch) = mk.client.seg.channel(mk.channel as usize) else {
                return false;
            };
            let Some(w) = ch.word(mk.word) else {
                return false;
            };
            if w.load(Ordering::Acquire) == mk.seq {
                if ch.waiting.load(Ordering::SeqCst) != 0 {
                    futex::wake(w, u32::MAX);
                }
                return false;
            }
            let waited = mk.since.elapsed();
            if waited > Duration::from_millis(2) {
                stuck_stream = Some(mk.stream);
            }
            if waited > LONG_WAIT && !mk.warned {
                mk.warned = true;
                tracing::warn!(
                    client = mk.client.id,
                    pid = mk.client.pid,
                    "work the client waits for has run for over {} s; \
                     `omps-ctl terminate_client {}` cuts it off (a kernel that never ends \
                     keeps its resources until the context is reset)",
                    LONG_WAIT.as_secs(),
                    mk.client.pid
                );
            }
            true
        });
        // A sticky fault stops the GPU from ever writing the markers; ask the driver now
        // and then rather than on every pass (a query costs over a microsecond).
        if let Some(s) = stuck_stream {
            if self.last_fault_check.elapsed() > Duration::from_millis(1) {
                self.last_fault_check = Instant::now();
                // Only a sticky error poisons the context; a capture error is one client's.
                if let Err(CuError(e)) = self.gpu.stream_query(s) {
                    self.fault_if_sticky(e);
                }
            }
        }
    }

    /// Faults the GPU when `e` is an error that poisons the context; any other error is
    /// one client's.
    pub fn fault_if_sticky(&mut self, e: i32) {
        if crate::gpu::is_sticky(e) {
            self.enter_fault(e);
        }
    }

    /// A sticky error poisoned the context: every waiting client gets it.
    pub fn enter_fault(&mut self, e: i32) {
        self.shared.faulted.store(true, Ordering::SeqCst);
        let _ = self
            .shared
            .fault_code
            .compare_exchange(0, e, Ordering::SeqCst, Ordering::SeqCst);
        if self.fault.is_none() {
            tracing::error!(
                gpu = self.gpu.ordinal(),
                "GPU fault {e}: failing every client of this GPU"
            );
        }
        self.fault = Some(e);
        for mk in self.markers.drain(..) {
            if let Some(ch) = mk.client.seg.channel(mk.channel as usize) {
                ch.result.store(e, Ordering::Relaxed);
                if let Some(w) = ch.word(mk.word) {
                    w.store(mk.seq, Ordering::Release);
                    futex::wake(w, u32::MAX);
                }
            }
            mk.client.set_state(state::FAULT, e);
        }
    }

    /// A dead client's graph may still be replayed by launches it queued: each replay
    /// waits for `ack == 1` and then clears it, so the slots are set again on every pass
    /// until the client is released (its last fence passed: nothing of it runs any more).
    fn ack_dead_host_nodes(&mut self) {
        self.dead_host_nodes.retain(|(client, slots, words)| {
            if client.released.load(Ordering::SeqCst) > 0 {
                return false;
            }
            for &i in slots {
                if let Some(w) = client.seg.hostfn(i as usize) {
                    w.ack.store(1, Ordering::Release);
                }
            }
            if !words.is_empty() {
                client.with_pinned(|pinned| {
                    for &a in words {
                        if pinned(a, 4) {
                            // SAFETY: a word of the client's pinned memory, which stays
                            // mapped while it is listed (the lock held keeps it listed).
                            unsafe {
                                (*(a as *const std::sync::atomic::AtomicU32))
                                    .store(1, Ordering::Release)
                            };
                        }
                    }
                });
            }
            true
        });
    }

    fn poll_deferred(&mut self) {
        self.ack_dead_host_nodes();
        for q in 0..self.deferred.len() {
            while let Some(d) = self.deferred[q].front() {
                // A broken context runs nothing any more: treat its fences as passed.
                if !self.gpu.event_query(d.fence).unwrap_or(true) {
                    break;
                }
                let d = self.deferred[q].pop_front().expect("front exists");
                self.deferred_len -= 1;
                let _ = self.gpu.event_destroy(d.fence);
                self.free(d.client, d.release, d.final_for_client, true);
            }
        }
    }
}

/// Frees what a client released once the GPU is done with it, on the GPU's releaser;
/// `generation`: the context generation its handles belong to (None: none are left).
pub fn free_on(
    shared: &Arc<GpuShared>,
    gpu: &Arc<dyn Gpu>,
    client: Arc<ClientShared>,
    mut rel: Release,
    final_for_client: bool,
    generation: Option<u64>,
) {
    // Exported allocations the owner is done with: freed now unless an importer
    // holds one open (then the last importer to close frees it, and the owner's process
    // stays charged for it until then). Openings an importer closed, now that its work
    // is done: the last user of a freed one frees it (counted as its own, since the
    // releaser takes it off the count).
    if !rel.ipc.is_empty() || !rel.ipc_close.is_empty() {
        let mut ipc = shared.ipc.lock().unwrap_or_else(|e| e.into_inner());
        for p in std::mem::take(&mut rel.ipc_close) {
            if let Some(Some((ptr, n))) = ipc.close(p, client.id) {
                client.add_mem(gpu.ordinal(), n);
                rel.allocs.push((ptr, n));
            }
        }
        for (p, n) in std::mem::take(&mut rel.ipc) {
            if ipc.owner_frees(p, client.id) {
                rel.allocs.push((p, n));
            } else {
                ipc.keep_charged(p, client.hold(gpu.ordinal(), n));
            }
        }
    }
    // Physical memory shared with other clients goes with its last user; what stays
    // stays charged to its owner's process until then.
    if !rel.vmm.handles.is_empty() {
        let mut ipc = shared.vmm_ipc.lock().unwrap_or_else(|e| e.into_inner());
        rel.vmm.handles.retain(|&(h, size)| {
            let last = ipc.release_vmm(h);
            if !last && size > 0 {
                ipc.keep_vmm(h, client.hold(gpu.ordinal(), size));
            }
            last
        });
    }
    shared
        .releaser
        .send(&**gpu, client, rel, final_for_client, generation);
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; sched_setaffinity reads it for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
            tracing::warn!("could not pin worker to cpu {cpu}");
        }
    }
}

/// Records taken from one client's ring per pass, so one busy client can't starve others.
/// A launch costs the worker about 3.7 us of `cuLaunchKernel` (H100), so with 8 clients
/// that each queue a burst, the last one's first kernel waits 7 x BATCH launches: 64 made
/// that 1.3 ms, 8 makes it 0.2 ms. A pass's own housekeeping is well under 1 us.
const BATCH: usize = 8;

pub fn run(
    gpu: Arc<dyn Gpu>,
    mut rx: rtrb::Consumer<ToWorker>,
    bell: &Doorbell,
    cfg: WorkerConfig,
    shared: Arc<GpuShared>,
    lane: usize,
) {
    if let Some(cpu) = cfg.cpu {
        pin_to(cpu);
    }
    let dev = gpu.ordinal();
    // Module loads and links run off the lanes (crate::image::compile).
    shared.compiler.go_threaded();
    let mut ctx = match WorkerCtx::lane(gpu, shared.clone(), lane) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(gpu = dev, "worker cannot start: {}", e.0);
            return;
        }
    };
    let mut sessions: Vec<Session> = Vec::new();
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut last_work = Instant::now();
    let mut quitting = false;
    let stats = &shared.stats[lane.min(shared.stats.len() - 1)];
    loop {
        stats.passes.fetch_add(1, Ordering::Relaxed);
        while let Ok(msg) = rx.pop() {
            match msg {
                ToWorker::Add(c) => {
                    shared.sessions.fetch_add(1, Ordering::SeqCst);
                    // SAFETY: every client segment holds a ring per GPU (layout from the
                    // GPU count).
                    sessions.push(unsafe { Session::new(c, dev) })
                }
                ToWorker::Remove(id) => {
                    if let Some(i) = sessions.iter().position(|s| s.client.id == id) {
                        let s = sessions.swap_remove(i);
                        ctx.retire(s);
                    }
                }
                ToWorker::Unpin(id, p) => match sessions.iter_mut().find(|s| s.client.id == id) {
                    // A graph of the client's that copies there keeps it (graph_memory.rs).
                    Some(s) => {
                        if let Err(p) = s.hold_pinned_for_graphs(p) {
                            ctx.release_later(
                                s,
                                Release {
                                    pinned: vec![p],
                                    ..Default::default()
                                },
                            )
                        }
                    }
                    None => {
                        // Its session is gone with its work: nothing here to wait for.
                        p.done();
                    }
                },
                ToWorker::Quit => quitting = true,
            }
        }
        if quitting {
            for s in sessions.drain(..) {
                ctx.retire(s);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while ctx.deferred_len > 0 && Instant::now() < deadline {
                ctx.poll_deferred();
                std::thread::sleep(Duration::from_millis(1));
            }
            shared
                .releaser
                .wait_idle(deadline.saturating_duration_since(Instant::now()));
            return;
        }
        // A pass runs against one context: lane 0 resets it only while no lane is in a
        // pass (recover takes the write side), and a lane first catches up with a reset.
        let pass = shared.pass_lock.read().unwrap_or_else(|e| e.into_inner());
        ctx.sync_with_lanes();
        let mut busy = false;
        let mut i = 0;
        while i < sessions.len() {
            // A client whose stream is queued too deep waits on its own full ring, not
            // the worker in the driver (session/depth.rs).
            // A client whose module load or link runs off the lane waits for it the same
            // way (session/compile.rs); one done is answered first.
            // A panic in what the worker does for one client (its depth marks, its fences
            // for peers, as in its records below) ends that client, not the lane.
            let held = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let s = &mut sessions[i];
                Ok(s.compile_waiting(&mut ctx)? || s.held_back(&ctx))
            }));
            let mut outcome = match held {
                Ok(Ok(true)) => {
                    i += 1;
                    continue;
                }
                Ok(Ok(false)) => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(_) => {
                    tracing::error!(
                        client = sessions[i].client.id,
                        "the server panicked over a client's depth or load: it is cut off"
                    );
                    Err(crate::session::Malformed("server failure".into()))
                }
            };
            // A client cut off above takes no records: it goes with the others below.
            let batch = if outcome.is_ok() { BATCH } else { 0 };
            for _ in 0..batch {
                match sessions[i].pop(&mut buf) {
                    Ok(Some(tag)) => {
                        busy = true;
                        let t0 = Instant::now();
                        // A panic in the server's handling of one record (a bug the client's
                        // bytes found) ends that client, not the lane and every client on it.
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            sessions[i].handle(&mut ctx, tag, &buf)
                        }))
                        .unwrap_or_else(|_| {
                            tracing::error!(
                                client = sessions[i].client.id,
                                tag,
                                "the server panicked handling a record: the client is cut off"
                            );
                            Err(crate::session::Malformed(format!(
                                "the server failed on record {tag}"
                            )))
                        });
                        let ns = t0.elapsed().as_nanos() as u64;
                        stats.record(tag, ns);
                        sessions[i]
                            .client
                            .server_ns
                            .fetch_add(ns, Ordering::Relaxed);
                        if let Err(e) = r {
                            outcome = Err(e);
                            break;
                        }
                        if sessions[i].is_deep() || sessions[i].compiling() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
            if outcome.is_ok() {
                let fenced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    ctx.fence_for_peers(&mut sessions[i])
                }));
                if fenced.is_err() {
                    tracing::error!(
                        client = sessions[i].client.id,
                        "the server panicked fencing a client's work for its other GPUs: it is cut off"
                    );
                    outcome = Err(crate::session::Malformed("server failure".into()));
                }
            }
            if let Err(e) = outcome {
                let s = sessions.swap_remove(i);
                s.client
                    .disconnect(crate::gpu::code::MPS_CLIENT_TERMINATED, &e.0);
                ctx.retire(s);
                continue;
            }
            i += 1;
        }
        ctx.poll_markers();
        ctx.poll_deferred();
        ctx.sync_with_lanes();
        drop(pass);
        if let Some(e) = ctx.fault {
            // Every client of the GPU learns of the fault (MPS's contract), and once they
            // are all gone the context is recreated.
            for s in &sessions {
                if s.client.seg.header().server_state.load(Ordering::Relaxed) != state::FAULT {
                    s.client.set_state(state::FAULT, e);
                }
            }
            if sessions.is_empty()
                && ctx.deferred_len == 0
                && shared.held.load(Ordering::SeqCst) == 0
            {
                ctx.recover();
            }
        }
        if busy {
            last_work = Instant::now();
        } else if last_work.elapsed() >= cfg.spin {
            // Rest until a client rings; wake now and then while the GPU owes completions,
            // and in any case so a client that clears the shared sleep flag can delay
            // others by a few milliseconds at most.
            // A load off the lane is looked for as often as the GPU's completions are.
            let timeout = if ctx.has_pending() || sessions.iter().any(Session::compiling) {
                Duration::from_micros(50)
            } else {
                Duration::from_millis(5)
            };
            stats.naps.fetch_add(1, Ordering::Relaxed);
            bell.sleep_unless(
                || !rx.is_empty() || sessions.iter_mut().any(|s| !s.compiling() && s.has_data()),
                Some(timeout),
            );
        } else {
            std::hint::spin_loop();
        }
    }
}
