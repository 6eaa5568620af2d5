//! A client's [`Session`] on one GPU: what it holds there, the checks every family of
//! its commands shares, and the dispatch of each record to its family.
//!
//! Everything read from the ring is hostile: records are copied out of shared memory
//! before they are looked at (the ring does that), sizes are checked against the op, and
//! every handle is looked up in this client's own tables. A record that cannot have come
//! from an honest shim is [`Malformed`] and gets the client disconnected; an honest mistake
//! (a copy out of bounds, a failed allocation) becomes a CUDA error for the client.
//!
//! [`Session::handle`] checks a record's length and dispatches it to its family: `exec`
//! (launches, function queries, TMA descriptors), `memory`, `modules`, `sync` (streams,
//! events, synchronizing calls), `vmm` and `link`, each in its own file under `session/`.

use super::kinds::arrays::ArrayState;
use super::kinds::compile::Pending;
use super::kinds::cond::CondState;
use super::kinds::depth::Depth;
use super::kinds::graph_held::{HeldAtLast, HeldForGraphs};
use super::kinds::green::GreenCtx;
use super::kinds::vmm::VmmState;
pub(super) use super::record::{bad, fixed_only, rec, Malformed, Range};
pub(super) use crate::client::answer::wake_if_waiting;
pub(super) use crate::client::ClientShared;
pub(super) use crate::gpu::{code, CuError};
use crate::release::given::Release;
pub(super) use crate::sched::placement;
pub(super) use crate::worker::WorkerCtx;
pub(super) use omps_ring::ring::Consumer;
pub(super) use omps_ring::segment::{Channel, Word, CHUNKS_PER_CHANNEL};
pub(super) use omps_ring::wire::{self, CallHdr, Op};
pub(super) use std::collections::{BTreeMap, HashMap};
pub(super) use std::sync::atomic::Ordering;
pub(super) use std::sync::Arc;

/// Unfinished events of streams a client gave up, before they are folded into one
/// (`Session::fold_left`).
pub(super) const MAX_LEFT: usize = 64;

pub(super) struct Function {
    pub(super) handle: u64,
    pub(super) args_size: usize,
    pub(super) module: u32,
    /// In a shared module: its settable attributes as loaded (each client sees its own).
    pub(super) shared: Option<[Option<i32>; 7]>,
}

/// A client stream: the pool stream it runs on (bound at its first work, so that idle
/// streams hold none), and what CUDA's legacy default stream semantics need. Work on the
/// legacy stream (id 0) waits for earlier work of the client's blocking streams, and
/// theirs for earlier legacy work; non-blocking streams never wait. Only transitions cost
/// anything: an event record and a wait.
pub(super) struct ClientStream {
    pub(super) pool: Option<usize>,
    pub(super) priority: i32,
    pub(super) blocking: bool,
    /// Has queued work that later legacy-stream work must wait for.
    pub(super) dirty: bool,
    /// Must wait for the legacy stream's work before its next work.
    pub(super) stale: bool,
    /// Pieces of work queued on it so far.
    pub(super) submits: u64,
    /// Its last synchronization that went to the GPU.
    pub(super) synced: Option<SyncMark>,
    /// Its work stream is being captured (graphs.rs).
    pub(super) capturing: bool,
    /// The capture was begun on this stream (it did not fork into it from another).
    pub(super) origin: bool,
    /// The green context it was made in (green.rs), 0 for none.
    pub(super) green: u32,
}

impl ClientStream {
    pub(super) fn new(priority: i32, blocking: bool) -> Self {
        ClientStream {
            pool: None,
            priority,
            blocking,
            dirty: false,
            stale: false,
            submits: 0,
            synced: None,
            capturing: false,
            origin: false,
            green: 0,
        }
    }
}

/// A completion the GPU signals in stream order by storing `seq` into a word of channel
/// `channel` (a synchronization's done word, or a staging chunk's after its copy), and
/// how many submissions had been queued when it was.
#[derive(Clone, Copy)]
pub(super) struct SyncMark {
    pub(super) channel: u32,
    pub(super) word: Word,
    pub(super) seq: u32,
    pub(super) submits: u64,
}

impl SyncMark {
    /// The done word of `call`, after `submits` submissions.
    pub(super) fn done(call: CallHdr, submits: u64) -> Self {
        SyncMark {
            channel: call.channel,
            word: Word::Done,
            seq: call.seq,
            submits,
        }
    }
}

pub(super) struct Module {
    pub(super) handle: u64,
    pub(super) functions: Vec<u32>,
    /// Loaded once for every client with the same image ([`crate::image::module_cache`]).
    pub(super) shared: bool,
    /// Device memory its variables take, counted as the client's.
    pub(super) data_bytes: u64,
}

