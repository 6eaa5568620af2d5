//! Conditional nodes of graphs built by hand, on the host GPU: handles made by the graph
//! (one with a default value), an IF node with an else body, a WHILE node whose body
//! clears its own condition, and an IF node driven by its handle's default. The
//! executable graph takes new parameters (of a node of the graph and of one inside a
//! body), so the server graph the handles belong to is captured into again and the
//! executable graph updated; a second instantiation is
//! refused, as the driver refuses it. Handles of another graph,
//! bodies the node type does not take, and handles of a graph the server captured are
//! refused; a destroyed graph's bodies go with it. A conditional node is also added to a
//! capture going on, its body captured into with cuStreamBeginCaptureToGraph.

mod common;
use common::*;
use omps_ring::wire::{self, graph as wg};
use omps_shim::api::capture::*;
use omps_shim::api::exec::*;
use omps_shim::api::graph::*;
use omps_shim::api::graph_build::*;
use omps_shim::api::mem::*;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

const WORDS: usize = 4;
/// CUgraphConditionalNodeType.
const IF: u32 = 0;
const WHILE: u32 = 1;
const SWITCH: u32 = 2;

fn read(p: u64) -> Vec<u32> {
    let mut v = vec![0u32; WORDS];
    // SAFETY: v holds WORDS words.
    ok(unsafe { cuMemcpyDtoH_v2(v.as_mut_ptr() as *mut c_void, p, 4 * WORDS) });
    v
}

/// A kernel node of `f` after `dep` in `g`; `args` holds pointers to its arguments.
///
/// # Safety
/// `args` matches `f`'s parameters and lives for the call.
unsafe fn kernel(
    g: CUgraph,
    dep: Option<GraphNodeRef>,
    f: CUfunction,
    args: &mut [*mut c_void],
) -> GraphNodeRef {
    let p = KernelNodeParams {
        func: f,
        grid: [1; 3],
        block: [1; 3],
        shared: 0,
        kernel_params: args.as_mut_ptr(),
        extra: null_mut(),
    };
    let mut n = null_mut();
    let deps = dep.map_or(null(), |d| &d as *const GraphNodeRef);
    // SAFETY: forwarded contract.
    ok(unsafe { cuGraphAddKernelNode(&mut n, g, deps, dep.is_some() as usize, &p) });
    n
}

/// Adds a conditional node after `dep`: its handle and the bodies (`Err`: the result).
fn conditional(
    g: CUgraph,
    dep: GraphNodeRef,
    handle: u64,
    ty: u32,
    size: u32,
) -> Result<(GraphNodeRef, Vec<CUgraph>), CUresult> {
    // SAFETY: zeroed CUgraphNodeParams is valid; the conditional member is written below.
    let mut p: NodeParams = unsafe { std::mem::zeroed() };
    p.ty = 13;
    let c = p.params.as_mut_ptr() as *mut CondParams;
    // SAFETY: the union's start, which the conditional member takes.
    unsafe {
        (*c).handle = handle;
        (*c).ty = ty;
        (*c).size = size;
    }
    let mut n = null_mut();
    // SAFETY: valid pointers; one dependency.
    let r = unsafe { cuGraphAddNode(&mut n, g, &dep, 1, &mut p) };
    if r != CUDA_SUCCESS {
        return Err(r);
    }
    // SAFETY: the node's body array, `size` graphs, alive with the node.
    let bodies = unsafe { std::slice::from_raw_parts((*c).graph_out, size as usize) }.to_vec();
    Ok((n, bodies))
}

