//! A module unloaded while the client holds graphs stays loaded until they go (issue 23,
//! finding 9): unloaded, the driver would give a global's memory that a graph's memset
//! writes to the next allocation, another client's perhaps, and a kernel node would name
//! a function of a module gone. Its own test binary: the shim connects once per process.

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
fn a_module_whose_global_a_live_graph_writes_stays_loaded_past_its_unload() {
    use omps_shim::api::module::*;
    let srv = start_as_client("graph-held-module");
    let image = b"omps-host-module\nglobal table 64\n\0";
    // SAFETY (whole test): valid out-pointers; handles made here.
    unsafe {
        let before = srv.gpu.modules_loaded();
        let mut m = null_mut();
        ok(cuModuleLoadData(&mut m, image.as_ptr().cast()));
        let (mut g, mut size) = (0u64, 0usize);
        ok(cuModuleGetGlobal_v2(
            &mut g,
            &mut size,
            m,
            c"table".as_ptr(),
        ));
        let (s, e) = memset_graph(g, 7);

        // Unloaded while the executable graph lives: the client can no longer name the
        // global, but the module stays loaded where the graph's memset writes.
        ok(cuModuleUnload(m));
        ok(cuCtxSynchronize());
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(srv.gpu.modules_loaded(), before + 1, "held for the graph");
        // Not the client's to name any more: refused at once, or at the next sync.
        let r = cuMemsetD32_v2(g, 1, 16);
        let r = if r == CUDA_SUCCESS {
            cuCtxSynchronize()
        } else {
            r
        };
        assert_eq!(
            r, CUDA_ERROR_INVALID_VALUE,
            "a memset of an unloaded global"
        );
        let words = srv.gpu.peek(g, 64).expect("held");
        assert!(
            !words.chunks(4).any(|w| w == 1u32.to_le_bytes()),
            "not written"
        );
        replay_writes(&srv.gpu, e, s, g, 7);

        // The graph goes: so does the module.
        ok(cuGraphExecDestroy(e));
        ok(cuCtxSynchronize());
        assert!(
            eventually(|| srv.gpu.modules_loaded() == before),
            "unloaded once no graph uses it"
        );

        // A graph whose one node is a kernel of a module: the server does not read which
        // module a kernel node names, so an unload waits for every graph of the client.
        let image = b"omps-host-module\nfn fill_u32 0:8 8:4 12:4\n\0";
        let mut m = null_mut();
        ok(cuModuleLoadData(&mut m, image.as_ptr().cast()));
        let mut f = null_mut();
        ok(cuModuleGetFunction(&mut f, m, c"fill_u32".as_ptr()));
        let mut out = 0u64;
        ok(cuMemAlloc_v2(&mut out, 64));
        let (mut ptr, mut val, mut n) = (out, 3u32, 16u32);
        let mut args = [
            &mut ptr as *mut _ as *mut std::ffi::c_void,
            &mut val as *mut _ as *mut std::ffi::c_void,
            &mut n as *mut _ as *mut std::ffi::c_void,
        ];
        ok(cuStreamBeginCapture_v2(s, 2));
        ok(cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            s,
            args.as_mut_ptr(),
            null_mut(),
        ));
        let mut graph = null_mut();
        ok(cuStreamEndCapture(s, &mut graph));
        ok(cuModuleUnload(m));
        ok(cuCtxSynchronize());
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            srv.gpu.modules_loaded(),
            before + 1,
            "held while a graph lives, even one not yet instantiated"
        );
        let mut e = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut e, graph, 0));
        ok(cuGraphDestroy(graph));
        replay_writes(&srv.gpu, e, s, out, 3);
        ok(cuGraphExecDestroy(e));
        ok(cuCtxSynchronize());
        assert!(
            eventually(|| srv.gpu.modules_loaded() == before),
            "unloaded once the client holds no graph"
        );
        ok(cuStreamDestroy_v2(s));
    }
}
