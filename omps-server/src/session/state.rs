//! A client's [`Session`] on one GPU: what it holds there and the checks every family of
//! its commands shares. The per-family parts of its state are in kinds/, below it; the
//! families (impl Session blocks, dispatch.rs among them) are above it.
//!
//! Everything read from the ring is hostile: records are copied out of shared memory
//! before they are looked at (the ring does that), sizes are checked against the op, and
//! every handle is looked up in this client's own tables. A record that cannot have come
//! from an honest shim is [`Malformed`] and gets the client disconnected; an honest mistake
//! (a copy out of bounds, a failed allocation) becomes a CUDA error for the client.
//!
//! [`Session::handle`] (dispatch.rs) checks a record's length and dispatches it to its
//! family: `exec` (launches, function queries, TMA descriptors), `memory`, `modules`,
//! `sync` (streams, events, synchronizing calls), `vmm` and `link`, each in its own file
//! under `session/`.

use super::kinds::arrays::ArrayState;
use super::kinds::compile::Pending;
use super::kinds::cond::CondState;
use super::kinds::depth::Depth;
use super::kinds::graph_held::HeldForGraphs;
use super::kinds::green::GreenCtx;
use super::kinds::launch_run::PendingRun;
use super::kinds::quick_free::QuickFree;
use super::kinds::vmm::VmmState;
pub(super) use super::record::{bad, fixed_only, rec, Malformed, Range};
pub(super) use crate::client::answer::wake_if_waiting;
pub(super) use crate::client::ClientShared;
pub(super) use crate::gpu::{code, CuError};
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
    /// Profiling twins of its executable graphs, and the graphs kept for them.
    pub(super) profiles: super::profiles::GraphProfiles,
    /// The GPU's own times of its work while its profiler traces (session/timer.rs).
    pub(super) timer: super::kinds::span_timer::SessionTimer,
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
    /// Blocks it freed with nothing on the GPU, kept for its next allocation (memory.rs).
    pub(super) quick: QuickFree,
    /// Launches gathered to go to the GPU as one run (exec.rs).
    pub(super) run: PendingRun,
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
            profiles: Default::default(),
            timer: Default::default(),
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
            quick: Default::default(),
            run: Default::default(),
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

    pub fn dev(&self) -> usize {
        self.dev
    }
}