pub struct Session {
    pub client: Arc<ClientShared>,
    pub(super) consumer: Consumer,
    pub(super) dev: usize,
    /// Whether `client.used_gpus` has this GPU's bit (set at its first record here).
    pub(super) marked_used: bool,
    pub(super) streams: HashMap<u32, ClientStream>,
    /// Streams the client destroyed while a capture that forked into them still goes: the
    /// driver keeps them in the capture until its origin ends it, so their work streams
    /// stay this client's until then (graphs.rs, `refresh_capture_flags`).
    pub(super) parked: Vec<ClientStream>,
    pub(super) events: HashMap<u32, u64>,
    pub(super) modules: HashMap<u32, Module>,
    pub(super) functions: HashMap<u32, Function>,
    /// Device ranges this client may copy to and from: its allocations and module globals.
    pub(super) allocs: BTreeMap<u64, u64>,
    /// Module globals: start -> (length, the module whose unloading ends them).
    pub(super) globals: BTreeMap<u64, (u64, u32)>,
    pub(super) blobs: Vec<Vec<u8>>,
    /// Channels whose image went over OMPS_MAX_IMAGE_BYTES: dropped, and its load is
    /// answered CUDA_ERROR_OUT_OF_MEMORY.
    pub(super) blob_over: Vec<bool>,
    /// Per channel: the last JIT link's image and logs, until the next link.
    pub(super) link_out: Vec<Vec<u8>>,
    /// Bit i set when work stream i has carried this client's work.
    /// Its own stream for synchronizations and fences (made at its first), so that what
    /// it waits for never queues behind another client's waits (see `sync_stream`).
    pub(super) sync: Option<usize>,
    /// The placement its streams are bound under.
    pub(super) placement: placement::Placement,
    /// First asynchronous error since the last synchronizing call.
    pub(super) pending_error: i32,
    pub(super) next_id: u32,
    /// Pieces of work queued on all of its streams so far.
    pub(super) submits: u64,
    /// Its last context synchronization that went to the GPU.
    pub(super) ctx_synced: Option<SyncMark>,
    /// Context limits it set (crate::client::limits).
    pub(super) limits: HashMap<i32, u64>,
    /// Per limit, the device memory its value costs beyond the context's default, charged
    /// to it (session/exec.rs).
    pub(super) limit_charges: HashMap<i32, u64>,
    /// Attributes it set on shared modules' functions: (function, attribute) -> value.
    pub(super) fn_attrs: HashMap<(u32, i32), i32>,
    /// Its graphs and executable graphs: id -> the driver's handle.
    pub(super) graphs: HashMap<u32, u64>,
    pub(super) execs: HashMap<u32, u64>,
    /// The device memory each executable graph's memset and memcpy nodes use, and the
    /// blocks freed while one does, held until none does (session/graph_memory.rs).
    pub(super) exec_ranges: HashMap<u32, Vec<Range>>,
    pub(super) graph_held: Vec<Range>,
    /// Modules unloaded and IPC openings closed while such a graph used their memory.
    pub(super) graph_held_other: Vec<HeldForGraphs>,
    /// How many of its streams are being captured.
    pub(super) capturing: usize,
    /// Its conditional nodes' homes, handles and bodies.
    pub(super) cond: CondState,
    /// How many of its requests were refused (for `log_refusal`).
    pub(super) refusals: u32,
    /// Its events last recorded in a capturing stream: not to be waited for or queried.
    pub(super) captured_events: std::collections::HashSet<u32>,
    /// The last sequence queued through each host-function slot it used.
    pub(super) hostfn_last: HashMap<u32, u32>,
    /// Host-function slots its graphs' host nodes hold.
    pub(super) host_nodes: std::collections::BTreeSet<u32>,
    /// The `ack` words in its pinned memory that its graphs' other host nodes wait on.
    pub(super) host_words: std::collections::BTreeSet<u64>,
    /// The last work of streams it gave up (see `left_events`), at most [`MAX_LEFT`] + 1.
    pub(super) left: Vec<u64>,
    /// Its events to destroy as it goes (set by into_release: shared ones stay).
    pub(super) events_to_destroy: Vec<u64>,
    /// Other clients' allocations it opened through IPC: pointer -> (size, openings).
    pub(super) imported: BTreeMap<u64, (u64, u32)>,
    /// How far the GPU is behind each work stream it queued on (depth.rs).
    pub(super) depths: HashMap<usize, Depth>,
    /// Its work streams queued too deep, and since when it is held back.
    pub(super) deep: Vec<usize>,
    pub(super) held_since: Option<std::time::Instant>,
    /// When its oldest depth mark was last asked about (depth.rs).
    pub(super) depth_checked: Option<std::time::Instant>,
    pub(super) vmm: VmmState,
    pub(super) arrays: ArrayState,
    /// Its green contexts (green.rs).
    pub(super) greens: HashMap<u32, GreenCtx>,
    /// Its module load, JIT compile or link running off the lane (compile.rs).
    pub(super) compile: Option<Pending>,
}

