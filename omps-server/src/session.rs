//! One client's state on one GPU, and the decoding, validation and execution of its
//! commands.
//!
//! Everything read from the ring is hostile: records are copied out of shared memory
//! before they are looked at (the ring does that), sizes are checked against the op, and
//! every handle is looked up in this client's own tables. A record that cannot have come
//! from an honest shim is [`Malformed`] and gets the client disconnected; an honest mistake
//! (a copy out of bounds, a failed allocation) becomes a CUDA error for the client.

use crate::client::ClientShared;
use crate::gpu::{code, CuError};
use crate::worker::WorkerCtx;
use omps_ring::futex;
use omps_ring::ring::Consumer;
use omps_ring::segment::{Channel, Word, CHUNKS_PER_CHANNEL};
use omps_ring::wire::{self, CallHdr, Op};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod link;
mod vmm;
pub use vmm::VmmRelease;

/// Why a client is cut off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

fn bad<T>(why: impl Into<String>) -> Result<T, Malformed> {
    Err(Malformed(why.into()))
}

/// Upper bound on one module image, so a client can't make the server buffer without end.
pub const MAX_BLOB: usize = 1 << 30;

struct Function {
    handle: u64,
    args_size: usize,
    module: u32,
}

/// A client stream: the pool stream it runs on (bound at its first work, so that idle
/// streams hold none), and what CUDA's legacy default stream semantics need. Work on the legacy stream (id 0) waits for earlier work of the
/// client's blocking streams, and theirs for earlier legacy work; non-blocking streams
/// never wait. Only transitions cost anything: an event record and a wait.
struct ClientStream {
    pool: Option<usize>,
    priority: i32,
    blocking: bool,
    /// Has queued work that later legacy-stream work must wait for.
    dirty: bool,
    /// Must wait for the legacy stream's work before its next work.
    stale: bool,
    /// Pieces of work queued on it so far.
    submits: u64,
    /// Its last synchronization that went to the GPU.
    synced: Option<SyncMark>,
}

impl ClientStream {
    fn new(priority: i32, blocking: bool) -> Self {
        ClientStream {
            pool: None,
            priority,
            blocking,
            dirty: false,
            stale: false,
            submits: 0,
            synced: None,
        }
    }
}

/// A completion the GPU signals in stream order by storing `seq` into a word of channel
/// `channel` (a synchronization's done word, or a staging chunk's after its copy), and
/// how many submissions had been queued when it was.
#[derive(Clone, Copy)]
struct SyncMark {
    channel: u32,
    word: Word,
    seq: u32,
    submits: u64,
}

impl SyncMark {
    /// The done word of `call`, after `submits` submissions.
    fn done(call: CallHdr, submits: u64) -> Self {
        SyncMark {
            channel: call.channel,
            word: Word::Done,
            seq: call.seq,
            submits,
        }
    }
}

struct Module {
    handle: u64,
    functions: Vec<u32>,
}

/// Resources a client gave back or left behind, freed once the GPU is done with them.
#[derive(Default)]
pub struct Release {
    pub allocs: Vec<(u64, u64)>,
    /// Pinned host ranges (already out of the client's table).
    pub pinned: Vec<(u64, u64)>,
    pub modules: Vec<u64>,
    pub events: Vec<u64>,
    pub vmm: VmmRelease,
}

impl Release {
    /// Whether this is one device allocation of `size` bytes and nothing else.
    pub fn is_one_alloc_of(&self, size: u64) -> bool {
        matches!(self.allocs[..], [(_, len)] if len == size)
            && self.pinned.is_empty()
            && self.modules.is_empty()
            && self.events.is_empty()
            && self.vmm.unmap.is_empty()
            && self.vmm.handles.is_empty()
            && self.vmm.reservations.is_empty()
    }
}

