//! Review (issue 23, fresh review of the server core): a conditional node's bodies are
//! read from the bodies the server made for a graph's *own* id (CondState::bodies_of),
//! so a copy of that graph (cuGraphClone, the server's GRAPH_CLONE) or a capture that
//! takes it as a child node (CHILD_NODE) has bodies the server does not know. Where the
//! driver cannot list them (CUDA 13.0: no cuGraphNodeGetParams, played by the host GPU),
//! the copy is instantiated over a block freed since, and its replay writes whoever has
//! the block next.

mod common;
use common::*;
use omps_shim::api::capture::*;
use omps_shim::api::exec::*;
use omps_shim::api::graph::*;
use omps_shim::api::graph_build::*;
use omps_shim::api::mem::*;
use omps_shim::cuda::*;
use std::ptr::{null, null_mut};

const WORDS: usize = 4;
const IF: u32 = 0;
const ASSIGN_DEFAULT: u32 = 1;

#[test]
fn a_clone_of_a_graph_whose_body_writes_a_freed_block_is_refused() {
    let srv = start_as_client("cond-body-clone");
    srv.gpu.hide_conditional_bodies(true);
    // SAFETY (whole test): every pointer passed is a valid local or a handle made here.
    unsafe {
        let mut block = 0u64;
        ok(cuMemAlloc_v2(&mut block, 4 * WORDS));
        let (mut s, mut body_stream) = (null_mut(), null_mut());
        ok(cuStreamCreate(&mut s, 1));
        ok(cuStreamCreate(&mut body_stream, 1));
        ok(cuStreamBeginCapture_v2(s, 2));
        let (_, cg) = capture_graph_of(s);
        let mut handle = 0u64;
        ok(cuGraphConditionalHandleCreate(
            &mut handle,
            cg,
            null_mut(),
            1,
            ASSIGN_DEFAULT,
        ));
        let mut np: NodeParams = std::mem::zeroed();
        np.ty = 13;
        let cp = np.params.as_mut_ptr() as *mut CondParams;
        (*cp).handle = handle;
        (*cp).ty = IF;
        (*cp).size = 1;
        let mut cnode = null_mut();
        ok(cuGraphAddNode(&mut cnode, cg, null(), 0, &mut np));
        let body = *(*cp).graph_out;
        ok(cuStreamUpdateCaptureDependencies(s, &cnode, 1, 1));
        ok(cuStreamBeginCaptureToGraph(
            body_stream,
            body,
            null(),
            null(),
            0,
            2,
        ));
        ok(cuMemsetD32Async(block, 5, WORDS, body_stream));
        let mut ended = null_mut();
        ok(cuStreamEndCapture(body_stream, &mut ended));
        let mut graph = null_mut();
        ok(cuStreamEndCapture(s, &mut graph));
        // A copy, made while the block is still the client's.
        let mut copy = null_mut();
        ok(cuGraphClone(&mut copy, graph));
        // The block goes; the next allocation may be another client's at that address.
        ok(cuMemFree_v2(block));
        let mut exec = null_mut();
        assert_eq!(
            cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            CUDA_ERROR_INVALID_VALUE,
            "the original is refused (as graph_replay_cond_body.rs)"
        );
        let r = cuGraphInstantiateWithFlags(&mut exec, copy, 0);
        assert_eq!(
            r, CUDA_ERROR_INVALID_VALUE,
            "a copy of a graph whose body writes a freed block was instantiated"
        );
    }
}
