//! Costs inside the server that a host-side run isolates (issue 25): a client's
//! `cudaMalloc` + `cudaFree` as its two records reach its session, with the quick free
//! (the client idle: the block kept for the next allocation, no fence) and without it (a
//! memset between: the free waits for a fence, the allocation finds a fresh block). On the
//! host-memory GPU, so the driver's own costs are left out: what is measured is the
//! session's bookkeeping and the fences' calls, the part omps adds (the memset's own
//! handling included in the second).

use criterion::{criterion_group, criterion_main, Criterion};
use omps_ring::wire::{self, CallHdr, Op};
use omps_server::gpu::host::HostGpu;
use omps_server::gpu::Gpu;
use omps_server::session::Session;
use omps_server::worker::WorkerCtx;
use std::sync::Arc;

struct Client {
    s: Session,
    client: Arc<omps_server::client::ClientShared>,
    seq: u32,
}

impl Client {
    fn send(&mut self, ctx: &mut WorkerCtx, op: Op, rec: &[u8]) {
        self.s
            .handle(ctx, op as u32, rec)
            .expect("a well-formed record");
    }

    fn alloc(&mut self, ctx: &mut WorkerCtx, size: u64) -> u64 {
        self.seq += 1;
        let call = CallHdr {
            channel: 0,
            seq: self.seq,
        };
        self.send(
            ctx,
            Op::MemAlloc,
            bytemuck::bytes_of(&wire::MemAlloc { call, size }),
        );
        omps_server::testing::reply_u64(&self.client)
    }

    fn free(&mut self, ctx: &mut WorkerCtx, ptr: u64) {
        self.send(ctx, Op::MemFree, bytemuck::bytes_of(&wire::MemFree { ptr }));
    }
}

fn alloc_free(c: &mut Criterion) {
    let host = Arc::new(HostGpu::new(0, 1 << 30));
    let gpu: Arc<dyn Gpu> = host.clone();
    let mut ctx = WorkerCtx::new(gpu.clone()).expect("a worker context");
    let (client, _peer) = omps_server::testing::fake_client(&gpu, 1).expect("a fake client");
    // SAFETY: the fake client's segment has ring 0 and outlives the session.
    let s = unsafe { Session::new(client.clone(), 0) };
    let mut me = Client { s, client, seq: 0 };
    const MIB: u64 = 1 << 20;
    // A first fenced free arms the session's probe.
    let p = me.alloc(&mut ctx, MIB);
    me.free(&mut ctx, p);
    ctx.poll();
    c.bench_function(
        "server: malloc + free 1 MiB, client idle (quick free)",
        |b| {
            b.iter(|| {
                let p = me.alloc(&mut ctx, MIB);
                me.free(&mut ctx, p);
            })
        },
    );
    let scratch = me.alloc(&mut ctx, 64);
    let memset = wire::Memset {
        dst: scratch,
        count: 1,
        value: 1,
        elem_size: 4,
        stream: 0,
        _pad: 0,
    };
    c.bench_function(
        "server: malloc + free 1 MiB after a memset (fenced free)",
        |b| {
            b.iter_custom(|iters| {
                let mut spent = std::time::Duration::ZERO;
                for i in 0..iters {
                    let t = std::time::Instant::now();
                    me.send(&mut ctx, Op::Memset, bytemuck::bytes_of(&memset));
                    let p = me.alloc(&mut ctx, MIB);
                    me.free(&mut ctx, p);
                    spent += t.elapsed();
                    // The releaser's work, which a lane hands off, outside the timing.
                    if i % 64 == 63 {
                        ctx.poll();
                    }
                }
                ctx.poll();
                spent
            })
        },
    );
    ctx.retire(me.s);
    ctx.poll();
}

criterion_group!(benches, alloc_free);
criterion_main!(benches);
