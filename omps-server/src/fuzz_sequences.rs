//! The stateful fuzz body: byte strings decoded into sequences of well-formed client
//! records that name what the sequence made before (allocations, streams, events,
//! modules and their functions, captures, graphs and executable graphs, IPC openings of
//! the bystander's memory, link and JIT containers), mixed with records that lie and with
//! the client's death at any step. Two clients share the host GPU: the fuzzed one, and a
//! bystander whose memory holds a pattern and which synchronizes after every step.
//! Whatever the sequence, nothing panics, the fuzzed client never changes the bystander's
//! memory nor stalls it (its synchronization is answered within a bounded number of
//! worker passes), and once it is retired every byte, event, module and graph it held is
//! free again. Run by CI under proptest (below) and by the `sequences`
//! cargo-fuzz target.

use crate::gpu::Gpu;
use crate::gpu_host::HostGpu;
use crate::session::Session;
use crate::worker::WorkerCtx;
use omps_ring::wire::{self, CallHdr, Op};
use std::sync::Arc;

/// A host module of one kernel, `fill_u32(ptr, value, count)`.
const IMAGE: &[u8] = b"omps-host-module\nfn fill_u32 0:8 8:4 12:4\nglobal table 64\n\0";
const PATTERN: u32 = 0xABAB_ABAB;
const BYSTANDER_BYTES: usize = 4096;
/// The bystander's allocation it exports for the fuzzed client to open.
const SHARED_BYTES: u64 = 1024;

/// What the fuzzed client holds so far, by the ids and addresses the server gave.
#[derive(Default)]
struct Held {
    allocs: Vec<(u64, u64)>,
    streams: Vec<u32>,
    events: Vec<u32>,
    modules: Vec<u32>,
    functions: Vec<u32>,
    /// Graph and executable-graph ids the server gave, IPC openings (pointers).
    graphs: Vec<u32>,
    execs: Vec<u32>,
    opened: Vec<u64>,
    next_id: u32,
}

/// Reads the next byte of the sequence (0 once it is spent).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> Option<T> {
        let i = self.u8() as usize;
        (!v.is_empty()).then(|| v[i % v.len()])
    }
}

struct Client {
    s: Session,
    client: Arc<crate::client::ClientShared>,
    _peer: std::os::unix::net::UnixStream,
    seq: u32,
}

impl Client {
    fn new(gpu: &Arc<dyn Gpu>, id: u32) -> Client {
        let (client, peer) = crate::testing::fake_client(gpu, id).expect("fake client");
        // SAFETY: the fake client's segment has ring 0 and lives as long as the session.
        let s = unsafe { Session::new(client.clone(), 0) };
        Client {
            s,
            client,
            _peer: peer,
            seq: 0,
        }
    }

    fn call(&mut self) -> CallHdr {
        self.seq = self.seq.wrapping_add(1).max(1);
        CallHdr {
            channel: 0,
            seq: self.seq,
        }
    }

    /// Hands one record to the session: false once it found the record a lie (the
    /// client would be cut off).
    fn send(&mut self, ctx: &mut WorkerCtx, op: Op, parts: &[&[u8]]) -> bool {
        let rec: Vec<u8> = parts.concat();
        let ok = self.s.handle(ctx, op as u32, &rec).is_ok();
        ctx.poll();
        ok
    }