impl Session {
    /// # Safety
    /// The client's segment holds ring `dev` and stays mapped while the session lives (the
    /// session holds an Arc of the client, which owns the mapping).
    pub unsafe fn new(client: Arc<ClientShared>, dev: usize) -> Self {
        // Its ring for this GPU: its device number, where it sees only some GPUs.
        let ring = client.ring_of(dev).unwrap_or(dev);
        let (hdr, data, cap) = client.seg.ring_parts(ring);
        // SAFETY: the caller's promise; the server is this ring's only consumer.
        let consumer = unsafe { Consumer::new(hdr, data, cap) };
        let channels = client.seg.layout.params.num_channels as usize;
        let mut s = Session {
            client,
            consumer,
            dev,
            marked_used: false,
            streams: HashMap::new(),
            parked: Vec::new(),
            events: HashMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            allocs: BTreeMap::new(),
            globals: BTreeMap::new(),
            blobs: vec![Vec::new(); channels],
            blob_over: vec![false; channels],
            link_out: vec![Vec::new(); channels],
            sync: None,
            placement: Default::default(),
            pending_error: 0,
            next_id: 1,
            submits: 0,
            ctx_synced: None,
            limits: HashMap::new(),
            limit_charges: HashMap::new(),
            fn_attrs: HashMap::new(),
            graphs: HashMap::new(),
            execs: HashMap::new(),
            exec_ranges: HashMap::new(),
            graph_held: Vec::new(),
            graph_held_other: Vec::new(),
            cond: Default::default(),
            refusals: 0,
            capturing: 0,
            captured_events: Default::default(),
            imported: BTreeMap::new(),
            events_to_destroy: Vec::new(),
            left: Vec::new(),
            hostfn_last: HashMap::new(),
            host_nodes: Default::default(),
            host_words: Default::default(),
            depths: HashMap::new(),
            deep: Vec::new(),
            held_since: None,
            depth_checked: None,
            vmm: Default::default(),
            arrays: Default::default(),
            greens: HashMap::new(),
            compile: None,
        };
        s.streams
            .insert(wire::STREAM_DEFAULT, ClientStream::new(0, false));
        s
    }

    pub fn has_data(&mut self) -> bool {
        self.consumer.has_data()
    }

    /// Takes the next record out of the ring: Ok(None) when empty.
    /// How far its ring has been read (crate::release::peer_fence).
    pub fn ring_position(&self) -> u64 {
        self.consumer.position()
    }

    pub fn pop(&mut self, buf: &mut Vec<u8>) -> Result<Option<u32>, Malformed> {
        self.consumer
            .pop_into(buf)
            .map_err(|c| Malformed(format!("corrupt ring: {}", c.reason)))
    }

    /// The pool stream of client stream `id`, for questions about it (queries and
    /// synchronizing), which take no part in the legacy stream's ordering; None while
    /// nothing was ever queued on it.
    pub(super) fn stream_pool(&self, id: u32) -> Result<Option<usize>, Malformed> {
        self.streams
            .get(&id)
            .map(|s| s.pool)
            .ok_or_else(|| Malformed(format!("unknown stream {id}")))
    }

    /// The pool stream for work on client stream `id`, after the implicit ordering of
    /// the legacy default stream has been queued. None: the stream has no work stream and
    /// none is left to the client (its share of the hardware queues is taken by its own
    /// captures): the work is refused, and its next synchronization says
    /// CUDA_ERROR_OUT_OF_MEMORY, as a driver out of streams would.
    pub(super) fn stream(
        &mut self,
        ctx: &mut WorkerCtx,
        id: u32,
    ) -> Result<Option<usize>, Malformed> {
        let place = self.client.placement(self.dev);
        if place != self.placement {
            self.move_to(ctx, place);
        }
        let client = self.client.id;
        let group = self.streams.get(&id).map_or(0, |s| s.green);
        let (place, legacy_id) = self.green_place(ctx, group);
        let Some(st) = self.streams.get_mut(&id) else {
            return bad(format!("unknown stream {id}"));
        };
        let pool = match st.pool {
            Some(p) => p,
            None => match ctx.bind_work_stream(client, place, st.priority, true) {
                Some(p) => *st.pool.insert(p),
                None => {
                    self.note_error(CuError(code::OUT_OF_MEMORY));
                    return Ok(None);
                }
            },
        };
        st.submits += 1;
        let capturing = st.capturing;
        self.queued_as(ctx, pool, 1, capturing);
        self.submits += 1;
        // Work on a blocking stream is ordered after legacy work only once there is some,
        // and then the legacy stream is bound. A green context has its own legacy stream,
        // ordered against its own blocking streams only, as a context's is natively.
        let legacy = self
            .streams
            .get(&legacy_id)
            .and_then(|s| s.pool)
            .unwrap_or(pool);
        let mut r = Ok(());
        // Each order is an event record on the first stream and a wait on the second: the
        // legacy stream's side is counted as its (a mark is never recorded in a capture).
        let mut orders = Vec::new();
        if id == legacy_id {
            for b in self
                .streams
                .values_mut()
                .filter(|b| b.blocking && b.green == group)
            {
                match b.pool {
                    // A capturing stream joins no implicit ordering: it would pull the
                    // legacy stream into its graph. Each work stream is ordered once,
                    // however many client streams it carries: one record adds at most
                    // the client's share of work streams to the legacy one, never a
                    // wait per client stream (thousands, past the driver's bound).
                    Some(bp)
                        if b.dirty && bp != legacy && !b.capturing && !orders.contains(&bp) =>
                    {
                        r = r.and(ctx.order(bp, legacy));
                        orders.push(bp);
                    }
                    _ => {}
                }
                b.dirty = false;
                b.stale = true;
            }
        } else if let Some(b) = self.streams.get_mut(&id).filter(|b| b.blocking) {
            if b.stale && pool != legacy && !b.capturing {
                r = ctx.order(legacy, pool);
                orders.push(pool);
            }
            b.stale = false;
            b.dirty = true;
        }
        for other in orders {
            // Never a capturing stream (skipped above).
            self.queued_as(ctx, other, 1, false);
            self.queued(ctx, legacy_id, legacy, 1);
        }
        if let Err(e) = r {
            self.note_error(e);
        }
        Ok(Some(pool))
    }