pub struct Session {
    pub client: Arc<ClientShared>,
    consumer: Consumer,
    dev: usize,
    streams: HashMap<u32, ClientStream>,
    events: HashMap<u32, u64>,
    modules: HashMap<u32, Module>,
    functions: HashMap<u32, Function>,
    /// Device ranges this client may copy to and from: its allocations and module globals.
    allocs: BTreeMap<u64, u64>,
    globals: BTreeMap<u64, u64>,
    blobs: Vec<Vec<u8>>,
    /// Per channel: the last JIT link's image and logs, until the next link.
    link_out: Vec<Vec<u8>>,
    /// Bit i set when work stream i has carried this client's work.
    pub used_streams: u128,
    pub marker_stream: usize,
    /// First asynchronous error since the last synchronizing call.
    pending_error: i32,
    next_id: u32,
    /// Pieces of work queued on all of its streams so far.
    submits: u64,
    /// Its last context synchronization that went to the GPU.
    ctx_synced: Option<SyncMark>,
    /// Context limits it set (crate::limits).
    limits: HashMap<i32, u64>,
    vmm: vmm::VmmState,
}

impl Session {
    /// # Safety
    /// The client's segment holds ring `dev` and stays mapped while the session lives (the
    /// session holds an Arc of the client, which owns the mapping).
    pub unsafe fn new(client: Arc<ClientShared>, dev: usize, ctx: &mut WorkerCtx) -> Self {
        let (hdr, data, cap) = client.seg.ring_parts(dev);
        // SAFETY: the caller's promise; the server is this ring's only consumer.
        let consumer = unsafe { Consumer::new(hdr, data, cap) };
        let channels = client.seg.layout.params.num_channels as usize;
        let mut s = Session {
            client,
            consumer,
            dev,
            streams: HashMap::new(),
            events: HashMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            allocs: BTreeMap::new(),
            globals: BTreeMap::new(),
            blobs: vec![Vec::new(); channels],
            link_out: vec![Vec::new(); channels],
            used_streams: 0,
            marker_stream: ctx.pick_marker_stream(),
            pending_error: 0,
            next_id: 1,
            submits: 0,
            ctx_synced: None,
            limits: HashMap::new(),
            vmm: Default::default(),
        };
        s.streams
            .insert(wire::STREAM_DEFAULT, ClientStream::new(0, false));
        s
    }

    pub fn has_data(&mut self) -> bool {
        self.consumer.has_data()
    }

    /// Takes the next record out of the ring: Ok(None) when empty.
    pub fn pop(&mut self, buf: &mut Vec<u8>) -> Result<Option<u32>, Malformed> {
        self.consumer
            .pop_into(buf)
            .map_err(|c| Malformed(format!("corrupt ring: {}", c.reason)))
    }

    /// The pool stream of client stream `id`, for questions about it (queries and
    /// synchronizing), which take no part in the legacy stream's ordering; None while
    /// nothing was ever queued on it.
    fn stream_pool(&self, id: u32) -> Result<Option<usize>, Malformed> {
        self.streams
            .get(&id)
            .map(|s| s.pool)
            .ok_or_else(|| Malformed(format!("unknown stream {id}")))
    }

    /// The pool stream for work on client stream `id`, after the implicit ordering of
    /// the legacy default stream has been queued.
    fn stream(&mut self, ctx: &mut WorkerCtx, id: u32) -> Result<usize, Malformed> {
        let Some(st) = self.streams.get_mut(&id) else {
            return bad(format!("unknown stream {id}"));
        };
        st.submits += 1;
        self.submits += 1;
        let pool = match st.pool {
            Some(p) => p,
            None => *st
                .pool
                .insert(ctx.bind_work_stream(self.client.id, st.priority)),
        };
        self.used_streams |= 1 << pool;
        // Work on a blocking stream is ordered after legacy work only once there is some,
        // and then the legacy stream is bound.
        let legacy = self.streams[&wire::STREAM_DEFAULT].pool.unwrap_or(pool);
        let mut r = Ok(());
        if id == wire::STREAM_DEFAULT {
            for b in self.streams.values_mut().filter(|b| b.blocking) {
                match b.pool {
                    Some(bp) if b.dirty && bp != legacy => r = r.and(ctx.order(bp, legacy)),
                    _ => {}
                }
                b.dirty = false;
                b.stale = true;
            }
        } else if let Some(b) = self.streams.get_mut(&id).filter(|b| b.blocking) {
            if b.stale && pool != legacy {
                r = ctx.order(legacy, pool);
            }
            b.stale = false;
            b.dirty = true;
        }
        if let Err(e) = r {
            self.note_error(e);
        }
        Ok(pool)
    }

    fn event(&self, id: u32) -> Result<u64, Malformed> {
        self.events
            .get(&id)
            .copied()
            .ok_or_else(|| Malformed(format!("unknown event {id}")))
    }

