//! A block an executable graph's memset writes, freed while the graph lives, stays the
//! client's until the graph goes (issue 23, finding 9): the driver must not hand its
//! address to another client's allocation while a replay can still write it; and a
//! graph over a block freed before it was instantiated is not instantiated.

mod common;
use common::*;
use omps_shim::api::capture::*;
use omps_shim::api::ctx::cuCtxSynchronize;
use omps_shim::api::exec::*;
use omps_shim::api::graph::*;
use omps_shim::api::mem::*;
use omps_shim::cuda::*;
use std::ptr::null_mut;
use std::time::Duration;

#[test]
fn a_block_a_live_graph_writes_is_held_past_its_free() {
    let srv = start_as_client("graph-held");
    // SAFETY (whole test): valid out-pointers; handles made here.
    unsafe {
        let mut p = 0u64;
        ok(cuMemAlloc_v2(&mut p, 64));
        let (s, e) = memset_graph(p, 5);

        // Freed while the executable graph lives: the client can no longer name it, but
        // the memory stays where the graph's memset writes.
        ok(cuMemFree_v2(p));
        ok(cuCtxSynchronize());
        std::thread::sleep(Duration::from_millis(200));
        assert!(srv.gpu.peek(p, 64).is_some(), "held for the graph");
        assert_eq!(
            cuMemsetD32_v2(p, 1, 16),
            CUDA_ERROR_INVALID_VALUE,
            "not the client's to name any more"
        );
        replay_writes(&srv.gpu, e, s, p, 5);

        // The graph goes: so does the block.
        ok(cuGraphExecDestroy(e));
        ok(cuCtxSynchronize());
        assert!(
            eventually(|| srv.gpu.peek(p, 64).is_none()),
            "released once no graph uses it"
        );

        // Freed between the capture and the instantiation: no executable graph held it, so
        // the graph would write whoever has the block now; instantiating it is refused.
        let mut q = 0u64;
        ok(cuMemAlloc_v2(&mut q, 64));
        ok(cuStreamBeginCapture_v2(s, 2));
        ok(cuMemsetD32Async(q, 6, 16, s));
        let mut g2 = null_mut();
        ok(cuStreamEndCapture(s, &mut g2));
        ok(cuMemFree_v2(q));
        let mut e2 = null_mut();
        assert_eq!(
            cuGraphInstantiateWithFlags(&mut e2, g2, 0),
            CUDA_ERROR_INVALID_VALUE,
            "a graph over memory the client freed"
        );
        ok(cuGraphDestroy(g2));
        ok(cuStreamDestroy_v2(s));
    }
}
