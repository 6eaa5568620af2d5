//! A memset captured into a conditional node's body, over a block freed before the graph
//! is instantiated, must not replay over whoever got the block next (issue 23, finding 9,
//! and the third review of the server core). The driver's graph walk cannot list a
//! conditional node's bodies where cuGraphNodeGetParams is missing (CUDA 13.0), which the
//! host GPU plays here; the server reads the bodies it made itself, and a copy of the
//! graph (cuGraphClone, GRAPH_CLONE) or a built graph taking it as a child (the shim
//! copies it, CHILD_NODE) inherits them, so each is refused at instantiation.

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

/// A block of the client's and a captured graph whose one IF node's body memsets it.
///
/// # Safety
/// Called on a thread whose client is connected (`start_as_client`).
unsafe fn graph_with_body_over_block() -> (u64, CUgraph) {
    // SAFETY: every pointer passed is a valid local or a handle made here.
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
        ok(cuStreamDestroy_v2(body_stream));
        ok(cuStreamDestroy_v2(s));
        (block, graph)
    }
}

/// Instantiating `graph` must be refused.
///
/// # Safety
/// `graph` is a live graph of the connected client.
unsafe fn refused(graph: CUgraph, what: &str) {
    let mut exec = null_mut();
    // SAFETY: `exec` is a valid local; `graph` is live (the caller's promise).
    let r = unsafe { cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
    assert_eq!(r, CUDA_ERROR_INVALID_VALUE, "{what} was instantiated");
}

/// The shim connects once per process, so the three ways run in one test, one server.
#[test]
fn a_graph_or_a_copy_whose_conditional_body_writes_a_freed_block_is_refused() {
    let srv = start_as_client("cond-body-freed");
    srv.gpu.hide_conditional_bodies(true);
    // SAFETY (whole test): every pointer passed is a valid local or a handle made here.
    unsafe {
        // The graph itself: the block goes, and the next allocation may be another
        // client's at that address.
        let (block, graph) = graph_with_body_over_block();
        ok(cuMemFree_v2(block));
        refused(graph, "a graph whose body writes a freed block");
        ok(cuGraphDestroy(graph));

        // A copy, made while the block is still the client's.
        let (block, graph) = graph_with_body_over_block();
        let mut copy = null_mut();
        ok(cuGraphClone(&mut copy, graph));
        ok(cuMemFree_v2(block));
        refused(graph, "the original");
        refused(copy, "a copy of a graph whose body writes a freed block");

        // A built graph with the captured one as its child, made while the block is the
        // client's; the captured graph itself then goes (its copy stays the child's).
        let (block, graph) = graph_with_body_over_block();
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
        refused(parent, "a graph whose child's body writes a freed block");
    }
}
