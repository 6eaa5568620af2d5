//! Memory opened from another client's IPC handle, which an executable graph's memset
//! writes, stays opened past the handle's close until the graph goes (issue 23, finding
//! 9): closed, the exporter's free would let the driver give the memory to the next
//! allocation, another client's perhaps, under the replay. Its own test binary: the shim
//! connects once per process.

mod common;
use common::*;
use omps_shim::api::ctx::cuCtxSynchronize;
use omps_shim::api::exec::*;
use omps_shim::api::graph::*;
use omps_shim::api::ipc::*;
use omps_shim::conn::Conn;
use std::time::Duration;

#[test]
fn an_opening_a_live_graph_writes_stays_past_its_close_and_the_owners_free() {
    let srv = start_as_client("graph-held-ipc");
    // The exporter, another client: 4 KiB, exported.
    let exporter = Conn::connect_to(&srv.socket()).unwrap();
    let p = alloc_on(&exporter, 0, 4096);
    let h = export_mem_handle(&exporter, 0, p);
    // SAFETY (whole block): valid out-pointers; handles made here.
    unsafe {
        let mut q = 0u64;
        ok(cuIpcOpenMemHandle_v2(
            &mut q,
            CUipcMemHandle { reserved: h.bytes },
            1,
        ));
        assert_eq!(q, p);
        let (s, e) = memset_graph(q, 9);

        // Closed, and freed by its owner, while the executable graph lives: the memory
        // stays where the graph's memset writes.
        ok(cuIpcCloseMemHandle(q));
        // Opened and closed again and again while the graph lives: one opening is held,
        // the others go back (the server keeps one entry, not one per close).
        let handle = CUipcMemHandle { reserved: h.bytes };
        for _ in 0..200 {
            let mut again = 0u64;
            ok(cuIpcOpenMemHandle_v2(&mut again, handle, 1));
            ok(cuIpcCloseMemHandle(again));
        }
        free_on(&exporter, 0, p);
        exporter.ping(0).unwrap();
        ok(cuCtxSynchronize());
        std::thread::sleep(Duration::from_millis(200));
        assert!(srv.gpu.peek(p, 64).is_some(), "held for the graph");
        replay_writes(&srv.gpu, e, s, p, 9);

        // The graph goes: the opening closes, and the owner's free goes through.
        ok(cuGraphExecDestroy(e));
        ok(cuCtxSynchronize());
        assert!(
            eventually(|| srv.gpu.peek(p, 64).is_none()),
            "freed once no graph uses it"
        );
        ok(cuStreamDestroy_v2(s));
    }
    drop(exporter);
}