    /// Moves every bound stream to the client's new placement (QoS class, SM confinement):
    /// later work goes to a work stream there, after what the old one still holds.
    pub(super) fn move_to(&mut self, ctx: &mut WorkerCtx, place: placement::Placement) {
        self.placement = place;
        let greens: HashMap<u32, placement::Placement> = self
            .greens
            .keys()
            .map(|&g| (g, self.green_place(ctx, g).0))
            .collect();
        let mut r = Ok(());
        for st in self.streams.values_mut() {
            // A capturing stream stays where its capture is.
            let Some(old) = st.pool.filter(|_| !st.capturing) else {
                continue;
            };
            let place = greens.get(&st.green).copied().unwrap_or(place);
            // Nothing left to it there: the stream stays where it is.
            let Some(new) = ctx.bind_work_stream(self.client.id, place, st.priority, true) else {
                continue;
            };
            r = r.and(ctx.order(old, new));
            ctx.unbind_work_stream(old);
            st.pool = Some(new);
        }
        if let Err(e) = r {
            self.note_error(e);
        }
    }

    pub(super) fn event(&self, id: u32) -> Result<u64, Malformed> {
        self.events
            .get(&id)
            .copied()
            .ok_or_else(|| Malformed(format!("unknown event {id}")))
    }

    pub(super) fn channel(&self, c: u32) -> Result<&Channel, Malformed> {
        self.client
            .seg
            .channel(c as usize)
            .ok_or_else(|| Malformed(format!("channel {c} out of range")))
    }

    /// Whether a synchronization can complete at once, without the GPU: nothing was
    /// queued since `mark`, which the GPU has signalled, and there is no error to report.
    /// (A client that fakes its own done word only cuts its own waits short.)
    pub(super) fn already_synced(
        &self,
        ctx: &WorkerCtx,
        mark: Option<SyncMark>,
        submits: u64,
    ) -> bool {
        let Some(m) = mark else {
            return false;
        };
        m.submits == submits
            && self.pending_error == 0
            && ctx.fault.is_none()
            && self.channel(m.channel).is_ok_and(|ch| {
                // SYNC POINT: pairs with the GPU's (or the fault path's) store of the word.
                // A later value also means landed: the client reuses a word only after it
                // has seen the earlier completion.
                ch.word(m.word)
                    .is_some_and(|w| w.load(Ordering::Acquire).wrapping_sub(m.seq) as i32 >= 0)
            })
    }

    /// Counts `n` bytes against the client's memory on this GPU (its limit), first letting
    /// what it freed come back if that would take it over: PyTorch frees its cache and
    /// retries at once when an allocation fails.
    pub(super) fn charge(&self, ctx: &mut WorkerCtx, n: u64) -> Result<(), CuError> {
        match self.client.charge(self.dev, n) {
            Err(_) if ctx.reclaim_for(self.client.id) => self.client.charge(self.dev, n),
            r => r,
        }
    }

    pub(super) fn note_error(&mut self, e: CuError) {
        tracing::debug!(client = self.client.id, "asynchronous error {}", e.0);
        if e.0 == code::STREAM_CAPTURE_INVALIDATED {
            // Work queued into an invalidated capture: natively the call fails at once and
            // leaves nothing behind, and the capture's end reports it (901) here too.
            return;
        }
        if self.pending_error == 0 {
            self.pending_error = e.0;
        }
    }

    /// The first asynchronous error since the last synchronization, for the client. One
    /// that poisons the context (a launch the host GPU ran at once) faults the GPU here, as
    /// a stuck completion does on a real one.
    pub(super) fn take_pending(&mut self, ctx: &mut WorkerCtx) -> i32 {
        let e = std::mem::take(&mut self.pending_error);
        ctx.fault_if_sticky(e);
        e
    }

    /// Whether `[addr, addr+len)` lies inside one allocation or global of this client.
    pub(super) fn owns_range(&self, addr: u64, len: u64) -> bool {
        /// Whether the range lies inside the entry of `m` that starts at or below it.
        fn covers<V>(m: &BTreeMap<u64, V>, addr: u64, len: u64, size: impl Fn(&V) -> u64) -> bool {
            m.range(..=addr).next_back().is_some_and(|(&s, v)| {
                addr.checked_add(len)
                    .is_some_and(|end| end <= s.saturating_add(size(v)))
            })
        }
        // Page-locked and managed memory (the client's memfds, mapped and registered at
        // the same address) is device-visible too, as it is natively.
        covers(&self.allocs, addr, len, |&n| n)
            || covers(&self.globals, addr, len, |&(n, _)| n)
            || covers(&self.imported, addr, len, |&(n, _)| n)
            || self.vmm.mapped(addr, len)
            || self.client.pinned_contains(addr, len)
            // Its VMM memory mapped through another GPU's session with access for this one.
            || self
                .client
                .vmm_reaches(self.dev, addr, len, self.consumer.position())
    }