    fn channel(&self, c: u32) -> Result<&Channel, Malformed> {
        self.client
            .seg
            .channel(c as usize)
            .ok_or_else(|| Malformed(format!("channel {c} out of range")))
    }

    /// Whether a synchronization can complete at once, without the GPU: nothing was
    /// queued since `mark`, which the GPU has signalled, and there is no error to report.
    /// (A client that fakes its own done word only cuts its own waits short.)
    fn already_synced(&self, ctx: &WorkerCtx, mark: Option<SyncMark>, submits: u64) -> bool {
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

    fn note_error(&mut self, e: CuError) {
        tracing::debug!(client = self.client.id, "asynchronous error {}", e.0);
        if self.pending_error == 0 {
            self.pending_error = e.0;
        }
    }

    fn take_pending(&mut self) -> i32 {
        std::mem::take(&mut self.pending_error)
    }

    /// Whether `[addr, addr+len)` lies inside one allocation or global of this client.
    fn owns_range(&self, addr: u64, len: u64) -> bool {
        let inside = |m: &BTreeMap<u64, u64>| {
            m.range(..=addr)
                .next_back()
                .is_some_and(|(&s, &n)| addr.checked_add(len).is_some_and(|end| end <= s + n))
        };
        inside(&self.allocs) || inside(&self.globals) || self.vmm.mapped(addr, len)
    }

    fn check_range(&mut self, addr: u64, len: u64) -> bool {
        let ok = self.owns_range(addr, len);
        if !ok {
            self.note_error(CuError(code::INVALID_VALUE));
        }
        ok
    }

    /// Answers a call from the CPU: reply bytes, then result, then `done` (Release).
    fn complete(&self, call: CallHdr, result: i32, reply: &[u8]) -> Result<(), Malformed> {
        let ch = self.channel(call.channel)?;
        ch.write_reply(reply);
        ch.reply_len.store(reply.len() as u32, Ordering::Relaxed);
        ch.result.store(result, Ordering::Relaxed);
        // SYNC POINT: pairs with the client's Acquire load of `done`.
        ch.done.store(call.seq, Ordering::Release);
        wake_if_waiting(ch, &ch.done);
        Ok(())
    }

    fn complete_pod<T: bytemuck::Pod>(
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
    fn complete_on_gpu(
        &mut self,
        ctx: &mut WorkerCtx,
        call: CallHdr,
        s: usize,
    ) -> Result<bool, Malformed> {
        let pending = self.take_pending();
        if pending != 0 {
            return self.complete(call, pending, &[]).map(|_| false);
        }
        self.signal_on_gpu(ctx, call.channel, Word::Done, call.seq, s)
    }

    /// Has the GPU store `seq` into a completion word in stream order. Ok(true) when it
    /// will; Ok(false) when the word was set at once with the error that prevented it.
    fn signal_on_gpu(
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
                if crate::gpu::is_sticky(e.0) {
                    ctx.enter_fault(e.0);
                }
                self.note_error(e);
                self.signal_now(channel, word, seq, e.0).map(|_| false)
            }
        }
    }

