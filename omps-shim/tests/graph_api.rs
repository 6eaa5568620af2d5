//! Stream capture and graphs through the shim's entry points, against a server on the
//! host GPU: captured work runs only when the graph is launched, as often as it is, and
//! the capture queries say what the server's stream is doing. A captured graph is a child
//! of a built graph and is cloned; the capture modes forbid what they forbid natively.

mod common;
use common::*;
use omps_shim::api::capture::*;
use omps_shim::api::exec::*;
use omps_shim::api::graph::*;
use omps_shim::api::graph_build::*;
use omps_shim::api::mem::*;
use omps_shim::api::stream_info::*;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::ptr::null_mut;

#[test]
fn capture_instantiate_launch() {
    let _srv = start_as_client("graphapi");
    // SAFETY: valid pointers throughout; the server runs in this process.
    unsafe {
        let f = host_function(c"fill_u32");
        let mut p = 0u64;
        ok(cuMemAlloc_v2(&mut p, 64));
        let fill = |s: CUstream, v: u32| {
            let (mut ptr, mut val, mut n) = (p, v, 16u32);
            let mut args = [
                &mut ptr as *mut _ as *mut c_void,
                &mut val as *mut _ as *mut c_void,
                &mut n as *mut _ as *mut c_void,
            ];
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
        };
        let read = || {
            let mut b = [0u32; 16];
            ok(cuMemcpyDtoH_v2(b.as_mut_ptr() as *mut c_void, p, 64));
            b[0]
        };
        let mut s = null_mut();
        ok(cuStreamCreate(&mut s, 1));
        fill(s, 1);
        ok(cuStreamSynchronize(s));

        let mut status = 9;
        ok(cuStreamIsCapturing(s, &mut status));
        assert_eq!(status, 0, "not capturing");
        ok(cuStreamBeginCapture_v2(s, 2));
        ok(cuStreamIsCapturing(s, &mut status));
        assert_eq!(status, 1, "capturing");
        let mut id = 0u64;
        ok(cuStreamGetCaptureInfo(s, &mut status, &mut id));
        assert!(id != 0);
        fill(s, 2);
        // Illegal during capture, natively too; the capture is then invalidated.
        assert_eq!(
            cuStreamSynchronize(s),
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        );
        let mut g = null_mut();
        assert_eq!(cuStreamEndCapture(s, &mut g), 901, "invalidated");

        ok(cuStreamBeginCapture_v2(s, 2));
        fill(s, 2);
        ok(cuStreamEndCapture(s, &mut g));
        assert_eq!(read(), 1, "captured work has not run");
        let mut n = 0usize;
        ok(cuGraphGetNodes(g, null_mut(), &mut n));
        assert_eq!(n, 1, "one kernel node");
        let mut nodes = [null_mut(); 3];
        n = 3;
        ok(cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut n));
        assert_eq!(n, 1);
        assert!(!nodes[0].is_null() && nodes[1].is_null());
        let mut ty = 9;
        ok(cuGraphNodeGetType(nodes[0], &mut ty));
        assert_eq!(ty, 0, "CU_GRAPH_NODE_TYPE_KERNEL");
        let mut e = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut e, g, 0));
        ok(cuGraphLaunch(e, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(), 2, "it runs at launch");
        fill(s, 3);
        ok(cuGraphLaunch(e, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(), 2, "and again, in stream order");
        ok(cuGraphExecDestroy(e));

        // The captured graph as a child node of a graph built by hand (the node holds the
        // server's copy, so the captured graph may go), and a clone of the captured graph.
        fill(s, 1);
        let mut built = null_mut();
        ok(cuGraphCreate(&mut built, 0));
        let mut child = null_mut();
        ok(cuGraphAddChildGraphNode(
            &mut child,
            built,
            std::ptr::null(),
            0,
            g,
        ));
        let mut ty = 9;
        ok(cuGraphNodeGetType(child, &mut ty));
        assert_eq!(ty, 4, "CU_GRAPH_NODE_TYPE_GRAPH");
        let mut copy = null_mut();
        ok(cuGraphClone(&mut copy, g));
        ok(cuGraphDestroy(g));
        let mut e = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut e, built, 0));
        ok(cuGraphLaunch(e, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(), 2, "the child ran");
        ok(cuGraphExecDestroy(e));
        ok(cuGraphDestroy(built));
        fill(s, 1);
        ok(cuGraphInstantiateWithFlags(&mut e, copy, 0));
        ok(cuGraphLaunch(e, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(), 2, "the clone ran");
        ok(cuGraphExecDestroy(e));
        ok(cuGraphDestroy(copy));
        assert_eq!(cuGraphLaunch(e, s), CUDA_ERROR_INVALID_HANDLE, "destroyed");

        // The capture modes: a global capture forbids cuMemAlloc to this thread and to
        // others (invalidating the capture), a thread-local one only to this thread, a
        // relaxed one to none; a thread in relaxed mode is never forbidden.
        let try_alloc = || {
            let mut p = 0u64;
            let r = cuMemAlloc_v2(&mut p, 64);
            if r == CUDA_SUCCESS {
                ok(cuMemFree_v2(p));
            }
            r
        };
        let mut ctx = null_mut();
        ok(omps_shim::api::ctx::cuCtxGetCurrent(&mut ctx));
        let ctx = ctx as usize;
        let elsewhere = || {
            std::thread::spawn(move || {
                ok(omps_shim::api::ctx::cuCtxSetCurrent(ctx as _));
                try_alloc()
            })
            .join()
            .unwrap()
        };
        let relaxed_elsewhere = || {
            std::thread::spawn(move || {
                ok(omps_shim::api::ctx::cuCtxSetCurrent(ctx as _));
                let mut m = 2u32;
                ok(cuThreadExchangeStreamCaptureMode(&mut m));
                try_alloc()
            })
            .join()
            .unwrap()
        };
        const UNSUPPORTED: CUresult = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        for (mode, here, other, other_relaxed) in [
            (0, UNSUPPORTED, UNSUPPORTED, CUDA_SUCCESS),
            (1, UNSUPPORTED, CUDA_SUCCESS, CUDA_SUCCESS),
            (2, CUDA_SUCCESS, CUDA_SUCCESS, CUDA_SUCCESS),
        ] {
            for (who, want) in [(0, here), (1, other), (2, other_relaxed)] {
                ok(cuStreamBeginCapture_v2(s, mode));
                fill(s, 4);
                let r = match who {
                    0 => try_alloc(),
                    1 => elsewhere(),
                    _ => relaxed_elsewhere(),
                };
                assert_eq!(r, want, "mode {mode}, caller {who}");
                let mut g = null_mut();
                let end = cuStreamEndCapture(s, &mut g);
                if want == CUDA_SUCCESS {
                    ok(end);
                    ok(cuGraphDestroy(g));
                } else {
                    assert_eq!(end, 901, "mode {mode}, caller {who}: invalidated");
                }
            }
        }
        // The invalidated capture, until it ends, still forbids unsafe calls, and a launch
        // into it fails at once (as natively: tests/cuda/rt/capture_modes.cu); once it
        // ends nothing of it is left to report.
        let before = read();
        ok(cuStreamBeginCapture_v2(s, 0));
        fill(s, 5);
        assert_eq!(try_alloc(), UNSUPPORTED, "the first unsafe call is refused");
        let mut status = 9;
        ok(cuStreamIsCapturing(s, &mut status));
        assert_eq!(status, 2, "invalidated, not ended");
        assert_eq!(try_alloc(), UNSUPPORTED, "and the next");
        assert_eq!(elsewhere(), UNSUPPORTED, "and another thread's");
        assert_eq!(omps_shim::api::ctx::cuCtxSynchronize(), UNSUPPORTED);
        assert_eq!(
            try_fill_kernel(p, 6, 16, s),
            901,
            "a launch into it fails at once"
        );
        let mut g = null_mut();
        assert_eq!(cuStreamEndCapture(s, &mut g), 901);
        ok(omps_shim::api::ctx::cuCtxSynchronize());
        assert_eq!(read(), before, "nothing captured ran");
        ok(cuStreamDestroy_v2(s));
    }
}