    /// The image uploaded into `channel` for a load or a link (which checked the channel),
    /// which the channel gives up: Err(CUDA_ERROR_OUT_OF_MEMORY) if it went over the
    /// bound, Err(`short`) if it is not `len` bytes long.
    pub(super) fn take_blob(&mut self, channel: u32, len: u64, short: i32) -> Result<Vec<u8>, i32> {
        let c = channel as usize;
        let blob = std::mem::take(&mut self.blobs[c]);
        self.client.account.totals.give_image(blob.len() as u64);
        if std::mem::take(&mut self.blob_over[c]) {
            return Err(code::OUT_OF_MEMORY);
        }
        if blob.len() as u64 != len {
            return Err(short);
        }
        Ok(blob)
    }

    /// Appends `bytes` to `channel`'s image, unless the client's images would go over
    /// OMPS_MAX_IMAGE_BYTES: then the image is dropped and its load will say so.
    pub(super) fn append_blob(&mut self, channel: usize, bytes: &[u8]) {
        let held: usize = self.blobs.iter().map(Vec::len).sum();
        let totals = self.client.account.totals.clone();
        // All clients' uploads together count too (OMPS_MAX_IMAGE_BYTES_TOTAL): N clients
        // at the bound must not exhaust the server's memory.
        if self.blob_over[channel]
            || (held + bytes.len()) as u64 > crate::client::bounds::bounds().image_bytes
            || !totals.take_image(bytes.len() as u64)
        {
            if !self.blob_over[channel] {
                self.log_refusal(format_args!(
                    "module image over OMPS_MAX_IMAGE_BYTES (or all clients' over OMPS_MAX_IMAGE_BYTES_TOTAL): its load fails with CUDA_ERROR_OUT_OF_MEMORY"
                ));
            }
            self.blob_over[channel] = true;
            totals.give_image(std::mem::take(&mut self.blobs[channel]).len() as u64);
            return;
        }
        self.blobs[channel].extend_from_slice(bytes);
    }

    /// The context limits this client set (crate::client::limits).
    pub(crate) fn limits_set(&self) -> &HashMap<i32, u64> {
        &self.limits
    }

    /// Logs why a request of this client was refused: the first few only, so a client
    /// that keeps asking cannot fill the log.
    pub(crate) fn log_refusal(&mut self, why: std::fmt::Arguments<'_>) {
        const LOGGED: u32 = 8;
        if self.refusals < LOGGED {
            tracing::warn!(client = self.client.id, "{why}");
        } else if self.refusals == LOGGED {
            tracing::warn!(
                client = self.client.id,
                "{why} (further refusals not logged)"
            );
        }
        self.refusals = self.refusals.saturating_add(1);
    }

    pub(super) fn check_range(&mut self, addr: u64, len: u64) -> bool {
        let ok = self.owns_range(addr, len);
        if !ok {
            self.note_error(CuError(code::INVALID_VALUE));
        }
        ok
    }

    /// Answers a call from the CPU: reply bytes, then result, then `done` (Release).
    pub(super) fn complete(
        &self,
        call: CallHdr,
        result: i32,
        reply: &[u8],
    ) -> Result<(), Malformed> {
        let ch = self.channel(call.channel)?;
        ch.write_reply(reply);
        ch.reply_len.store(reply.len() as u32, Ordering::Relaxed);
        ch.result.store(result, Ordering::Relaxed);
        // SYNC POINT: pairs with the client's Acquire load of `done`.
        ch.done.store(call.seq, Ordering::Release);
        wake_if_waiting(ch, &ch.done);
        Ok(())
    }

    pub(super) fn complete_pod<T: bytemuck::Pod>(
        &self,
        call: CallHdr,
        r: Result<T, CuError>,
    ) -> Result<(), Malformed> {
        match r {
            Ok(v) => self.complete(call, 0, bytemuck::bytes_of(&v)),
            Err(e) => self.complete(call, e.0, &[]),
        }
    }

    /// Answers a call once stream `s` reaches this point: the GPU writes `done`. Ok(true)
    /// when the GPU will; Ok(false) when the call was answered at once with an error.
    pub(super) fn complete_on_gpu(
        &mut self,
        ctx: &mut WorkerCtx,
        call: CallHdr,
        s: usize,
    ) -> Result<bool, Malformed> {
        let pending = self.take_pending(ctx);
        if pending != 0 {
            return self.complete(call, pending, &[]).map(|_| false);
        }
        self.signal_on_gpu(ctx, call.channel, Word::Done, call.seq, s)
    }