    /// The u64 answer of the last call.
    fn reply_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        self.client
            .seg
            .channel(0)
            .expect("channel 0")
            .read_reply(&mut b);
        u64::from_le_bytes(b)
    }

    fn result(&self) -> i32 {
        self.client
            .seg
            .channel(0)
            .expect("channel 0")
            .result
            .load(std::sync::atomic::Ordering::Acquire)
    }

    fn alloc(&mut self, ctx: &mut WorkerCtx, size: u64) -> Option<u64> {
        let call = self.call();
        let r = wire::MemAlloc { call, size };
        if !self.send(ctx, Op::MemAlloc, &[bytemuck::bytes_of(&r)]) || self.result() != 0 {
            return None;
        }
        Some(self.reply_u64())
    }

    /// A handle to its allocation `ptr` for other clients to open.
    fn export(&mut self, ctx: &mut WorkerCtx, ptr: u64) -> Option<wire::IpcHandle> {
        let c = wire::IpcCall {
            call: self.call(),
            ptr,
        };
        if !self.send(ctx, Op::IpcGetMemHandle, &[bytemuck::bytes_of(&c)]) || self.result() != 0 {
            return None;
        }
        let mut h = wire::IpcHandle { bytes: [0; 64] };
        self.client
            .seg
            .channel(0)
            .expect("channel 0")
            .read_reply(&mut h.bytes);
        Some(h)
    }

    /// Synchronizes its default stream: whether the answer came within a bounded number
    /// of worker passes (a client that stalls others fails here).
    fn synchronizes(&mut self, ctx: &mut WorkerCtx) -> bool {
        let call = self.call();
        let h = wire::HandleCall {
            call,
            id: 0,
            _pad: 0,
        };
        if !self.send(ctx, Op::StreamSync, &[bytemuck::bytes_of(&h)]) {
            return false;
        }
        let ch = self.client.seg.channel(0).expect("channel 0");
        for _ in 0..200 {
            if ch.done.load(std::sync::atomic::Ordering::Acquire) == call.seq {
                return true;
            }
            ctx.poll();
        }
        false
    }

    /// Loads IMAGE through channel 0's first chunk: the module id and function ids.
    fn load(&mut self, ctx: &mut WorkerCtx) -> Option<(u32, Vec<u32>)> {
        let (p, cap) = self.client.seg.chunk(0, 0)?;
        if cap < IMAGE.len() {
            return None;
        }
        // SAFETY: the chunk lies in the segment and holds `cap` bytes.
        unsafe { std::ptr::copy_nonoverlapping(IMAGE.as_ptr(), p, IMAGE.len()) };
        let append = wire::ChunkCopy {
            channel: 0,
            chunk: 0,
            len: IMAGE.len() as u32,
            seq: self.call().seq,
            ..Default::default()
        };
        if !self.send(ctx, Op::BlobAppend, &[bytemuck::bytes_of(&append)]) {
            return None;
        }
        let load = wire::ModuleLoad {
            call: self.call(),
            blob_len: IMAGE.len() as u64,
        };
        if !self.send(ctx, Op::ModuleLoad, &[bytemuck::bytes_of(&load)]) || self.result() != 0 {
            return None;
        }
        // SAFETY: the server wrote the function table into chunk 0 before answering.
        let table = unsafe { std::slice::from_raw_parts(p as *const u8, cap) };
        let head: wire::ModuleReply = wire::get(table)?;
        let funcs = (0..head.num_functions as usize)
            .filter_map(|i| wire::get::<wire::FunctionDesc>(&table[16 + i * 32..]))
            .map(|d| d.func)
            .collect();
        Some((head.module, funcs))
    }
}

/// What a sequence got done: allocations made, modules loaded, kernels run.
#[derive(Debug, Default)]
pub struct Done {
    pub allocs: usize,
    pub loads: usize,
    pub launches: usize,
    /// Executable graphs made, and IPC openings.
    pub execs: usize,
    pub opened: usize,
}

