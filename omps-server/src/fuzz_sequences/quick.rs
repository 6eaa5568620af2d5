//! The quick free (session/kinds/quick_free.rs) through real records: a block freed while
//! the client has nothing on the GPU is kept by its lane, still charged, for its next
//! allocation of that size; any other record makes the next free wait for a fence again;
//! kept blocks go back by age, when the client goes, and when any client's allocation runs
//! out of memory. Here with
//! the fuzz body's client because it sends records as the shim does.

use super::client::Client;
use crate::gpu::host::HostGpu;
use crate::gpu::Gpu;
use crate::worker::WorkerCtx;
use omps_ring::wire::{self, Op};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

/// A host-memory GPU of `bytes`, as itself and as a Gpu, and a lane's context on it.
fn host_gpu(bytes: u64) -> (Arc<HostGpu>, Arc<dyn Gpu>, WorkerCtx) {
    let host = Arc::new(HostGpu::new(0, bytes));
    let gpu: Arc<dyn Gpu> = host.clone();
    let ctx = WorkerCtx::new(gpu.clone()).unwrap();
    (host, gpu, ctx)
}

fn free(me: &mut Client, ctx: &mut WorkerCtx, ptr: u64) {
    assert!(me.send(
        ctx,
        Op::MemFree,
        &[bytemuck::bytes_of(&wire::MemFree { ptr })]
    ));
}

#[test]
fn idle_frees_are_kept_for_the_same_size_and_given_back() {
    let (host, gpu, mut ctx) = host_gpu(1 << 26);
    let mut me = Client::new(&gpu, 1);
    let charged = |me: &Client| me.client.mem_bytes[0].load(Ordering::Relaxed);

    // The first free waits for a fence (nothing known of the client's work yet).
    let p = me.alloc(&mut ctx, MIB).expect("alloc");
    free(&mut me, &mut ctx, p);
    assert!(!ctx.holds_kept(), "a free before any probe is fenced");
    assert_eq!(
        host.bytes_allocated(),
        0,
        "and given back once its fence passed"
    );
    assert_eq!(charged(&me), 0);

    // Now quiet since the probe, which has passed: the block is kept, still charged.
    let q = me.alloc(&mut ctx, MIB).expect("alloc");
    free(&mut me, &mut ctx, q);
    assert!(ctx.holds_kept());
    assert_eq!(host.bytes_allocated(), MIB);
    assert_eq!(charged(&me), MIB, "kept blocks stay the client's");
    // The same size gets it back, without the driver, and charged once only.
    assert_eq!(me.alloc(&mut ctx, MIB), Some(q));
    assert_eq!(charged(&me), MIB);
    assert_eq!(host.bytes_allocated(), MIB);
    free(&mut me, &mut ctx, q);
    assert!(ctx.holds_kept());

    // An allocation of another size does not take it; it goes back with age.
    let r = me.alloc(&mut ctx, 2 * MIB).expect("alloc");
    assert!(ctx.holds_kept());
    std::thread::sleep(crate::worker::kept::KEEP);
    ctx.give_back_kept();
    ctx.poll();
    assert_eq!(host.bytes_allocated(), 2 * MIB, "q went back");
    assert_eq!(charged(&me), 2 * MIB);

    // Work since the probe: the next free waits for a fence again.
    let m = wire::Memset {
        dst: r,
        count: 4,
        value: 7,
        elem_size: 4,
        stream: 0,
        _pad: 0,
    };
    assert!(me.send(&mut ctx, Op::Memset, &[bytemuck::bytes_of(&m)]));
    free(&mut me, &mut ctx, r);
    assert!(!ctx.holds_kept(), "a free after work is fenced");
    assert_eq!(host.bytes_allocated(), 0);

    // Kept blocks go back once older than KEEP, as the lane looks each pass.
    let t = me.alloc(&mut ctx, MIB).expect("alloc");
    free(&mut me, &mut ctx, t);
    assert!(ctx.holds_kept());
    ctx.give_back_kept();
    assert!(ctx.holds_kept(), "too young to go");
    std::thread::sleep(crate::worker::kept::KEEP);
    ctx.give_back_kept();
    assert!(!ctx.holds_kept());
    ctx.poll();
    assert_eq!(host.bytes_allocated(), 0);
    assert_eq!(charged(&me), 0);

    // And what is kept when the client goes is freed with the rest (its probe event too).
    let u = me.alloc(&mut ctx, MIB).expect("alloc");
    free(&mut me, &mut ctx, u);
    assert!(ctx.holds_kept());
    let events = host.events_live();
    ctx.retire(me.s);
    ctx.poll();
    assert_eq!(host.bytes_allocated(), 0, "kept block freed at the end");
    assert!(host.events_live() < events, "the probe event destroyed");
}

#[test]
fn an_allocation_out_of_memory_takes_back_what_other_clients_keep() {
    let (host, gpu, mut ctx) = host_gpu(64 * MIB);
    let mut a = Client::new(&gpu, 1);
    let mut b = Client::new(&gpu, 2);
    // a frees 40 MiB while idle (after a first fenced free): its lane keeps it.
    let p = a.alloc(&mut ctx, MIB).expect("alloc");
    free(&mut a, &mut ctx, p);
    let big = a.alloc(&mut ctx, 40 * MIB).expect("alloc");
    free(&mut a, &mut ctx, big);
    assert!(ctx.holds_kept());
    assert_eq!(host.bytes_allocated(), 40 * MIB);
    // b's 40 MiB does not fit beside it: the allocation asks it back, and succeeds.
    assert!(
        b.alloc(&mut ctx, 40 * MIB).is_some(),
        "kept blocks came back for b"
    );
    assert!(!ctx.holds_kept());
    assert_eq!(
        a.client.mem_bytes[0].load(Ordering::Relaxed),
        0,
        "a's charge went with it"
    );
    ctx.retire(a.s);
    ctx.retire(b.s);
    ctx.poll();
    assert_eq!(host.bytes_allocated(), 0);
}

/// Work queued on a stream before a capture begins on it stays among what fences wait for
/// (fences skip capturing streams): else a free after the capture began went back while
/// that work still ran, and a quick free found the client idle.
#[test]
fn work_before_a_capture_is_still_fenced() {
    let (host, gpu, mut ctx) = host_gpu(1 << 26);
    let mut me = Client::new(&gpu, 1);
    let p = me.alloc(&mut ctx, MIB).expect("alloc");
    let c = wire::StreamCreate {
        id: 1001,
        flags: 1,
        priority: 0,
        _pad: 0,
    };
    assert!(me.send(&mut ctx, Op::StreamCreate, &[bytemuck::bytes_of(&c)]));
    let m = wire::Memset {
        dst: p,
        count: 4,
        value: 7,
        elem_size: 4,
        stream: 1001,
        _pad: 0,
    };
    assert!(me.send(&mut ctx, Op::Memset, &[bytemuck::bytes_of(&m)]));
    let before = me.s.left_len();
    let cap = wire::CaptureCall {
        call: me.call(),
        stream: 1001,
        mode: 0,
    };
    assert!(me.send(&mut ctx, Op::CaptureBegin, &[bytemuck::bytes_of(&cap)]));
    assert_eq!(me.result(), 0, "the capture began");
    assert_eq!(
        me.s.left_len(),
        before + 1,
        "the work before it is remembered"
    );
    ctx.retire(me.s);
    ctx.poll();
    assert_eq!(host.bytes_allocated(), 0);
}