    /// Has the GPU store `seq` into a completion word in stream order. Ok(true) when it
    /// will; Ok(false) when the word was set at once with the error that prevented it.
    pub(super) fn signal_on_gpu(
        &mut self,
        ctx: &mut WorkerCtx,
        channel: u32,
        word: Word,
        seq: u32,
        s: usize,
    ) -> Result<bool, Malformed> {
        let ch = self.channel(channel)?;
        ch.result.store(0, Ordering::Relaxed);
        ch.reply_len.store(0, Ordering::Relaxed);
        let w = ch
            .word(word)
            .ok_or_else(|| Malformed("chunk index out of range".into()))?;
        // SAFETY: the word lies in the registered part of the segment, which stays mapped and
        // registered while this client's Arc is held by the marker below.
        let r = unsafe { ctx.gpu.write_u32(w.as_ptr(), seq, s) };
        match r {
            Ok(()) => {
                ctx.add_marker(self.client.clone(), channel, word, seq, s);
                Ok(true)
            }
            Err(e) => {
                ctx.fault_if_sticky(e.0);
                self.note_error(e);
                self.signal_now(channel, word, seq, e.0).map(|_| false)
            }
        }
    }

    /// Sets a completion word from the CPU, with `result` for the client to see.
    pub(super) fn signal_now(
        &self,
        channel: u32,
        word: Word,
        seq: u32,
        result: i32,
    ) -> Result<(), Malformed> {
        let ch = self.channel(channel)?;
        if result != 0 {
            ch.result.store(result, Ordering::Relaxed);
        }
        let w = ch
            .word(word)
            .ok_or_else(|| Malformed("chunk index out of range".into()))?;
        // SYNC POINT: pairs with the client's Acquire load of the word.
        w.store(seq, Ordering::Release);
        wake_if_waiting(ch, w);
        Ok(())
    }

    /// Decodes, validates and runs one record.
    pub fn handle(&mut self, ctx: &mut WorkerCtx, tag: u32, p: &[u8]) -> Result<(), Malformed> {
        let Some(op) = Op::from_tag(tag) else {
            return bad(format!("unknown op {tag}"));
        };
        if p.len() < op.fixed_len() {
            return bad(format!(
                "{op:?}: {} bytes, needs {}",
                p.len(),
                op.fixed_len()
            ));
        }
        let tail = &p[op.fixed_len()..];
        self.client.commands.fetch_add(1, Ordering::Relaxed);
        if !self.marked_used {
            self.marked_used = true;
            self.client
                .used_gpus
                .fetch_or(1 << self.dev, Ordering::Relaxed);
        }
        if (self.capturing > 0 || !self.captured_events.is_empty())
            && self.capture_guard(ctx, op, p)?.is_some()
        {
            return Ok(());
        }
        match op {
            Op::Launch | Op::Query | Op::TensorMap => self.handle_exec(ctx, op, p, tail)?,
            Op::Memset
            | Op::CopyDtoD
            | Op::CopyPeer
            | Op::CopyHtoDChunk
            | Op::CopyDtoHChunk
            | Op::CopyHtoDInline
            | Op::CopyHtoDPinned
            | Op::CopyDtoHPinned
            | Op::MemFree
            | Op::MemAlloc
            | Op::PeerAccess
            | Op::MemGetInfo => self.handle_memory(ctx, op, p, tail)?,
            Op::BlobAppend
            | Op::ModuleUnload
            | Op::ModuleLoad
            | Op::ModuleGetGlobal
            | Op::FuncGetAttribute
            | Op::FuncSetAttribute => self.handle_modules(ctx, op, p, tail)?,
            Op::StreamCreate
            | Op::StreamDestroy
            | Op::EventCreate
            | Op::EventDestroy
            | Op::EventRecord
            | Op::StreamWaitEvent
            | Op::EventRecordExternal
            | Op::StreamWaitEventExternal
            | Op::HostNode
            | Op::HostNodeAt
            | Op::StreamSync
            | Op::StreamQuery
            | Op::EventSync
            | Op::EventQuery
            | Op::EventElapsed
            | Op::CtxSync
            | Op::HostFunc
            | Op::Ping => self.handle_sync(ctx, op, p, tail)?,
            Op::Link => self.handle_link(ctx, rec::<wire::ModuleLoad>(p))?,
            Op::ModuleLoadJit => {
                fixed_only(tail, "jit load")?;
                self.handle_jit_load(ctx, rec::<wire::ModuleLoad>(p))?;
            }
            Op::BlobFetch => {
                fixed_only(tail, "blob fetch")?;
                self.handle_blob_fetch(rec::<wire::ChunkCopy>(p))?;
            }
            Op::Array | Op::ArrayCopy | Op::TexObject => self.handle_arrays(ctx, op, p, tail)?,
            Op::Vmm => {
                fixed_only(tail, "vmm")?;
                self.handle_vmm(ctx, rec::<wire::Vmm>(p))?;
            }
            Op::CaptureBegin
            | Op::CaptureEnd
            | Op::CaptureStatus
            | Op::GraphInstantiate
            | Op::GraphLaunch
            | Op::GraphUpload
            | Op::GraphDestroy
            | Op::GraphExecDestroy
            | Op::GraphQuery => self.handle_graphs(ctx, op, p, tail)?,
            Op::GraphCond => {
                fixed_only(tail, "conditional graph op")?;
                self.handle_graph_cond(ctx, &rec::<wire::GraphCond>(p))?;
            }
            Op::IpcGetMemHandle
            | Op::IpcOpenMemHandle
            | Op::IpcCloseMemHandle
            | Op::IpcGetEventHandle
            | Op::IpcOpenEventHandle => self.handle_ipc(ctx, op, p, tail)?,
            Op::Green => {
                fixed_only(tail, "green context call")?;
                self.handle_green(ctx, rec::<wire::GreenCall>(p))?;
            }
        }
        Ok(())
    }