    /// Sets a completion word from the CPU, with `result` for the client to see.
    fn signal_now(&self, channel: u32, word: Word, seq: u32, result: i32) -> Result<(), Malformed> {
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
        let fixed_only = |name: &str| -> Result<(), Malformed> {
            if tail.is_empty() {
                Ok(())
            } else {
                bad(format!("{name}: trailing bytes"))
            }
        };
        macro_rules! rec {
            ($t:ty) => {
                wire::get::<$t>(p).expect("length checked above")
            };
        }
        self.client.commands.fetch_add(1, Ordering::Relaxed);
        let gpu = ctx.gpu.clone();
        match op {
            Op::Launch => {
                let l = rec!(wire::Launch);
                if l.num_attrs > wire::MAX_LAUNCH_ATTRS {
                    return bad("launch: too many attributes");
                }
                let attr_len = l.num_attrs as usize * wire::LAUNCH_ATTR_BYTES;
                if tail.len() != attr_len + l.args_len as usize {
                    return bad("launch: record length disagrees with attributes and args_len");
                }
                let (attrs, tail) = tail.split_at(attr_len);
                for a in attrs.chunks_exact(wire::LAUNCH_ATTR_BYTES) {
                    let id = u32::from_le_bytes(a[..4].try_into().expect("4 bytes"));
                    if !wire::launch_attr_forwardable(id) {
                        return bad(format!("launch: attribute {id} carries handles"));
                    }
                }
                let f = self
                    .functions
                    .get(&l.func)
                    .ok_or_else(|| Malformed(format!("unknown function {}", l.func)))?;
                if f.args_size != tail.len() {
                    return bad(format!(
                        "launch: {} argument bytes, function takes {}",
                        tail.len(),
                        f.args_size
                    ));
                }
                let h = f.handle;
                let s = self.stream(ctx, l.stream)?;
                if let Err(e) = gpu.launch(h, l.grid, l.block, l.shared_mem, s, attrs, tail) {
                    self.note_error(e);
                }
            }
            Op::Memset => {
                fixed_only("memset")?;
                let m = rec!(wire::Memset);
                if !matches!(m.elem_size, 1 | 2 | 4) {
                    return bad("memset: element size");
                }
                let s = self.stream(ctx, m.stream)?;
                let Some(bytes) = m.count.checked_mul(m.elem_size as u64) else {
                    return bad("memset: size overflows");
                };
                if self.check_range(m.dst, bytes) {
                    if let Err(e) = gpu.memset(m.dst, m.value, m.elem_size, m.count as usize, s) {
                        self.note_error(e);
                    }
                }
            }
            Op::CopyDtoD => {
                fixed_only("copy")?;
                let c = rec!(wire::CopyDtoD);
                let s = self.stream(ctx, c.stream)?;
                if self.check_range(c.dst, c.len) && self.check_range(c.src, c.len) {
                    if let Err(e) = gpu.copy_dtod(c.dst, c.src, c.len as usize, s) {
                        self.note_error(e);
                    }
                }
            }
            Op::CopyHtoDChunk | Op::CopyDtoHChunk => {
                fixed_only("chunk copy")?;
                let c = rec!(wire::ChunkCopy);
                let (ptr, cap) = self.chunk(&c)?;
                let s = self.stream(ctx, c.stream)?;
                let word = Word::Chunk(c.chunk as u8);
                if !self.check_range(c.dev, c.len as u64) {
                    return self.signal_now(c.channel, word, c.seq, code::INVALID_VALUE);
                }
                debug_assert!(c.len as usize <= cap);
                // SAFETY: ptr..ptr+len is inside this client's registered staging chunk
                // (checked by chunk()); the marker keeps it registered until the copy is done.
                let r = unsafe {
                    if op == Op::CopyHtoDChunk {
                        gpu.copy_htod(c.dev, ptr, c.len as usize, s)
                    } else {
                        gpu.copy_dtoh(ptr, c.dev, c.len as usize, s)
                    }
                };
                match r {
                    Ok(()) => {
                        // The chunk's word lands after everything queued on the stream so
                        // far: a synchronization that follows the client's wait for it (a
                        // pageable device-to-host copy) need not ask the GPU again.
                        if self.signal_on_gpu(ctx, c.channel, word, c.seq, s)? {
                            let st = self.streams.get_mut(&c.stream).expect("stream() found it");
                            st.synced = Some(SyncMark {
                                channel: c.channel,
                                word,
                                seq: c.seq,
                                submits: st.submits,
                            });
                        }
                    }
                    Err(e) => {
                        self.note_error(e);
                        self.signal_now(c.channel, word, c.seq, e.0)?
                    }
                }
            }
            Op::CopyHtoDInline => {
                let c = rec!(wire::InlineCopy);
                if c.len as usize != tail.len()
                    || tail.len() > wire::INLINE_COPY_MAX
                    || !c.len.is_multiple_of(4)
                    || !c.dev.is_multiple_of(4)
                {
                    return bad("inline copy: length or alignment");
                }
                let s = self.stream(ctx, c.stream)?;
                if self.check_range(c.dev, c.len as u64) {
                    for (i, w) in tail.chunks_exact(4).enumerate() {
                        let v = u32::from_le_bytes(w.try_into().expect("4 bytes"));
                        if let Err(e) = gpu.write_device_u32(c.dev + 4 * i as u64, v, s) {
                            self.note_error(e);
                            break;
                        }
                    }
                }
            }
            Op::CopyHtoDPinned | Op::CopyDtoHPinned => {
                fixed_only("pinned copy")?;
                let c = rec!(wire::PinnedCopy);
                let s = self.stream(ctx, c.stream)?;
                if !self.client.pinned_contains(c.host, c.len) || !self.check_range(c.dev, c.len) {
                    self.note_error(CuError(code::INVALID_VALUE));
                    return Ok(());
                }
                // SAFETY: the host range is pinned memory of this client, mapped and
                // registered here until a fence after this copy has passed (unpin defers).
                let r = unsafe {
                    if op == Op::CopyHtoDPinned {
                        gpu.copy_htod(c.dev, c.host as *const u8, c.len as usize, s)
                    } else {
                        gpu.copy_dtoh(c.host as *mut u8, c.dev, c.len as usize, s)
                    }
                };
                if let Err(e) = r {
                    self.note_error(e);
                }
            }
            Op::BlobAppend => {
                fixed_only("blob append")?;
                let c = rec!(wire::ChunkCopy);
                let (ptr, _) = self.chunk(&c)?;
                let blob = &mut self.blobs[c.channel as usize];
                if blob.len() + c.len as usize > MAX_BLOB {
                    return bad("module image larger than 1 GiB");
                }
                // SAFETY: chunk() checked the range lies inside the segment; the client may
                // scribble on it concurrently, which only corrupts its own image.
                blob.extend_from_slice(unsafe { std::slice::from_raw_parts(ptr, c.len as usize) });
                self.signal_now(c.channel, Word::Chunk(c.chunk as u8), c.seq, 0)?;
            }
            Op::StreamCreate => {
                let c = rec!(wire::StreamCreate);
                if c.id == wire::STREAM_DEFAULT || self.streams.contains_key(&c.id) {
                    return bad(format!("stream id {} reused", c.id));
                }
                const NON_BLOCKING: u32 = 1;
                self.streams.insert(
                    c.id,
                    ClientStream::new(c.priority, c.flags & NON_BLOCKING == 0),
                );
            }
            Op::StreamDestroy => {
                let h = rec!(wire::Handle);
                if h.id == wire::STREAM_DEFAULT {
                    return bad("destroying the default stream");
                }
                match self.streams.remove(&h.id) {
                    // Its queued work still runs; the pool stream is handed to another
                    // client only once it is idle (WorkerCtx::bind_work_stream).
                    Some(st) => st.pool.into_iter().for_each(|p| ctx.unbind_work_stream(p)),
                    None => return bad(format!("destroying unknown stream {}", h.id)),
                }
            }
            Op::EventCreate => {
                let c = rec!(wire::EventCreate);
                if self.events.contains_key(&c.id) {
                    return bad(format!("event id {} reused", c.id));
                }
                match gpu.event_create(c.flags) {
                    Ok(e) => {
                        self.events.insert(c.id, e);
                    }
                    Err(e) => self.note_error(e),
                }
            }
            Op::EventDestroy => {
                let h = rec!(wire::Handle);
                let e = self
                    .events
                    .remove(&h.id)
                    .ok_or_else(|| Malformed(format!("destroying unknown event {}", h.id)))?;
                // The driver defers the release of a recorded event until it completes.
                let _ = gpu.event_destroy(e);
            }
            Op::EventRecord => {
                let r = rec!(wire::EventRecord);
                let (e, s) = (self.event(r.event)?, self.stream(ctx, r.stream)?);
                if let Err(err) = gpu.event_record(e, s) {
                    self.note_error(err);
                }
            }
            Op::StreamWaitEvent => {
                let r = rec!(wire::EventRecord);
                let (e, s) = (self.event(r.event)?, self.stream(ctx, r.stream)?);
                if let Err(err) = gpu.stream_wait_event(s, e) {
                    self.note_error(err);
                }
            }
            Op::MemFree => {
                let f = rec!(wire::MemFree);
                match self.allocs.remove(&f.ptr) {
                    Some(len) => ctx.release_later(
                        self,
                        Release {
                            allocs: vec![(f.ptr, len)],
                            ..Default::default()
                        },
                    ),
                    None => self.note_error(CuError(code::INVALID_VALUE)),
                }
            }
            Op::ModuleUnload => {
                let h = rec!(wire::Handle);
                let m = self
                    .modules
                    .remove(&h.id)
                    .ok_or_else(|| Malformed(format!("unloading unknown module {}", h.id)))?;
                for f in &m.functions {
                    self.functions.remove(f);
                }
                ctx.release_later(
                    self,
                    Release {
                        modules: vec![m.handle],
                        ..Default::default()
                    },
                );
            }
            Op::MemAlloc => {
                let a = rec!(wire::MemAlloc);
                let r = if a.size == 0 {
                    Err(CuError(code::INVALID_VALUE))
                } else if let Some(p) = ctx.reuse_freed(&self.client, a.size) {
                    Ok(p)
                } else {
                    gpu.mem_alloc(a.size)
                };
                if let Ok(p) = r {
                    self.allocs.insert(p, a.size);
                    self.client.mem_bytes[self.dev].fetch_add(a.size, Ordering::Relaxed);
                }
                self.complete_pod(a.call, r.map(|value| wire::U64Reply { value }))?;
            }
            Op::MemGetInfo => {
                let c = rec!(CallHdr);
                let r = gpu
                    .mem_info()
                    .map(|(free, total)| wire::MemInfoReply { free, total });
                self.complete_pod(c, r)?;
            }
            Op::ModuleLoad => {
                let m = rec!(wire::ModuleLoad);
                self.channel(m.call.channel)?;
                let blob = std::mem::take(&mut self.blobs[m.call.channel as usize]);
                if blob.len() as u64 != m.blob_len {
                    return self.complete(m.call, code::INVALID_IMAGE, &[]);
                }
                match gpu.module_load(&blob) {
                    Ok(loaded) => self.finish_module_load(ctx, m.call, loaded)?,
                    Err(e) => self.complete(m.call, e.0, &[])?,
                }
            }
            Op::ModuleGetGlobal => {
                let g = rec!(wire::ModuleGetGlobal);
                if tail.len() != g.name_len as usize {
                    return bad("global name length");
                }
                let m = self
                    .modules
                    .get(&g.module)
                    .ok_or_else(|| Malformed(format!("unknown module {}", g.module)))?;
                let r = match std::str::from_utf8(tail) {
                    Ok(name) => gpu.module_global(m.handle, name),
                    Err(_) => Err(CuError(code::NOT_FOUND)),
                };
                if let Ok((p, n)) = r {
                    self.globals.insert(p, n);
                }
                self.complete_pod(g.call, r.map(|(ptr, size)| wire::GlobalReply { ptr, size }))?;
            }
            Op::FuncGetAttribute => {
                let a = rec!(wire::FuncGetAttribute);
                let f = self
                    .functions
                    .get(&a.func)
                    .ok_or_else(|| Malformed(format!("unknown function {}", a.func)))?;
                let r = gpu.func_attribute(f.handle, a.attr);
                self.complete_pod(
                    a.call,
                    r.map(|v| wire::U64Reply {
                        value: v as u32 as u64,
                    }),
                )?;
            }
            Op::FuncSetAttribute => {
                let a = rec!(wire::FuncSetAttribute);
                let f = self
                    .functions
                    .get(&a.func)
                    .ok_or_else(|| Malformed(format!("unknown function {}", a.func)))?;
                let r = gpu.func_set_attribute(f.handle, a.attr, a.value);
                self.complete(a.call, r.err().map_or(0, |e| e.0), &[])?;
            }
            Op::Query => {
                let q = rec!(wire::Query);
                if q.num_attrs > wire::MAX_LAUNCH_ATTRS
                    || tail.len() != q.num_attrs as usize * wire::LAUNCH_ATTR_BYTES
                {
                    return bad("query: attribute bytes disagree with num_attrs");
                }
                for a in tail.chunks_exact(wire::LAUNCH_ATTR_BYTES) {
                    if !wire::launch_attr_forwardable(u32::from_le_bytes(
                        a[..4].try_into().expect("4 bytes"),
                    )) {
                        return bad("query: attribute carries handles");
                    }
                }
                let func = match q.kind {
                    wire::query::CTX_GET_LIMIT | wire::query::CTX_SET_LIMIT => 0,
                    _ => {
                        self.functions
                            .get(&q.func)
                            .ok_or_else(|| Malformed(format!("unknown function {}", q.func)))?
                            .handle
                    }
                };
                let limit = q.args[0] as i32;
                let mut limits = ctx.shared.limits.lock().unwrap_or_else(|e| e.into_inner());
                let r = match q.kind {
                    wire::query::CTX_GET_LIMIT => limits.get(&*gpu, &self.limits, limit),
                    wire::query::CTX_SET_LIMIT => limits
                        .set(&*gpu, &mut self.limits, limit, q.args[1] as u64)
                        .map(|()| 0),
                    _ => gpu.query(q.kind, func, q.args, tail).map(|v| v as u64),
                };
                drop(limits);
                self.complete_pod(q.call, r.map(|value| wire::U64Reply { value }))?;
            }
            Op::StreamSync => {
                let h = rec!(wire::HandleCall);
                let pool = self.stream_pool(h.id)?;
                let (mark, submits) = (self.streams[&h.id].synced, self.streams[&h.id].submits);
                let Some(s) = pool else {
                    // Nothing was ever queued on it: only errors of other streams remain.
                    let r = self.take_pending();
                    self.complete(h.call, r, &[])?;
                    return Ok(());
                };
                if self.already_synced(ctx, mark, submits) {
                    self.complete(h.call, 0, &[])?;
                } else if self.complete_on_gpu(ctx, h.call, s)? {
                    let st = self.streams.get_mut(&h.id).expect("stream_pool() found it");
                    st.synced = Some(SyncMark::done(h.call, submits));
                }
            }
            Op::StreamQuery => {
                let h = rec!(wire::HandleCall);
                let r = match self
                    .stream_pool(h.id)?
                    .map_or(Ok(true), |s| gpu.stream_query(s))
                {
                    Ok(true) => self.take_pending(),
                    Ok(false) => code::NOT_READY,
                    Err(e) => e.0,
                };
                self.complete(h.call, r, &[])?;
            }
            Op::EventSync => {
                let h = rec!(wire::HandleCall);
                let e = self.event(h.id)?;
                let m = self.marker_stream;
                match gpu.stream_wait_event(m, e) {
                    Ok(()) => _ = self.complete_on_gpu(ctx, h.call, m)?,
                    Err(err) => self.complete(h.call, err.0, &[])?,
                }
            }
            Op::EventQuery => {
                let h = rec!(wire::HandleCall);
                let e = self.event(h.id)?;
                let r = match gpu.event_query(e) {
                    Ok(true) => 0,
                    Ok(false) => code::NOT_READY,
                    Err(err) => err.0,
                };
                self.complete(h.call, r, &[])?;
            }
            Op::EventElapsed => {
                let el = rec!(wire::EventElapsed);
                let (a, b) = (self.event(el.start)?, self.event(el.end)?);
                let r = gpu.event_elapsed(a, b).map(|ms| wire::U64Reply {
                    value: ms.to_bits() as u64,
                });
                self.complete_pod(el.call, r)?;
            }
            Op::CtxSync => {
                let c = rec!(CallHdr);
                let m = self.marker_stream;
                if self.already_synced(ctx, self.ctx_synced, self.submits) {
                    self.complete(c, 0, &[])?;
                } else {
                    match ctx.join_streams(self.used_streams, m) {
                        Ok(()) => {
                            if self.complete_on_gpu(ctx, c, m)? {
                                self.ctx_synced = Some(SyncMark::done(c, self.submits));
                            }
                        }
                        Err(e) => self.complete(c, e.0, &[])?,
                    }
                }
            }
            Op::TensorMap => {
                let t = rec!(wire::TensorMap);
                let old: Option<&[u8; 128]> = match t.kind {
                    wire::tensor_map::REPLACE_ADDRESS => Some(
                        tail.try_into()
                            .map_err(|_| Malformed("tensor map: descriptor length".into()))?,
                    ),
                    _ => {
                        fixed_only("tensor map")?;
                        None
                    }
                };
                let r = gpu.tensor_map(&t, old);
                match r {
                    Ok(d) => self.complete(t.call, 0, &d)?,
                    Err(e) => self.complete(t.call, e.0, &[])?,
                }
            }
            Op::Link => self.handle_link(ctx, rec!(wire::ModuleLoad))?,
            Op::BlobFetch => {
                fixed_only("blob fetch")?;
                self.handle_blob_fetch(rec!(wire::ChunkCopy))?;
            }
            Op::Vmm => {
                fixed_only("vmm")?;
                self.handle_vmm(ctx, rec!(wire::Vmm))?;
            }
            Op::Ping => {
                let c = rec!(CallHdr);
                let r = self.take_pending();
                self.complete(c, r, &[])?;
            }
        }
        Ok(())
    }