/// One sequence (see the module's documentation).
pub fn run_sequence(data: &[u8]) -> Done {
    let host = Arc::new(HostGpu::new(0, 1 << 26));
    let gpu: Arc<dyn Gpu> = host.clone();
    let mut ctx = WorkerCtx::new(gpu.clone()).expect("worker ctx");
    let modules_before = host.modules_loaded();

    // The bystander: one allocation holding a pattern.
    let mut other = Client::new(&gpu, 2);
    let theirs = other
        .alloc(&mut ctx, BYSTANDER_BYTES as u64)
        .expect("bystander allocation");
    gpu.memset(theirs, PATTERN, 4, BYSTANDER_BYTES / 4, 0)
        .expect("pattern");

    // What the fuzzed client may open and write: another allocation of the bystander's,
    // exported (the pattern's is never shared).
    let shared = other
        .alloc(&mut ctx, SHARED_BYTES)
        .expect("bystander's shared allocation");
    let exported = other.export(&mut ctx, shared);

    let mut me = Client::new(&gpu, 1);
    let mut held = Held {
        next_id: 1,
        ..Default::default()
    };
    let mut b = Bytes(data);
    let mut done = Done::default();
    while !b.0.is_empty() {
        let (allocs, modules) = (held.allocs.len(), held.modules.len());
        let (execs, opened) = (held.execs.len(), held.opened.len());
        let alive = step(&mut me, &mut ctx, &mut held, &mut b, theirs, exported);
        assert!(
            other.synchronizes(&mut ctx),
            "the fuzzed client stalled the bystander"
        );
        done.allocs += held.allocs.len().saturating_sub(allocs);
        done.loads += held.modules.len().saturating_sub(modules);
        done.execs += held.execs.len().saturating_sub(execs);
        done.opened += held.opened.len().saturating_sub(opened);
        if !alive {
            break;
        }
    }
    done.launches = host.launches();
    ctx.retire(me.s);
    for _ in 0..4 {
        ctx.poll();
    }
    let back = host.peek(theirs, BYSTANDER_BYTES).expect("read back");
    assert!(
        back.chunks_exact(4)
            .all(|w| u32::from_le_bytes(w.try_into().unwrap()) == PATTERN),
        "the fuzzed client changed another client's memory"
    );
    assert_eq!(
        host.bytes_allocated(),
        BYSTANDER_BYTES as u64 + SHARED_BYTES,
        "a retired session leaked device memory"
    );
    ctx.retire(other.s);
    for _ in 0..4 {
        ctx.poll();
    }
    assert_eq!(
        host.bytes_allocated(),
        0,
        "the bystander's memory was not freed"
    );
    assert_eq!(
        host.events_live(),
        ctx.own_events(),
        "a retired session leaked events"
    );
    assert_eq!(
        host.modules_loaded(),
        modules_before,
        "a retired session leaked modules"
    );
    assert_eq!(
        host.graph_count(),
        (0, 0),
        "a retired session leaked graphs"
    );
    done
}

