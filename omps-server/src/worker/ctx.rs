//! One worker thread per GPU: polls every client's ring for that GPU, runs the commands,
//! wakes clients whose completions the GPU wrote, and frees what clients released once the
//! GPU is done with it. It never waits for the GPU.
//!
//! This file holds a lane's context ([`WorkerCtx`]), which the sessions use: its
//! bindings of work streams, markers and deferred frees. What it does for a session
//! (fences, retirement) is in its child ctx/session.rs, the lane loop in run.rs, what the
//! lanes of a GPU share in gpu_shared.rs: none of them is used by the sessions' state.

use super::free::free_on;
use super::GpuShared;
use crate::client::ClientShared;
use crate::gpu::{CuError, Gpu, GpuResult};
use crate::release::given::{PinnedRelease, Release};
use crate::sched::placement::StreamSet;
use omps_ring::futex;
use omps_ring::segment::{state, Word};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod bind;
mod quick_free;
mod session;

pub enum ToWorker {
    Add(Arc<ClientShared>),
    Remove(u32),
    /// Release a pinned range of a client once its queued work on this GPU is done (the
    /// last GPU's worker unregisters it).
    Unpin(u32, PinnedRelease),
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
    pub(super) deferred_len: usize,
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
    /// Blocks clients freed with nothing on the GPU, kept for their next allocations.
    kept: super::kept::KeptBlocks,
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
            kept: Default::default(),
        })
    }

    /// Follows the other lanes: a fault one of them found, a context one of them recreated.
    pub(super) fn sync_with_lanes(&mut self) {
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
    pub(super) fn recover(&mut self) {
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
        let kept = self.shared.kept_bytes.load(Ordering::SeqCst) > 0;
        let had = self.deferred_len > 0
            || kept
            || !self.shared.releaser.memory_back()
            || self.shared.held.load(Ordering::SeqCst) > 0;
        if kept {
            // Every lane gives back the blocks it keeps for quick frees (this one at once,
            // the others on their next pass: reclaim_until waits for them).
            self.shared.give_back_kept.store(true, Ordering::SeqCst);
            self.give_back_kept();
        }
        // Only releases that give memory back: a fence behind another client's long kernel
        // that frees only events or modules is not worth the lane's wait.
        self.reclaim_until(Duration::from_millis(200), |d| d.release.gives_memory());
        if kept {
            self.shared.give_back_kept.store(false, Ordering::SeqCst);
        }
        let _ = self.gpu.settle_frees();
        had
    }

    /// As [`WorkerCtx::reclaim`], for a client over its memory limit: only when it has
    /// frees of its own still waiting for their fence here, or the releaser has work (its
    /// own may be there), so that a client with nothing to come back waits for nothing.
    /// The wait is short (20 ms at most): a client at its limit must not hold up the
    /// other clients of its lane; it gets CUDA_ERROR_OUT_OF_MEMORY sooner instead.
    pub fn reclaim_for(&mut self, client: u32) -> bool {
        // Its own blocks kept here for quick frees go first: they count against its limit.
        let kept = self.kept.of_client(client);
        let gave = !kept.is_empty();
        for k in kept {
            self.shared.kept_bytes.fetch_sub(k.len, Ordering::SeqCst);
            let rel = Release {
                allocs: vec![(k.ptr, k.len)],
                ..Default::default()
            };
            self.free(k.client, rel, false, true);
        }
        let own = |d: &Deferred| d.client.id == client;
        if !gave
            && !self.deferred.iter().flatten().any(own)
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
            // Blocks other lanes keep for quick frees, asked back (reclaim).
            let waiting = self.deferred.iter().flatten().any(&wanted)
                || self.shared.held_young(limit)
                || (self.shared.give_back_kept.load(Ordering::SeqCst)
                    && self.shared.kept_bytes.load(Ordering::SeqCst) > 0);
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
    pub(super) fn poll_markers(&mut self) {
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

    pub(super) fn poll_deferred(&mut self) {
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
