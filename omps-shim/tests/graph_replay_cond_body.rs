//! Found in review (issue 23, finding 9): a memset captured into a conditional node's
//! body, over a block freed before the graph is instantiated, replayed over whoever got
//! the block next. The driver's graph walk cannot list a conditional node's bodies where
//! cuGraphNodeGetParams is missing (CUDA 13.0), which the host GPU plays here; the server
//! reads the bodies it made itself, and refuses the instantiation.

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
/// CUgraphConditionalNodeType IF; CU_GRAPH_COND_ASSIGN_DEFAULT.
const IF: u32 = 0;
const ASSIGN_DEFAULT: u32 = 1;

#[test]
fn a_freed_block_in_a_conditional_body_is_refused_at_instantiation() {
    let srv = start_as_client("cond-body-freed");
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
        // The block goes; the next allocation may be another client's at that address.
        ok(cuMemFree_v2(block));
        let mut exec = null_mut();
        assert_eq!(
            cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            CUDA_ERROR_INVALID_VALUE,
            "a graph whose body writes a freed block was instantiated"
        );
        ok(cuGraphDestroy(graph));
        ok(cuStreamDestroy_v2(body_stream));
        ok(cuStreamDestroy_v2(s));
    }
}
