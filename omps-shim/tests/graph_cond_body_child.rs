//! A conditional node's bodies, copied with their graph into a child node (the shim
//! copies a captured graph it takes as a child, GRAPH_CLONE, and issues the copy into the
//! capture it instantiates by, CHILD_NODE): the bodies are the copy's, which the server
//! does not know by id, and where the driver cannot list them (CUDA 13.0, played by the
//! host GPU) they must still be checked (issue 23, review of the server core).

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

/// A built graph that takes the captured graph as a child
/// holds a copy of its bodies (the shim copies the graph, GRAPH_CLONE, and issues it with
/// CHILD_NODE into the capture it instantiates by), so its instantiation after the block
/// is freed is refused, though the graph it copied is gone by then.
#[test]
fn a_built_graph_whose_child_has_a_body_writing_a_freed_block_is_refused() {
    let srv = start_as_client("cond-body-child");
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
        // A built graph with the captured one as its child, made while the block is the
        // client's; the captured graph itself then goes (its copy stays the child's).
        let mut parent = null_mut();
        ok(cuGraphCreate(&mut parent, 0));
        let mut child = null_mut();
        ok(cuGraphAddChildGraphNode(
            &mut child,
            parent,
            null(),
            0,
            graph,
        ));
        ok(cuGraphDestroy(graph));
        ok(cuMemFree_v2(block));
        let mut exec = null_mut();
        let r = cuGraphInstantiateWithFlags(&mut exec, parent, 0);
        assert_eq!(
            r, CUDA_ERROR_INVALID_VALUE,
            "a graph whose child's body writes a freed block was instantiated"
        );
    }
}