#[test]
fn conditional_nodes_choose_and_repeat() {
    let srv = start_as_client("conditional");
    let fill = host_function(c"fill_u32");
    let set = host_function(c"set_cond");
    // SAFETY (whole test): every pointer passed is a valid local or a handle made here.
    unsafe {
        let (mut a, mut w, mut d) = (0u64, 0u64, 0u64);
        for p in [&mut a, &mut w, &mut d] {
            ok(cuMemAlloc_v2(p, 4 * WORDS));
            ok(cuMemsetD32_v2(*p, 0, WORDS));
        }
        let mut s = null_mut();
        ok(cuStreamCreate(&mut s, 1));
        let mut g = null_mut();
        ok(cuGraphCreate(&mut g, 0));
        let (mut hif, mut hwhile, mut hdef) = (0u64, 0u64, 0u64);
        ok(cuGraphConditionalHandleCreate(
            &mut hif,
            g,
            null_mut(),
            0,
            0,
        ));
        ok(cuGraphConditionalHandleCreate(
            &mut hwhile,
            g,
            null_mut(),
            0,
            0,
        ));
        ok(cuGraphConditionalHandleCreate(
            &mut hdef,
            g,
            null_mut(),
            1,
            1,
        ));
        assert_eq!(
            cuGraphConditionalHandleCreate(&mut hdef, g, null_mut(), 1, 2),
            CUDA_ERROR_INVALID_VALUE,
            "unknown flags"
        );

        // prep: hif = flag, hwhile = 1.
        let mut flag = 1u32;
        let mut one = 1u32;
        let mut zero = 0u32;
        let prep_if = kernel(g, None, set, &mut [ptr(&mut hif), ptr(&mut flag)]);
        let prep = kernel(
            g,
            Some(prep_if),
            set,
            &mut [ptr(&mut hwhile), ptr(&mut one)],
        );

        // IF flag: a = 1, else a = 2.
        let (nif, ifb) = conditional(g, prep, hif, IF, 2).expect("IF with else");
        let n = WORDS as u32;
        let (mut v1, mut v2, mut v3, mut v4) = (1u32, 2u32, 3u32, 4u32);
        let mut nn = n;
        kernel(
            ifb[0],
            None,
            fill,
            &mut [ptr(&mut a), ptr(&mut v1), ptr(&mut nn)],
        );
        kernel(
            ifb[1],
            None,
            fill,
            &mut [ptr(&mut a), ptr(&mut v2), ptr(&mut nn)],
        );
        // WHILE hwhile: w = 3, then hwhile = 0 (one turn).
        let (nwhile, wb) = conditional(g, nif, hwhile, WHILE, 1).expect("WHILE");
        let body_fill = kernel(
            wb[0],
            None,
            fill,
            &mut [ptr(&mut w), ptr(&mut v3), ptr(&mut nn)],
        );
        kernel(
            wb[0],
            Some(body_fill),
            set,
            &mut [ptr(&mut hwhile), ptr(&mut zero)],
        );
        // IF on a handle whose default is 1: d = 4.
        let (_, db) = conditional(g, nwhile, hdef, IF, 1).expect("IF by default");
        kernel(
            db[0],
            None,
            fill,
            &mut [ptr(&mut d), ptr(&mut v4), ptr(&mut nn)],
        );

        let mut ty = 0u32;
        ok(cuGraphNodeGetType(nif, &mut ty));
        assert_eq!(ty, 13, "a conditional node");
        assert_eq!(
            conditional(g, nwhile, hif, IF, 3).map(drop),
            Err(CUDA_ERROR_INVALID_VALUE),
            "an IF node has one or two bodies"
        );
        assert_eq!(
            conditional(g, nwhile, hif, WHILE, 2).map(drop),
            Err(CUDA_ERROR_INVALID_VALUE),
            "a WHILE node has one body"
        );
        let mut other = null_mut();
        ok(cuGraphCreate(&mut other, 0));
        let mut root = null_mut();
        ok(cuGraphAddEmptyNode(&mut root, other, null(), 0));
        assert_eq!(
            conditional(other, root, hif, SWITCH, 2).map(drop),
            Err(CUDA_ERROR_INVALID_VALUE),
            "a handle of another graph"
        );

        let mut e = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut e, g, 0));
        ok(cuGraphLaunch(e, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(a), vec![1; WORDS], "the IF body ran");
        assert_eq!(read(w), vec![3; WORDS], "the WHILE body ran");
        assert_eq!(read(d), vec![4; WORDS], "the default handle's body ran");

        // The else body, after the executable graph is made again from a new parameter.
        flag = 0;
        let mut args = [ptr(&mut hif), ptr(&mut flag)];
        let p = KernelNodeParams {
            func: set,
            grid: [1; 3],
            block: [1; 3],
            shared: 0,
            kernel_params: args.as_mut_ptr(),
            extra: null_mut(),
        };
        ok(cuGraphExecKernelNodeSetParams(e, prep_if, &p));
        ok(cuMemsetD32_v2(w, 0, WORDS));
        ok(cuGraphLaunch(e, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(a), vec![2; WORDS], "the else body ran");
        assert_eq!(read(w), vec![3; WORDS], "the WHILE body ran again");

        // A node inside a body takes new parameters in the executable graph: the IF body
        // writes 7 (with the IF condition set again).
        let mut flag_on = 1u32;
        let mut on_args = [ptr(&mut hif), ptr(&mut flag_on)];
        let on = KernelNodeParams {
            kernel_params: on_args.as_mut_ptr(),
            ..p
        };
        ok(cuGraphExecKernelNodeSetParams(e, prep_if, &on));
        let mut body_nodes = [null_mut(); 1];
        let mut count = 1usize;
        ok(cuGraphGetNodes(ifb[0], body_nodes.as_mut_ptr(), &mut count));
        let mut seven = 7u32;
        let mut fargs = [ptr(&mut a), ptr(&mut seven), ptr(&mut nn)];
        let fp = KernelNodeParams {
            func: fill,
            grid: [1; 3],
            block: [1; 3],
            shared: 0,
            kernel_params: fargs.as_mut_ptr(),
            extra: null_mut(),
        };
        ok(cuGraphExecKernelNodeSetParams(e, body_nodes[0], &fp));
        ok(cuGraphLaunch(e, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(a), vec![7; WORDS], "the changed IF body ran");

        // The driver makes one executable graph of a graph with conditional nodes.
        let mut e2 = null_mut();
        assert_eq!(
            cuGraphInstantiateWithFlags(&mut e2, g, 0),
            CUDA_ERROR_NOT_SUPPORTED,
            "a second instantiation"
        );

        // Handles of a graph the server captured are not made.
        ok(cuStreamBeginCapture_v2(s, 2));
        let mut captured = null_mut();
        ok(cuStreamEndCapture(s, &mut captured));
        let mut h = 0u64;
        assert_eq!(
            cuGraphConditionalHandleCreate(&mut h, captured, null_mut(), 0, 0),
            CUDA_ERROR_NOT_SUPPORTED
        );

        // Another client names this one's handle and graphs: refused, and it goes on.
        let other_client = omps_shim::conn::Conn::connect_to(&srv.socket()).unwrap();
        for (kind, graph) in [
            (wg::COND_NODE, 0),
            (wg::COND_HANDLE, 1),
            (wg::CAPTURE_TO, 1),
            (wg::COND_CLEAR, 1),
            (wg::COND_HANDLE, 0),
        ] {
            let mut ch = other_client.channel();
            let r = ch.call(0, wire::Op::GraphCond, |call| {
                bytemuck::bytes_of(&wire::GraphCond {
                    call,
                    kind,
                    graph,
                    handle: hif,
                    size: 1,
                    ..Default::default()
                })
                .to_vec()
            });
            assert_eq!(r, Err(CUDA_ERROR_INVALID_VALUE), "kind {kind}");
        }
        assert!(alloc(&other_client, 64) != 0);

        // A stream capturing into a home graph is destroyed: the capture ends and the home,
        // which the client still holds, stays (it was thrown away as a capture's graph).
        let call = |kind: u32, stream: u32, graph: u32| -> Result<u64, CUresult> {
            let mut ch = other_client.channel();
            ch.call(0, wire::Op::GraphCond, |call| {
                bytemuck::bytes_of(&wire::GraphCond {
                    call,
                    kind,
                    stream,
                    graph,
                    ..Default::default()
                })
                .to_vec()
            })?;
            Ok(ch.reply::<wire::U64Reply>().value)
        };
        let home = call(wg::COND_HOME, 0, 0).expect("a home") as u32;
        let sc = wire::StreamCreate {
            id: 9,
            flags: 1,
            ..Default::default()
        };
        other_client
            .push(0, wire::Op::StreamCreate, &[bytemuck::bytes_of(&sc)])
            .unwrap();
        let mut ch = other_client.channel();
        ch.call(0, wire::Op::GraphCond, |call| {
            bytemuck::bytes_of(&wire::GraphCond {
                call,
                kind: wg::CAPTURE_TO,
                stream: 9,
                graph: home,
                ..Default::default()
            })
            .to_vec()
        })
        .expect("a capture into the home");
        drop(ch);
        let h = wire::Handle { id: 9, _pad: 0 };
        other_client
            .push(0, wire::Op::StreamDestroy, &[bytemuck::bytes_of(&h)])
            .unwrap();
        assert!(
            call(wg::COND_HANDLE, 0, home).is_ok(),
            "the home outlives the capture into it"
        );
        let h = wire::Handle { id: home, _pad: 0 };
        other_client
            .push(0, wire::Op::GraphDestroy, &[bytemuck::bytes_of(&h)])
            .unwrap();
        assert_eq!(
            call(wg::COND_HANDLE, 0, home),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert!(alloc(&other_client, 64) != 0);

        // A capture that made a conditional node fails, or its stream goes while another
        // captures into the node's body: the body's id dies with the capture's graph.
        let capture_call = |op: wire::Op, stream: u32| -> Result<(), CUresult> {
            other_client.channel().call(0, op, |call| {
                bytemuck::bytes_of(&wire::CaptureCall {
                    call,
                    stream,
                    mode: 2,
                })
                .to_vec()
            })
        };
        for (s1, s2) in [(21, 22), (23, 24)] {
            for id in [s1, s2] {
                let sc = wire::StreamCreate {
                    id,
                    flags: 1,
                    ..Default::default()
                };
                other_client
                    .push(0, wire::Op::StreamCreate, &[bytemuck::bytes_of(&sc)])
                    .unwrap();
            }
            capture_call(wire::Op::CaptureBegin, s1).unwrap();
            let mut ch = other_client.channel();
            ch.call(0, wire::Op::GraphCond, |call| {
                bytemuck::bytes_of(&wire::GraphCond {
                    call,
                    kind: wg::COND_HANDLE_CAPTURE,
                    stream: s1,
                    ..Default::default()
                })
                .to_vec()
            })
            .unwrap();
            let handle = ch.reply::<wire::U64Reply>().value;
            ch.call(0, wire::Op::GraphCond, |call| {
                bytemuck::bytes_of(&wire::GraphCond {
                    call,
                    kind: wg::COND_NODE,
                    stream: s1,
                    handle,
                    size: 1,
                    ..Default::default()
                })
                .to_vec()
            })
            .unwrap();
            let body = ch.reply::<wire::U64Reply>().value as u32;
            drop(ch);
            let capture_into = |stream: u32| -> Result<(), CUresult> {
                other_client.channel().call(0, wire::Op::GraphCond, |call| {
                    bytemuck::bytes_of(&wire::GraphCond {
                        call,
                        kind: wg::CAPTURE_TO,
                        stream,
                        graph: body,
                        ..Default::default()
                    })
                    .to_vec()
                })
            };
            if s1 == 21 {
                // Invalidated (a query of the capturing stream), then ended: it fails.
                let q = other_client
                    .channel()
                    .call(0, wire::Op::StreamQuery, |call| {
                        bytemuck::bytes_of(&wire::HandleCall {
                            call,
                            id: s1,
                            _pad: 0,
                        })
                        .to_vec()
                    });
                assert!(q.is_err());
                assert!(capture_call(wire::Op::CaptureEnd, s1).is_err());
            } else {
                capture_into(s2).expect("a capture into the body");
                let h = wire::Handle { id: s1, _pad: 0 };
                other_client
                    .push(0, wire::Op::StreamDestroy, &[bytemuck::bytes_of(&h)])
                    .unwrap();
            }
            assert_eq!(
                capture_into(s2),
                Err(CUDA_ERROR_INVALID_VALUE),
                "a body of a graph that is gone"
            );
            assert!(alloc(&other_client, 64) != 0, "the client goes on");
        }

        // A conditional node added to a capture going on (the CUDA guide's way): a handle
        // of the capture's graph, the node, the stream moved past it, the body captured on
        // a second stream into the body graph.
        let (mut c1, mut c2) = (0u64, 0u64);
        for p in [&mut c1, &mut c2] {
            ok(cuMemAlloc_v2(p, 4 * WORDS));
            ok(cuMemsetD32_v2(*p, 0, WORDS));
        }
        let mut body_stream = null_mut();
        ok(cuStreamCreate(&mut body_stream, 1));
        ok(cuStreamBeginCapture_v2(s, 2));
        let (_, cg) = capture_graph_of(s);
        let mut hc = 0u64;
        ok(cuGraphConditionalHandleCreate(
            &mut hc,
            cg,
            null_mut(),
            0,
            0,
        ));
        launch(set, s, &mut [ptr(&mut hc), ptr(&mut one)]);
        let mut np: NodeParams = std::mem::zeroed();
        np.ty = 13;
        let cp = np.params.as_mut_ptr() as *mut CondParams;
        (*cp).handle = hc;
        (*cp).ty = IF;
        (*cp).size = 1;
        let mut cnode = null_mut();
        ok(cuGraphAddNode(&mut cnode, cg, null(), 0, &mut np));
        let body = *(*cp).graph_out;
        assert_eq!(
            cuStreamUpdateCaptureDependencies(s, &prep, 1, 1),
            CUDA_ERROR_NOT_SUPPORTED,
            "other dependencies"
        );
        ok(cuStreamUpdateCaptureDependencies(s, &cnode, 1, 1));
        assert_eq!(
            cuStreamBeginCaptureToGraph(body_stream, captured, null(), null(), 0, 2),
            CUDA_ERROR_NOT_SUPPORTED,
            "capturing into a graph the server captured, not a body"
        );
        ok(cuStreamBeginCaptureToGraph(
            body_stream,
            body,
            null(),
            null(),
            0,
            2,
        ));
        let (mut v8, mut v9) = (8u32, 9u32);
        launch(
            fill,
            body_stream,
            &mut [ptr(&mut c1), ptr(&mut v8), ptr(&mut nn)],
        );
        let mut ended = null_mut();
        ok(cuStreamEndCapture(body_stream, &mut ended));
        assert_eq!(ended, body, "a body's capture ends in the body");
        launch(fill, s, &mut [ptr(&mut c2), ptr(&mut v9), ptr(&mut nn)]);
        let mut cgraph = null_mut();
        ok(cuStreamEndCapture(s, &mut cgraph));
        assert_eq!(cgraph, cg, "the capture ends in the graph it gave out");
        let mut ce = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut ce, cgraph, 0));
        ok(cuGraphLaunch(ce, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(c1), vec![8; WORDS], "the captured body ran");
        assert_eq!(read(c2), vec![9; WORDS], "what followed the node ran");
        ok(cuGraphExecDestroy(ce));
        ok(cuGraphDestroy(cgraph));
        assert_eq!(
            cuStreamBeginCaptureToGraph(body_stream, body, null(), null(), 0, 2),
            CUDA_ERROR_INVALID_VALUE,
            "a body goes with its graph"
        );
        ok(cuStreamDestroy_v2(body_stream));

        ok(cuGraphExecDestroy(e));
        ok(cuGraphDestroy(g));
        let mut count = 0usize;
        assert_eq!(
            cuGraphGetNodes(ifb[0], null_mut(), &mut count),
            CUDA_ERROR_INVALID_HANDLE,
            "a body goes with its graph"
        );
        ok(cuGraphDestroy(other));
        ok(cuGraphDestroy(captured));
        ok(cuStreamDestroy_v2(s));
    }
}

/// Launches `f` on stream `s` with the arguments `args` points at.
///
/// # Safety
/// `args` matches `f`'s parameters and lives for the call.
unsafe fn launch(f: CUfunction, s: CUstream, args: &mut [*mut c_void]) {
    // SAFETY: forwarded contract.
    ok(unsafe { cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args.as_mut_ptr(), null_mut()) });
}

fn ptr<T>(v: &mut T) -> *mut c_void {
    v as *mut T as *mut c_void
}