/// One record of the sequence: false once the client is dead (it lied, or died here).
fn step(
    me: &mut Client,
    ctx: &mut WorkerCtx,
    held: &mut Held,
    b: &mut Bytes,
    theirs: u64,
    exported: Option<wire::IpcHandle>,
) -> bool {
    let tag = b.u8();
    if tag % 32 >= 16 {
        return step_graphs_ipc_link(me, ctx, held, b, exported);
    }
    match tag % 16 {
        0 | 1 => {
            let size = (b.u8() as u64 + 1) * 64;
            if let Some(p) = me.alloc(ctx, size) {
                held.allocs.push((p, size));
            }
        }
        2 => {
            if let Some(i) = (!held.allocs.is_empty()).then(|| b.u8() as usize % held.allocs.len())
            {
                let (ptr, _) = held.allocs.swap_remove(i);
                return me.send(
                    ctx,
                    Op::MemFree,
                    &[bytemuck::bytes_of(&wire::MemFree { ptr })],
                );
            }
        }
        3 => {
            // A memset inside an allocation, or one running past its end or into the
            // other client's memory (refused).
            if let Some((p, n)) = b.pick(&held.allocs) {
                let over = b.u8().is_multiple_of(4);
                let count = if over { n / 4 + 1 } else { n / 4 };
                let dst = if b.u8().is_multiple_of(8) { theirs } else { p };
                let m = wire::Memset {
                    dst,
                    count,
                    value: b.u8() as u32,
                    elem_size: 4,
                    stream: b.pick(&held.streams).unwrap_or(0),
                    _pad: 0,
                };
                return me.send(ctx, Op::Memset, &[bytemuck::bytes_of(&m)]);
            }
        }
        4 => {
            // A copy between two of its allocations, or from or into the other client's
            // memory (refused).
            if let (Some((d, dn)), Some((s, sn))) = (b.pick(&held.allocs), b.pick(&held.allocs)) {
                let (src, dst) = match b.u8() % 8 {
                    0 => (theirs, d),
                    1 => (s, theirs),
                    _ => (s, d),
                };
                let c = wire::CopyDtoD {
                    dst,
                    src,
                    len: dn.min(sn),
                    stream: 0,
                    _pad: 0,
                };
                return me.send(ctx, Op::CopyDtoD, &[bytemuck::bytes_of(&c)]);
            }
        }
        5 => {
            let id = 1000 + held.next_id;
            held.next_id += 1;
            let c = wire::StreamCreate {
                id,
                flags: (b.u8() & 1) as u32,
                priority: 0,
                _pad: 0,
            };
            held.streams.push(id);
            return me.send(ctx, Op::StreamCreate, &[bytemuck::bytes_of(&c)]);
        }
        6 => {
            if let Some(i) =
                (!held.streams.is_empty()).then(|| b.u8() as usize % held.streams.len())
            {
                let id = held.streams.swap_remove(i);
                let h = wire::Handle { id, _pad: 0 };
                return me.send(ctx, Op::StreamDestroy, &[bytemuck::bytes_of(&h)]);
            }
        }
        7 => {
            let id = 5000 + held.next_id;
            held.next_id += 1;
            held.events.push(id);
            let c = wire::EventCreate { id, flags: 0 };
            return me.send(ctx, Op::EventCreate, &[bytemuck::bytes_of(&c)]);
        }
        8 => {
            if let Some(event) = b.pick(&held.events) {
                let op = if b.u8() & 1 == 0 {
                    Op::EventRecord
                } else {
                    Op::StreamWaitEvent
                };
                let r = wire::EventRecord {
                    event,
                    stream: b.pick(&held.streams).unwrap_or(0),
                };
                return me.send(ctx, op, &[bytemuck::bytes_of(&r)]);
            }
        }
        9 => {
            if let Some((m, f)) = me.load(ctx) {
                held.modules.push(m);
                held.functions.extend(f);
            }
        }
        10 => {
            // fill_u32 over one of its allocations, within it.
            if let (Some(func), Some((p, n))) = (b.pick(&held.functions), b.pick(&held.allocs)) {
                let l = wire::Launch {
                    func,
                    stream: b.pick(&held.streams).unwrap_or(0),
                    grid: [1; 3],
                    block: [1; 3],
                    args_len: 16,
                    ..Default::default()
                };
                let mut args = p.to_le_bytes().to_vec();
                args.extend_from_slice(&(b.u8() as u32).to_le_bytes());
                args.extend_from_slice(&((n / 4) as u32).to_le_bytes());
                return me.send(ctx, Op::Launch, &[bytemuck::bytes_of(&l), &args]);
            }
        }
        11 => {
            if let Some(i) =
                (!held.modules.is_empty()).then(|| b.u8() as usize % held.modules.len())
            {
                let id = held.modules.swap_remove(i);
                held.functions.clear();
                let h = wire::Handle { id, _pad: 0 };
                return me.send(ctx, Op::ModuleUnload, &[bytemuck::bytes_of(&h)]);
            }
        }
        12 => {
            let call = me.call();
            let stream = b.pick(&held.streams).unwrap_or(0);
            let h = wire::HandleCall {
                call,
                id: stream,
                _pad: 0,
            };
            return me.send(ctx, Op::StreamSync, &[bytemuck::bytes_of(&h)]);
        }
        13 => {
            // A record that may lie: any tag, any bytes.
            let tag = b.u8() as u32 % 64;
            let len = b.u8() as usize % 64;
            let rec: Vec<u8> = (0..len).map(|_| b.u8()).collect();
            let ok = me.s.handle(ctx, tag, &rec).is_ok();
            ctx.poll();
            return ok;
        }
        14 if b.u8().is_multiple_of(8) => return false, // dies here
        _ => {
            let call = me.call();
            return me.send(ctx, Op::Ping, &[bytemuck::bytes_of(&call)]);
        }
    }
    true
}