    /// The staging chunk a ChunkCopy names, bounds-checked.
    pub(super) fn chunk(&self, c: &wire::ChunkCopy) -> Result<(*mut u8, usize), Malformed> {
        if c.chunk as usize >= CHUNKS_PER_CHANNEL {
            return bad("chunk index out of range");
        }
        let (ptr, cap) = self
            .client
            .seg
            .chunk(c.channel as usize, c.chunk as usize)
            .ok_or_else(|| Malformed(format!("channel {} out of range", c.channel)))?;
        if c.len as usize > cap {
            return bad("chunk length larger than a chunk");
        }
        Ok((ptr, cap))
    }

    /// The work streams this client's streams are bound to, one entry per binding.
    pub fn bound_work_streams(&self) -> Vec<usize> {
        self.streams
            .values()
            .chain(&self.parked)
            .filter_map(|s| s.pool)
            .collect()
    }

    /// Everything the client still holds on this GPU, for release once its work is done.
    pub fn into_release(
        mut self,
        shared: &crate::worker::GpuShared,
    ) -> (Arc<ClientShared>, Release) {
        let cache = &shared.modules;
        // Images uploaded and never loaded leave the server-wide total.
        let uploaded: usize = self.blobs.iter().map(Vec::len).sum();
        self.client.account.totals.give_image(uploaded as u64);
        // What it exported goes through the IPC books; what it opened is closed, and an
        // allocation whose owner left before is freed with it (counted as this client's
        // until then, since the releaser takes it off the count).
        // Blocks held for its graphs go as its other allocations do (exported ones through
        // the IPC books).
        for (p, n) in self.take_graph_held() {
            self.allocs.insert(p, n);
        }
        // Modules and IPC openings held for its graphs go with the rest.
        let HeldAtLast {
            modules: held_modules,
            closes: held_closes,
            reservations: held_reservations,
            pinned: held_pinned,
            arrays: held_arrays,
            mipmaps: held_mipmaps,
        } = self.take_graph_held_other();
        let (ipc, mut allocs) = {
            let mut reg = shared.ipc.lock().unwrap_or_else(|e| e.into_inner());
            let (ipc, own): (Vec<Range>, Vec<Range>) = std::mem::take(&mut self.allocs)
                .into_iter()
                .partition(|&(p, _)| reg.exported(p, self.client.id));
            // Shared events go with their last user.
            let events: Vec<u64> = self.events.drain().map(|(_, e)| e).collect();
            self.events_to_destroy = events
                .into_iter()
                .filter(|&e| reg.release_event(e))
                .collect();
            self.vmm.pools.release_all(&mut reg);
            (ipc, own)
        };
        allocs.sort_unstable();
        // Pinned host memory stays with the client and goes when its last Arc does.
        // What it opened is closed once its own work is done (crate::worker's free).
        let ipc_close = std::mem::take(&mut self.imported)
            .into_iter()
            .flat_map(|(p, (_, n))| std::iter::repeat_n(p, n as usize))
            .chain(held_closes)
            .collect();
        let module_bytes = self.modules.values().map(|m| m.data_bytes).sum::<u64>()
            + held_modules.iter().map(|m| m.2).sum::<u64>();
        let rel = Release {
            // Pinned ranges it gave back that its graphs held: unregistered with the rest.
            pinned: held_pinned,
            limits: None,
            cross: Default::default(),
            module_bytes,
            limit_bytes: self.limit_charges.values().sum(),
            allocs,
            ipc,
            ipc_close,
            modules: self
                .modules
                .drain()
                .map(|(_, m)| (m.handle, m.shared))
                .chain(held_modules.iter().map(|m| (m.0, m.1)))
                .flat_map(|(handle, shared)| match shared {
                    true => cache.release(handle).unwrap_or_default(),
                    false => vec![handle],
                })
                .collect(),
            events: std::mem::take(&mut self.events_to_destroy)
                .into_iter()
                .chain(std::mem::take(&mut self.left))
                .chain(self.take_depth_events())
                .collect(),
            graphs: self.graphs.drain().map(|(_, g)| g).collect(),
            execs: self.execs.drain().map(|(_, e)| e).collect(),
            vmm: {
                let mut v = std::mem::take(&mut self.vmm);
                let mut reg = shared.vmm_ipc.lock().unwrap_or_else(|e| e.into_inner());
                v.keep_shared(&mut reg, &self.client, self.dev);
                let mut r = v.into_release();
                r.reservations.extend(held_reservations);
                // And those other GPUs' graphs held that none does any more.
                r.reservations.extend(self.take_reach_held());
                r
            },
            arrays: {
                // Arrays its graphs held go with the rest.
                let mut a = std::mem::take(&mut self.arrays).into_release();
                a.arrays.extend(held_arrays);
                a.mipmaps.extend(held_mipmaps);
                a
            },
        };
        (self.client, rel)
    }

