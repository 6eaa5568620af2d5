//! The fuzzed client and the bystander as the fuzz body drives them: a session over a fake
//! client's segment, the records it sends, the answers it reads, and what it holds so far.

use crate::gpu::Gpu;
use crate::session::Session;
use crate::worker::WorkerCtx;
use omps_ring::wire::{self, CallHdr, Op};
use std::sync::Arc;

/// A host module of one kernel, `fill_u32(ptr, value, count)`.
pub(super) const IMAGE: &[u8] = b"omps-host-module\nfn fill_u32 0:8 8:4 12:4\nglobal table 64\n\0";
pub(super) const PATTERN: u32 = 0xABAB_ABAB;
pub(super) const BYSTANDER_BYTES: usize = 4096;
/// The bystander's allocation it exports for the fuzzed client to open.
pub(super) const SHARED_BYTES: u64 = 1024;

/// What the fuzzed client holds so far, by the ids and addresses the server gave.
#[derive(Default)]
pub(super) struct Held {
    pub(super) allocs: Vec<(u64, u64)>,
    pub(super) streams: Vec<u32>,
    pub(super) events: Vec<u32>,
    pub(super) modules: Vec<u32>,
    pub(super) functions: Vec<u32>,
    /// Graph and executable-graph ids the server gave, IPC openings (pointers).
    pub(super) graphs: Vec<u32>,
    pub(super) execs: Vec<u32>,
    pub(super) opened: Vec<u64>,
    /// VMM reservations (start, size), physical handles (id, size), mappings (start, size).
    pub(super) reserved: Vec<(u64, u64)>,
    pub(super) vmm_handles: Vec<(u32, u64)>,
    pub(super) mapped: Vec<(u64, u64)>,
    /// CUDA arrays (id, bytes per row, rows).
    pub(super) arrays: Vec<(u32, u64, u64)>,
    /// Host functions queued and not yet acknowledged: (slot, sequence).
    pub(super) host_fns: Vec<(u32, u32)>,
    pub(super) next_id: u32,
}

/// Reads the next byte of the sequence (0 once it is spent).
pub(super) struct Bytes<'a>(pub(super) &'a [u8]);

impl Bytes<'_> {
    pub(super) fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    pub(super) fn pick<T: Copy>(&mut self, v: &[T]) -> Option<T> {
        let i = self.u8() as usize;
        (!v.is_empty()).then(|| v[i % v.len()])
    }
}

pub(super) struct Client {
    pub(super) s: Session,
    pub(super) client: Arc<crate::client::ClientShared>,
    _peer: std::os::unix::net::UnixStream,
    seq: u32,
}

impl Client {
    pub(super) fn new(gpu: &Arc<dyn Gpu>, id: u32) -> Client {
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

    pub(super) fn call(&mut self) -> CallHdr {
        self.seq = self.seq.wrapping_add(1).max(1);
        CallHdr {
            channel: 0,
            seq: self.seq,
        }
    }

    /// Hands one record to the session: false once it found the record a lie (the
    /// client would be cut off).
    pub(super) fn send(&mut self, ctx: &mut WorkerCtx, op: Op, parts: &[&[u8]]) -> bool {
        let rec: Vec<u8> = parts.concat();
        let ok = self.s.handle(ctx, op as u32, &rec).is_ok();
        // The end of its turn, as the lane's (launches gathered go), but for launches:
        // launches in a row are one turn, so that the GPU (where it takes runs) gets them
        // gathered (session/kinds/launch_run.rs), and the next record sends them.
        if op != Op::Launch {
            self.s.flush_run(ctx);
        }
        ctx.poll();
        ok
    }

    /// A memset of `count` words at `dst`, its value and stream read from the sequence.
    pub(super) fn memset_words(
        &mut self,
        ctx: &mut WorkerCtx,
        b: &mut Bytes,
        held: &Held,
        dst: u64,
        count: u64,
    ) -> bool {
        let m = wire::Memset {
            dst,
            count,
            value: b.u8() as u32,
            elem_size: 4,
            stream: b.pick(&held.streams).unwrap_or(0),
            _pad: 0,
        };
        self.send(ctx, Op::Memset, &[bytemuck::bytes_of(&m)])
    }

    /// The u64 answer of the last call.
    pub(super) fn reply_u64(&self) -> u64 {
        crate::testing::reply_u64(&self.client)
    }

    pub(super) fn result(&self) -> i32 {
        self.client
            .seg
            .channel(0)
            .expect("channel 0")
            .result
            .load(std::sync::atomic::Ordering::Acquire)
    }

    pub(super) fn alloc(&mut self, ctx: &mut WorkerCtx, size: u64) -> Option<u64> {
        let call = self.call();
        let r = wire::MemAlloc { call, size };
        if !self.send(ctx, Op::MemAlloc, &[bytemuck::bytes_of(&r)]) || self.result() != 0 {
            return None;
        }
        Some(self.reply_u64())
    }

    /// A handle to its allocation `ptr` for other clients to open.
    pub(super) fn export(&mut self, ctx: &mut WorkerCtx, ptr: u64) -> Option<wire::IpcHandle> {
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
    pub(super) fn synchronizes(&mut self, ctx: &mut WorkerCtx) -> bool {
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

    /// Uploads `blob` through channel 0's first chunk for a load, link or JIT load:
    /// None where it does not fit, Some(false) once the client is cut off.
    pub(super) fn upload(&mut self, ctx: &mut WorkerCtx, blob: &[u8]) -> Option<bool> {
        let (p, cap) = self.client.seg.chunk(0, 0)?;
        if cap < blob.len() {
            return None;
        }
        // SAFETY: the chunk lies in the segment and holds `cap` bytes.
        unsafe { std::ptr::copy_nonoverlapping(blob.as_ptr(), p, blob.len()) };
        let append = wire::ChunkCopy {
            channel: 0,
            chunk: 0,
            len: blob.len() as u32,
            seq: self.call().seq,
            ..Default::default()
        };
        Some(self.send(ctx, Op::BlobAppend, &[bytemuck::bytes_of(&append)]))
    }

    /// Loads IMAGE through channel 0's first chunk: the module id and function ids.
    pub(super) fn load(&mut self, ctx: &mut WorkerCtx) -> Option<(u32, Vec<u32>)> {
        if !self.upload(ctx, IMAGE)? {
            return None;
        }
        let (p, cap) = self.client.seg.chunk(0, 0)?;
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