/// The families past the basic ones: captures and graphs, IPC, link and JIT containers.
fn step_graphs_ipc_link(
    me: &mut Client,
    ctx: &mut WorkerCtx,
    held: &mut Held,
    b: &mut Bytes,
    exported: Option<wire::IpcHandle>,
) -> bool {
    match b.u8() % 10 {
        0 | 1 => {
            // A capture begins or ends on one of its streams (or the default one).
            let c = wire::CaptureCall {
                call: me.call(),
                stream: b.pick(&held.streams).unwrap_or(0),
                mode: (b.u8() % 4) as u32,
            };
            let begin = b.u8() & 1 == 0;
            let op = if begin {
                Op::CaptureBegin
            } else {
                Op::CaptureEnd
            };
            if !me.send(ctx, op, &[bytemuck::bytes_of(&c)]) {
                return false;
            }
            if !begin && me.result() == 0 {
                held.graphs.push(me.reply_u64() as u32);
            }
        }
        2 => {
            // Instantiation, with flags the driver knows or not.
            if let Some(graph) = b.pick(&held.graphs) {
                let flags = [0u64, 1, 4, 8, 2, 1 << 40][b.u8() as usize % 6];
                let g = wire::GraphInstantiate {
                    call: me.call(),
                    graph,
                    _pad: 0,
                    flags,
                };
                if !me.send(ctx, Op::GraphInstantiate, &[bytemuck::bytes_of(&g)]) {
                    return false;
                }
                if me.result() == 0 {
                    held.execs.push(me.reply_u64() as u32);
                }
            }
        }
        3 => {
            if let Some(exec) = b.pick(&held.execs) {
                let l = wire::GraphLaunch {
                    exec,
                    stream: b.pick(&held.streams).unwrap_or(0),
                };
                let op = if b.u8() & 1 == 0 {
                    Op::GraphLaunch
                } else {
                    Op::GraphUpload
                };
                return me.send(ctx, op, &[bytemuck::bytes_of(&l)]);
            }
        }
        4 => {
            let (list, op) = if b.u8() & 1 == 0 {
                (&mut held.graphs, Op::GraphDestroy)
            } else {
                (&mut held.execs, Op::GraphExecDestroy)
            };
            if !list.is_empty() {
                let id = list.swap_remove(b.u8() as usize % list.len());
                let h = wire::Handle { id, _pad: 0 };
                return me.send(ctx, op, &[bytemuck::bytes_of(&h)]);
            }
        }
        5 => {
            // The bystander's memory opened, or a handle with a byte changed.
            if let Some(mut handle) = exported {
                if b.u8().is_multiple_of(4) {
                    let i = b.u8() as usize % 64;
                    handle.bytes[i] ^= b.u8() | 1;
                }
                let o = wire::IpcOpen {
                    call: me.call(),
                    handle,
                };
                if !me.send(ctx, Op::IpcOpenMemHandle, &[bytemuck::bytes_of(&o)]) {
                    return false;
                }
                if me.result() == 0 {
                    held.opened.push(me.reply_u64());
                }
            }
        }
        6 => {
            if !held.opened.is_empty() {
                let ptr = held.opened.swap_remove(b.u8() as usize % held.opened.len());
                let c = wire::IpcCall {
                    call: me.call(),
                    ptr,
                };
                return me.send(ctx, Op::IpcCloseMemHandle, &[bytemuck::bytes_of(&c)]);
            }
        }
        7 | 8 => {
            // A link or JIT container of fuzzed bytes through channel 0's first chunk.
            let len = b.u8() as usize % 96;
            let blob: Vec<u8> = (0..len).map(|_| b.u8()).collect();
            let Some((p, cap)) = me.client.seg.chunk(0, 0) else {
                return true;
            };
            if cap < blob.len() {
                return true;
            }
            // SAFETY: the chunk lies in the segment and holds `cap` bytes.
            unsafe { std::ptr::copy_nonoverlapping(blob.as_ptr(), p, blob.len()) };
            let append = wire::ChunkCopy {
                channel: 0,
                chunk: 0,
                len: blob.len() as u32,
                seq: me.call().seq,
                ..Default::default()
            };
            if !me.send(ctx, Op::BlobAppend, &[bytemuck::bytes_of(&append)]) {
                return false;
            }
            let load = wire::ModuleLoad {
                call: me.call(),
                blob_len: blob.len() as u64,
            };
            let op = if b.u8() & 1 == 0 {
                Op::Link
            } else {
                Op::ModuleLoadJit
            };
            return me.send(ctx, op, &[bytemuck::bytes_of(&load)]);
        }
        _ => {
            // A memory query: the client's own view.
            let call = me.call();
            return me.send(ctx, Op::Ping, &[bytemuck::bytes_of(&call)]);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Sequences of plausible records, lies and deaths never panic, leak or reach
        /// the other client's memory.
        #[test]
        fn sequences_never_panic_leak_or_reach_others(
            data in proptest::collection::vec(any::<u8>(), 0..400)
        ) {
            super::run_sequence(&data);
        }
    }

    /// A sequence that certainly allocates, loads, launches, copies and frees, so the
    /// checks above are not passed by doing nothing.
    #[test]
    fn a_full_sequence_does_what_it_says() {
        // alloc, alloc, load, launch, memset, copy, free, stream, event, record, sync.
        let data = [
            0, 3, 1, 5, 9, 10, 0, 0, 7, 3, 0, 0, 0, 2, 4, 0, 1, 1, 2, 0, 5, 1, 7, 8, 0, 0, 0, 12,
            0, 15,
        ];
        let done = super::run_sequence(&data);
        assert!(
            done.allocs >= 2 && done.loads == 1 && done.launches >= 1,
            "{done:?}"
        );
    }

    /// A sequence that certainly captures a memset, instantiates and launches the graph,
    /// and opens and closes the bystander's exported memory.
    #[test]
    fn a_graph_and_ipc_sequence_does_what_it_says() {
        let data = [
            0, 0, // alloc 64 bytes
            5, 0, // a stream
            16, 0, 0, 2, 0, // capture begins on it (relaxed)
            3, 0, 1, 1, 7, 0, // a memset of the allocation, captured
            16, 1, 0, 2, 1, // the capture ends: a graph
            16, 2, 0, 0, // instantiated
            16, 3, 0, 0, 0, // launched
            16, 5, 1, // the bystander's memory opened
            16, 6, 0, // and closed
        ];
        let done = super::run_sequence(&data);
        assert!(done.execs == 1 && done.opened == 1, "{done:?}");
    }

    /// The bystander check means something only if no host mapping can be device memory:
    /// the host GPU reaches registered host memory (a client's segment, page-locked memory)
    /// at its host address, so a segment over a device address would be that memory. Its
    /// addresses were once where ASLR maps, and now and then the fuzzed client's segment
    /// covered the bystander's allocation and this fuzz failed. Whatever the GPU or kind of
    /// allocation, no host page can be mapped at its address.
    #[test]
    fn no_host_mapping_can_be_made_at_a_device_address() {
        use crate::gpu::Gpu;
        use crate::gpu_host::{HostGpu, HostProfile, VMM_GRANULE};
        for ordinal in 0..4 {
            let gpu = HostGpu::with_profile(ordinal, 1 << 26, HostProfile::Sm90);
            let alloc = gpu.mem_alloc(4096).expect("alloc");
            let reserved = gpu.vmm_reserve(VMM_GRANULE, 0, 0).expect("reserve");
            for a in [alloc, reserved] {
                // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping; a page made here
                // is unmapped before the check.
                let p = unsafe {
                    libc::mmap(
                        a as *mut libc::c_void,
                        4096,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                        -1,
                        0,
                    )
                };
                let err = (p == libc::MAP_FAILED).then(std::io::Error::last_os_error);
                if p != libc::MAP_FAILED {
                    // SAFETY: the page this test just mapped, used by nothing.
                    unsafe { libc::munmap(p, 4096) };
                }
                assert!(
                    p == libc::MAP_FAILED || p as u64 != a,
                    "GPU {ordinal}: a host page was mapped at device address {a:#x}"
                );
                assert_ne!(
                    err.and_then(|e| e.raw_os_error()),
                    Some(libc::EEXIST),
                    "GPU {ordinal}: device address {a:#x} is inside a host mapping"
                );
            }
        }
    }
}