    /// The stream its synchronizations and fences wait on: a work stream of its own,
    /// bound at the first. Event and context synchronizations make it wait for the client's
    /// work, then write the done word; a shared marker stream would make one client's
    /// synchronization wait behind another's long kernel (the stream runs its waits in
    /// order), so each client has its own, placed like its work streams.
    /// It takes no part in the client's share of the queues: it holds only waits for the
    /// client's own work. None only if every stream of its class were held for captures,
    /// which captures never do (placement::may_capture).
    pub fn sync_stream(&mut self, ctx: &mut WorkerCtx) -> Option<usize> {
        if self.sync.is_none() {
            self.sync = ctx.bind_work_stream(self.client.id, self.placement, 0, false);
        }
        self.sync
    }

    /// The client is gone: acknowledges every host function it queued, so its streams (and
    /// the fence after them) do not wait for a function that will never run.
    /// The host-node slots its graphs hold (for acknowledging them once it is dead).
    pub fn take_host_nodes(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.host_nodes).into_iter().collect()
    }

    /// The `ack` words in pinned memory its graphs' host nodes wait on (as above).
    pub fn take_host_words(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.host_words).into_iter().collect()
    }

    pub fn release_host_functions(&mut self) {
        for (&slot, &seq) in &self.hostfn_last {
            if let Some(w) = self.client.seg.hostfn(slot as usize) {
                w.ack.store(seq, Ordering::Release);
            }
        }
    }

    /// The work streams a fence or a context synchronization of this client waits for:
    /// those it holds now, but none being captured (waiting on one would pull the sync
    /// stream into the client's graph). Work of streams it gave up is covered by `left`.
    pub fn fence_streams(&self) -> crate::sched::placement::StreamSet {
        let mut set = crate::sched::placement::StreamSet::default();
        for st in self.streams.values().filter(|s| !s.capturing) {
            if let Some(p) = st.pool {
                set.insert(p);
            }
        }
        set
    }

    /// Events marking the last work of streams the client gave up, still unfinished: a
    /// fence waits for them without touching the streams, which may be someone else's now.
    pub fn left_events(&mut self, ctx: &WorkerCtx) -> Vec<u64> {
        self.left.retain(|&e| {
            let done = ctx.gpu.event_query(e).unwrap_or(true);
            if done {
                let _ = ctx.gpu.event_destroy(e);
            }
            !done
        });
        self.left.clone()
    }

    /// Gives up work stream `pool` of a client stream, remembering its last work.
    pub(crate) fn leave_pool(&mut self, ctx: &mut WorkerCtx, pool: usize) {
        match ctx.gpu.event_create(0x2) {
            Ok(ev) if ctx.gpu.event_record(ev, pool).is_ok() => {
                // An operation of the stream it leaves (session/depth.rs).
                self.queued_as(ctx, pool, 1, false);
                self.left.push(ev)
            }
            Ok(ev) => {
                let _ = ctx.gpu.event_destroy(ev);
            }
            Err(_) => {}
        }
        ctx.unbind_work_stream(pool);
        if self.left.len() > MAX_LEFT {
            self.fold_left(ctx);
        }
    }

    /// Streams given up behind work that does not end (a client creating and destroying
    /// streams in a loop) would each leave a driver event, scanned at every fence: past
    /// [`MAX_LEFT`] unfinished ones, the client's sync stream waits for them all and one
    /// event recorded there stands for them. The sync stream carries only waits that
    /// cover that work anyway (fences, context synchronizations).
    pub(super) fn fold_left(&mut self, ctx: &mut WorkerCtx) {
        self.left_events(ctx);
        if self.left.len() <= MAX_LEFT / 2 {
            return;
        }
        let Some(m) = self.sync_stream(ctx) else {
            return;
        };
        let gpu = ctx.gpu.clone();
        let Ok(one) = gpu.event_create(0x2) else {
            return;
        };
        // The waits and the record are operations of the sync stream: counted, so that a
        // client giving up stream after stream behind work that does not end is held
        // back (session/depth.rs) before the sync stream reaches the driver's bound and
        // the worker would wait in the driver for every client of the lane.
        self.queued_as(ctx, m, self.left.len() as u32 + 1, false);
        let joined = self
            .left
            .iter()
            .try_for_each(|&e| gpu.stream_wait_event(m, e))
            .and_then(|()| gpu.event_record(one, m));
        if joined.is_err() {
            let _ = gpu.event_destroy(one);
            return;
        }
        for e in std::mem::replace(&mut self.left, vec![one]) {
            // The wait is queued: the event may go.
            let _ = gpu.event_destroy(e);
        }
    }

    pub fn dev(&self) -> usize {
        self.dev
    }
}