    /// The staging chunk a ChunkCopy names, bounds-checked.
    fn chunk(&self, c: &wire::ChunkCopy) -> Result<(*mut u8, usize), Malformed> {
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

    /// Registers the module's functions and writes the function table into chunk 0.
    fn finish_module_load(
        &mut self,
        ctx: &mut WorkerCtx,
        call: CallHdr,
        loaded: crate::gpu::LoadedModule,
    ) -> Result<(), Malformed> {
        let module_id = self.next_id;
        self.next_id += 1;
        let nf = loaded.functions.len();
        let np: usize = loaded.functions.iter().map(|f| f.params.len()).sum();
        let names_at = 16 + nf * 32 + np * 8;
        let mut out = Vec::with_capacity(names_at + nf * 32);
        let mut descs = Vec::with_capacity(nf);
        let mut params = Vec::with_capacity(np * 8);
        let mut names = Vec::new();
        let mut fids = Vec::with_capacity(nf);
        for f in &loaded.functions {
            let id = self.next_id;
            self.next_id += 1;
            fids.push(id);
            descs.push(wire::FunctionDesc {
                func: id,
                max_threads_per_block: f.max_threads_per_block,
                static_shared: f.static_shared,
                max_dynamic_shared: f.max_dynamic_shared,
                name_offset: (names_at + names.len()) as u32,
                name_len: f.name.len() as u32,
                first_param: (params.len() / 8) as u32,
                num_params: f.params.len() as u32,
            });
            for &(o, s) in &f.params {
                wire::put(&mut params, &wire::ParamDesc { offset: o, size: s });
            }
            names.extend_from_slice(f.name.as_bytes());
            self.functions.insert(
                id,
                Function {
                    handle: f.handle,
                    args_size: f.args_size(),
                    module: module_id,
                },
            );
        }
        let total = names_at + names.len();
        wire::put(
            &mut out,
            &wire::ModuleReply {
                module: module_id,
                num_functions: nf as u32,
                total_len: total as u32,
                _pad: 0,
            },
        );
        for d in &descs {
            wire::put(&mut out, d);
        }
        out.extend_from_slice(&params);
        out.extend_from_slice(&names);
        let (chunk, cap) = self
            .client
            .seg
            .chunk(call.channel as usize, 0)
            .expect("channel checked by caller");
        if out.len() > cap {
            for id in &fids {
                self.functions.remove(id);
            }
            ctx.release_later(
                self,
                Release {
                    modules: vec![loaded.handle],
                    ..Default::default()
                },
            );
            return self.complete(call, code::NOT_SUPPORTED, &[]);
        }
        // SAFETY: out fits in chunk 0 of a checked channel, inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), chunk, out.len()) };
        self.modules.insert(
            module_id,
            Module {
                handle: loaded.handle,
                functions: fids,
            },
        );
        debug_assert!(self
            .functions
            .values()
            .all(|f| self.modules.contains_key(&f.module)));
        let head = wire::ModuleReply {
            module: module_id,
            num_functions: nf as u32,
            total_len: total as u32,
            _pad: 0,
        };
        self.complete(call, 0, bytemuck::bytes_of(&head))
    }

    /// The work streams this client's streams are bound to, one entry per binding.
    pub fn bound_work_streams(&self) -> Vec<usize> {
        self.streams.values().filter_map(|s| s.pool).collect()
    }

    /// Everything the client still holds on this GPU, for release once its work is done.
    pub fn into_release(mut self) -> (Arc<ClientShared>, u128, usize, Release) {
        // Pinned host memory stays with the client and goes when its last Arc does.
        let rel = Release {
            pinned: Vec::new(),
            allocs: std::mem::take(&mut self.allocs).into_iter().collect(),
            modules: self.modules.drain().map(|(_, m)| m.handle).collect(),
            events: self.events.drain().map(|(_, e)| e).collect(),
            vmm: std::mem::take(&mut self.vmm).into_release(),
        };
        (self.client, self.used_streams, self.marker_stream, rel)
    }

    pub fn dev(&self) -> usize {
        self.dev
    }
}

fn wake_if_waiting(ch: &Channel, w: &std::sync::atomic::AtomicU32) {
    if ch.waiting.load(Ordering::SeqCst) != 0 {
        futex::wake(w, u32::MAX);
    }
}
