//! Launch runs (session/kinds/launch_run.rs) through real records: launches gathered in a
//! client's turn reach the GPU as runs, in order, after what came before them and before
//! any other record; a shape the driver has not taken alone goes alone; a GPU that does not
//! take runs gets each launch alone. Here with the fuzz body's client because it sends
//! records as the shim does.

use super::client::Client;
use crate::gpu::host::HostGpu;
use crate::gpu::Gpu;
use crate::worker::WorkerCtx;
use omps_ring::wire::{self, Op};
use std::sync::Arc;

/// fill_u32(p, value, 1) on `stream` with `grid`, handed to the session within its turn.
fn fill(me: &mut Client, ctx: &mut WorkerCtx, func: u32, stream: u32, grid: u32, p: u64, v: u32) {
    let l = wire::Launch {
        func,
        stream,
        grid: [grid, 1, 1],
        block: [1; 3],
        args_len: 16,
        ..Default::default()
    };
    let mut args = p.to_le_bytes().to_vec();
    args.extend_from_slice(&v.to_le_bytes());
    args.extend_from_slice(&1u32.to_le_bytes());
    let rec = [bytemuck::bytes_of(&l), &args[..]].concat();
    assert!(me.s.handle(ctx, Op::Launch as u32, &rec).is_ok());
}

fn word(host: &HostGpu, p: u64) -> u32 {
    u32::from_le_bytes(host.peek(p, 4).expect("mapped").try_into().unwrap())
}

#[test]
fn launches_go_as_runs_in_order_and_before_other_records() {
    let host = Arc::new(HostGpu::new(0, 1 << 26));
    host.take_runs(true);
    let gpu: Arc<dyn Gpu> = host.clone();
    let mut ctx = WorkerCtx::new(gpu.clone()).unwrap();
    let mut me = Client::new(&gpu, 1);
    let (_, funcs) = me.load(&mut ctx).expect("load");
    let f = funcs[0];
    let p = me.alloc(&mut ctx, 64).expect("alloc");
    let base = host.launches();

    // The first launch of a shape goes alone; it is proven then.
    fill(&mut me, &mut ctx, f, 0, 1, p, 0);
    assert_eq!(host.launches(), base + 1, "an unproven shape is not held");
    // 40 more in one turn: 32 go as one run when full, 8 wait for the end of the turn.
    for v in 1..=40 {
        fill(&mut me, &mut ctx, f, 0, 1, p, v);
    }
    assert_eq!((host.runs(), host.launches()), (1, base + 33));
    assert_eq!(word(&host, p), 32, "the full run went, in order");
    me.s.flush_run(&mut ctx);
    assert_eq!((host.runs(), host.launches()), (2, base + 41));
    assert_eq!(word(&host, p), 40, "the last launch ran last");

    // Gathered launches go before any other record: a memset after them wins.
    for v in 41..46 {
        fill(&mut me, &mut ctx, f, 0, 1, p, v);
    }
    let m = wire::Memset {
        dst: p,
        count: 1,
        value: 999,
        elem_size: 4,
        stream: 0,
        _pad: 0,
    };
    let rec = bytemuck::bytes_of(&m).to_vec();
    assert!(me.s.handle(&mut ctx, Op::Memset as u32, &rec).is_ok());
    assert_eq!(word(&host, p), 999);
    assert_eq!(host.runs(), 3, "5 launches: a run of 4 and one alone");

    // Another shape goes alone the first time, and takes the run before it with it.
    fill(&mut me, &mut ctx, f, 0, 1, p, 50);
    fill(&mut me, &mut ctx, f, 0, 2, p, 51);
    assert_eq!(
        word(&host, p),
        51,
        "the gathered launch went before the new shape"
    );

    // A GPU that does not take runs gets each launch alone, in order.
    host.take_runs(false);
    let (runs, launches) = (host.runs(), host.launches());
    for v in 60..70 {
        fill(&mut me, &mut ctx, f, 0, 1, p, v);
    }
    me.s.flush_run(&mut ctx);
    assert_eq!((host.runs(), host.launches()), (runs, launches + 10));
    assert_eq!(word(&host, p), 69);
    ctx.retire(me.s);
    ctx.poll();
}
