//! Graphs built by hand, through the shim's entry points: nodes of each supported kind,
//! edges, a child graph, queries, a cycle refused, an executable graph's kernel node given
//! new parameters, and an update from a graph of the same and of another topology.

mod common;
use common::*;
use omps_shim::api::exec::*;
use omps_shim::api::graph::*;
use omps_shim::api::graph_build::*;
use omps_shim::api::hostmem::Memcpy3D;
use omps_shim::api::mem::*;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

const WORDS: usize = 16;

static BUMPS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

unsafe extern "C" fn bump(data: *mut c_void) {
    assert_eq!(data as usize, 42, "the node's argument");
    BUMPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// Waits up to 2 s for the host node to have run `n` times.
fn bumps_reach(n: u32) -> u32 {
    let t = std::time::Instant::now();
    while BUMPS.load(std::sync::atomic::Ordering::SeqCst) < n
        && t.elapsed() < std::time::Duration::from_secs(2)
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    BUMPS.load(std::sync::atomic::Ordering::SeqCst)
}

/// fill_u32(ptr, value, WORDS) as kernel node parameters; the arguments live in `a`.
fn fill_params(f: CUfunction, a: &mut [*mut c_void; 3]) -> KernelNodeParams {
    KernelNodeParams {
        func: f,
        grid: [1; 3],
        block: [1; 3],
        shared: 0,
        kernel_params: a.as_mut_ptr(),
        extra: null_mut(),
    }
}

fn read(p: u64) -> Vec<u32> {
    let mut v = vec![0u32; WORDS];
    // SAFETY: v holds WORDS words.
    ok(unsafe { cuMemcpyDtoH_v2(v.as_mut_ptr() as *mut c_void, p, 4 * WORDS) });
    v
}

fn nodes_of(g: CUgraph) -> Vec<GraphNodeRef> {
    let mut n = 0usize;
    // SAFETY: valid pointers; a null array asks for the count.
    unsafe {
        ok(cuGraphGetNodes(g, null_mut(), &mut n));
        let mut v = vec![null_mut(); n];
        ok(cuGraphGetNodes(g, v.as_mut_ptr(), &mut n));
        v
    }
}

#[test]
fn hand_built_graphs_run_as_built() {
    // Every queue to the client: the host GPU's class has 8 work streams, 4 of them in
    // the default share, fewer than the parallel branches below.
    let _srv = start_as_client_with("graph-build", |c| c.client_queues = Some(4));
    let f = host_function(c"fill_u32");
    // SAFETY (whole test): every pointer passed is a valid local or a handle made here.
    unsafe {
        let (mut p, mut q) = (0u64, 0u64);
        ok(cuMemAlloc_v2(&mut p, 4 * WORDS));
        ok(cuMemAlloc_v2(&mut q, 4 * WORDS));
        let mut g = null_mut();
        assert_eq!(
            cuGraphCreate(&mut g, 1),
            CUDA_ERROR_INVALID_VALUE,
            "flags must be 0"
        );
        ok(cuGraphCreate(&mut g, 0));

        // A: p = 5.  B: q = 9 (independent of A).  C: q[..8] = p[..8], after A and B.
        let mut a = null_mut();
        let ms = MemsetNodeParams {
            dst: p,
            pitch: 0,
            value: 5,
            elem: 4,
            width: WORDS,
            height: 1,
        };
        ok(cuGraphAddMemsetNode(&mut a, g, null(), 0, &ms, null_mut()));
        let (mut qp, mut nine, mut n) = (q, 9u32, WORDS as u32);
        let mut args = [
            &mut qp as *mut _ as *mut c_void,
            &mut nine as *mut _ as *mut c_void,
            &mut n as *mut _ as *mut c_void,
        ];
        let mut b = null_mut();
        ok(cuGraphAddKernelNode(
            &mut b,
            g,
            null(),
            0,
            &fill_params(f, &mut args),
        ));
        // The arguments were copied when the node was made.
        *(args[1] as *mut u32) = 1;
        let mut copy: Memcpy3D = std::mem::zeroed();
        copy.src_type = 2;
        copy.src_device = p;
        copy.dst_type = 2;
        copy.dst_device = q;
        copy.width = 4 * WORDS / 2;
        copy.height = 1;
        copy.depth = 1;
        let mut c = null_mut();
        ok(cuGraphAddMemcpyNode(
            &mut c,
            g,
            [a, b].as_ptr(),
            2,
            &copy,
            null_mut(),
        ));
        let mut d = null_mut();
        ok(cuGraphAddEmptyNode(&mut d, g, &c, 1));
        // E: a child graph that sets p[..4] = 3, after D.
        let mut child = null_mut();
        ok(cuGraphCreate(&mut child, 0));
        let (mut pp, mut three, mut four) = (p, 3u32, 4u32);
        let mut cargs = [
            &mut pp as *mut _ as *mut c_void,
            &mut three as *mut _ as *mut c_void,
            &mut four as *mut _ as *mut c_void,
        ];
        let mut k = null_mut();
        ok(cuGraphAddKernelNode(
            &mut k,
            child,
            null(),
            0,
            &fill_params(f, &mut cargs),
        ));
        let mut e = null_mut();
        ok(cuGraphAddChildGraphNode(&mut e, g, &d, 1, child));
        ok(cuGraphDestroy(child));
        assert_eq!(
            cuGraphAddEmptyNode(&mut e, g, &k, 1),
            CUDA_ERROR_INVALID_VALUE,
            "a node of another graph is no dependency"
        );

        // Queries.
        let all = nodes_of(g);
        assert_eq!(all, vec![a, b, c, d, e]);
        let types: Vec<u32> = all
            .iter()
            .map(|&x| {
                let mut t = 99;
                ok(cuGraphNodeGetType(x, &mut t));
                t
            })
            .collect();
        assert_eq!(
            types,
            vec![2, 0, 1, 5, 4],
            "memset, kernel, memcpy, empty, graph"
        );
        let (mut deps, mut num) = ([null_mut(); 4], 4usize);
        ok(cuGraphNodeGetDependencies(c, deps.as_mut_ptr(), &mut num));
        assert_eq!(&deps[..num], &[a, b]);
        num = 4;
        ok(cuGraphNodeGetDependentNodes(a, deps.as_mut_ptr(), &mut num));
        assert_eq!(&deps[..num], &[c]);
        num = 4;
        ok(cuGraphGetRootNodes(g, deps.as_mut_ptr(), &mut num));
        assert_eq!(&deps[..num], &[a, b]);
        let mut got: MemsetNodeParams = std::mem::zeroed();
        ok(cuGraphMemsetNodeGetParams(a, &mut got));
        assert_eq!((got.dst, got.value, got.elem, got.width), (p, 5, 4, WORDS));
        assert_eq!(
            cuGraphMemsetNodeGetParams(b, &mut got),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuGraphMemsetNodeSetParams(b, &ms),
            CUDA_ERROR_INVALID_VALUE,
            "a kernel node"
        );
        ok(cuGraphMemsetNodeSetParams(a, &ms));
        // A kernel node's parameters read back: its arguments as copied at creation.
        let mut kp: KernelNodeParams = std::mem::zeroed();
        ok(cuGraphKernelNodeGetParams(b, &mut kp));
        assert_eq!((kp.func, kp.grid, kp.block), (f, [1; 3], [1; 3]));
        assert_eq!(*(*kp.kernel_params.add(0) as *const u64), q);
        assert_eq!(
            *(*kp.kernel_params.add(1) as *const u32),
            9,
            "as made, not as changed after"
        );
        assert_eq!(
            cuGraphKernelNodeGetParams(a, &mut kp),
            CUDA_ERROR_INVALID_VALUE
        );
        // Edges, in node order, and a DOT picture of them.
        let (mut from, mut to, mut ne) = ([null_mut(); 8], [null_mut(); 8], 8usize);
        ok(cuGraphGetEdges(
            g,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            &mut ne,
        ));
        assert_eq!(
            from[..ne]
                .iter()
                .zip(&to[..ne])
                .map(|(&x, &y)| (x, y))
                .collect::<Vec<_>>(),
            vec![(a, c), (b, c), (c, d), (d, e)]
        );
        let dot = std::env::temp_dir().join(format!("omps-graph-{}.dot", std::process::id()));
        let cpath = std::ffi::CString::new(dot.to_str().unwrap()).unwrap();
        ok(cuGraphDebugDotPrint(g, cpath.as_ptr(), 0));
        let text = std::fs::read_to_string(&dot).unwrap();
        let _ = std::fs::remove_file(&dot);
        assert!(
            text.contains("n1 [shape=box label=\"1: kernel\"]") && text.contains("n0 -> n2;"),
            "{text}"
        );
        // Launch attributes on a kernel node: set, read back, copied; a handle refused.
        let mut prio = [0u8; 64];
        prio[..4].copy_from_slice(&(-2i32).to_le_bytes());
        ok(cuGraphKernelNodeSetAttribute(b, 8, &prio)); // CU_LAUNCH_ATTRIBUTE_PRIORITY
        let mut back = [9u8; 64];
        ok(cuGraphKernelNodeGetAttribute(b, 8, &mut back));
        assert_eq!(back, prio);
        ok(cuGraphKernelNodeGetAttribute(b, 5, &mut back));
        assert_eq!(back, [0u8; 64], "never set: the default");
        assert_eq!(
            cuGraphKernelNodeSetAttribute(b, 7, &prio),
            CUDA_ERROR_NOT_SUPPORTED,
            "an event"
        );
        assert_eq!(
            cuGraphKernelNodeSetAttribute(a, 8, &prio),
            CUDA_ERROR_INVALID_VALUE,
            "a memset node"
        );
        // New parameters leave the attributes the node has.
        ok(cuGraphKernelNodeSetParams(b, &kp));
        ok(cuGraphKernelNodeGetAttribute(b, 8, &mut back));
        assert_eq!(back, prio, "kept across new parameters");
        let mut cp: Memcpy3D = std::mem::zeroed();
        ok(cuGraphMemcpyNodeGetParams(c, &mut cp));
        assert_eq!(
            (cp.src_device, cp.dst_device, cp.width),
            (p, q, 4 * WORDS / 2)
        );

        // A cycle does not instantiate; without it the graph runs as built.
        let mut x = null_mut();
        ok(cuGraphAddDependencies(g, &e, &a, 1));
        assert_eq!(
            cuGraphInstantiateWithFlags(&mut x, g, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        ok(cuGraphRemoveDependencies(g, &e, &a, 1));
        ok(cuGraphInstantiateWithFlags(&mut x, g, 0));
        let mut s = null_mut();
        ok(cuStreamCreate(&mut s, 1));
        let run = |x: CUgraphExec| {
            ok(cuMemsetD32_v2(p, 0, WORDS));
            ok(cuMemsetD32_v2(q, 0, WORDS));
            ok(cuGraphLaunch(x, s));
            ok(cuStreamSynchronize(s));
            (read(p), read(q))
        };
        let want_p: Vec<u32> = (0..WORDS).map(|i| if i < 4 { 3 } else { 5 }).collect();
        let want_q =
            |hi: u32| -> Vec<u32> { (0..WORDS).map(|i| if i < 8 { 5 } else { hi }).collect() };
        assert_eq!(run(x), (want_p.clone(), want_q(9)));
        assert_eq!(
            run(x),
            (want_p.clone(), want_q(9)),
            "a second launch, the same"
        );

        // The executable graph's kernel node takes new arguments; the graph keeps its own.
        *(args[1] as *mut u32) = 7;
        ok(cuGraphExecKernelNodeSetParams(
            x,
            b,
            &fill_params(f, &mut args),
        ));
        assert_eq!(run(x), (want_p.clone(), want_q(7)));
        // A memset node too; a node of another kind is refused.
        let six = MemsetNodeParams { value: 6, ..ms };
        ok(cuGraphExecMemsetNodeSetParams(x, a, &six, null_mut()));
        let (px, qx) = run(x);
        assert_eq!(
            (&px[..4], &px[4..]),
            (&[3u32; 4][..], &[6u32; WORDS - 4][..])
        );
        assert_eq!((&qx[..8], &qx[8..]), (&[6u32; 8][..], &[7u32; 8][..]));
        assert_eq!(
            cuGraphExecMemsetNodeSetParams(x, b, &six, null_mut()),
            CUDA_ERROR_INVALID_VALUE,
            "b is a kernel node"
        );
        ok(cuGraphExecMemsetNodeSetParams(x, a, &ms, null_mut()));
        let mut y = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut y, g, 0));
        assert_eq!(run(y).1, want_q(9), "the graph itself still says 9");

        // An update from a clone with other arguments; then from another topology.
        let mut g2 = null_mut();
        ok(cuGraphClone(&mut g2, g));
        let b2 = nodes_of(g2)[1];
        *(args[1] as *mut u32) = 8;
        ok(cuGraphKernelNodeSetParams(b2, &fill_params(f, &mut args)));
        let mut info: ExecUpdateResultInfo = std::mem::zeroed();
        ok(cuGraphExecUpdate_v2(y, g2, &mut info));
        assert_eq!(info.result, 0);
        assert_eq!(run(y).1, want_q(8));
        let mut extra = null_mut();
        ok(cuGraphAddEmptyNode(&mut extra, g2, null(), 0));
        assert_eq!(cuGraphExecUpdate_v2(y, g2, &mut info), 910);
        assert_eq!(
            info.result, 2,
            "CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED"
        );
        assert_eq!(run(y).1, want_q(8), "a failed update changes nothing");

        // The generic form (cuGraphAddNode), as newer runtimes use: p = 6, then p[..4] = 3.
        let mut h = null_mut();
        ok(cuGraphCreate(&mut h, 0));
        let mut np: NodeParams = std::mem::zeroed();
        np.ty = 2;
        let ms6 = MemsetNodeParams { value: 6, ..ms };
        std::ptr::copy_nonoverlapping(&ms6, np.params.as_mut_ptr() as *mut MemsetNodeParams, 1);
        let mut m6 = null_mut();
        ok(cuGraphAddNode_v2(&mut m6, h, null(), null(), 0, &mut np));
        np.params = [0; 29];
        np.ty = 0;
        let kp = KernelNodeParamsV2 {
            v1: fill_params(null_mut(), &mut cargs),
            kern: f,
            ctx: null_mut(),
        };
        std::ptr::copy_nonoverlapping(&kp, np.params.as_mut_ptr() as *mut KernelNodeParamsV2, 1);
        let mut k3 = null_mut();
        ok(cuGraphAddNode(&mut k3, h, &m6, 1, &mut np));
        np.ty = 13;
        assert_eq!(
            cuGraphAddNode(&mut k3, h, null(), 0, &mut np),
            CUDA_ERROR_INVALID_VALUE,
            "a conditional node needs a handle of its graph (tests/conditional_nodes.rs)"
        );
        np.ty = 8;
        assert_eq!(
            cuGraphAddNode(&mut k3, h, null(), 0, &mut np),
            CUDA_ERROR_NOT_SUPPORTED,
            "external semaphore nodes are not supported yet"
        );
        let mut z = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut z, h, 0));
        assert_eq!(
            cuGraphInstantiateWithFlags(&mut z, h, 4),
            CUDA_ERROR_NOT_SUPPORTED,
            "device launch: the handle is the shim's"
        );
        let (mut z1, mut fl) = (null_mut(), 0u64);
        ok(cuGraphInstantiateWithFlags(&mut z1, h, 1));
        ok(cuGraphExecGetFlags(z1, &mut fl));
        assert_eq!(fl, 1, "auto-free on launch, as instantiated");
        ok(cuGraphExecDestroy(z1));
        ok(cuMemsetD32_v2(p, 0, WORDS));
        ok(cuGraphLaunch(z, s));
        ok(cuStreamSynchronize(s));
        let want: Vec<u32> = (0..WORDS).map(|i| if i < 4 { 3 } else { 6 }).collect();
        assert_eq!(read(p), want);
        ok(cuGraphExecDestroy(z));
        ok(cuGraphDestroy(h));

        // Event record and wait nodes: external records and waits in the capture.
        let (mut ev, mut ev2) = (null_mut(), null_mut());
        ok(cuEventCreate(&mut ev, 2));
        ok(cuEventCreate(&mut ev2, 2));
        let mut h = null_mut();
        ok(cuGraphCreate(&mut h, 0));
        let (mut rec, mut wait, mut last) = (null_mut(), null_mut(), null_mut());
        ok(cuGraphAddEventRecordNode(&mut rec, h, null(), 0, ev));
        ok(cuGraphAddEventWaitNode(&mut wait, h, &rec, 1, ev));
        ok(cuGraphAddMemsetNode(
            &mut last,
            h,
            &wait,
            1,
            &MemsetNodeParams { value: 4, ..ms },
            null_mut(),
        ));
        let mut t = 0;
        ok(cuGraphNodeGetType(rec, &mut t));
        assert_eq!(t, 7, "CU_GRAPH_NODE_TYPE_EVENT_RECORD");
        ok(cuGraphNodeGetType(wait, &mut t));
        assert_eq!(t, 6, "CU_GRAPH_NODE_TYPE_WAIT_EVENT");
        let mut got = null_mut();
        ok(cuGraphEventWaitNodeSetEvent(wait, ev2));
        ok(cuGraphEventWaitNodeGetEvent(wait, &mut got));
        assert_eq!(got, ev2);
        assert_eq!(
            cuGraphEventRecordNodeGetEvent(wait, &mut got),
            CUDA_ERROR_INVALID_VALUE
        );
        ok(cuGraphEventWaitNodeSetEvent(wait, ev));
        let mut z = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut z, h, 0));
        assert_eq!(
            cuGraphInstantiateWithFlags(&mut z, h, 4),
            CUDA_ERROR_NOT_SUPPORTED,
            "device launch: the handle is the shim's"
        );
        let (mut z1, mut fl) = (null_mut(), 0u64);
        ok(cuGraphInstantiateWithFlags(&mut z1, h, 1));
        ok(cuGraphExecGetFlags(z1, &mut fl));
        assert_eq!(fl, 1, "auto-free on launch, as instantiated");
        ok(cuGraphExecDestroy(z1));
        ok(cuMemsetD32_v2(p, 0, WORDS));
        ok(cuGraphLaunch(z, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(p), vec![4; WORDS]);
        ok(cuGraphExecDestroy(z));
        ok(cuGraphDestroy(h));

        // A host node runs in this process on every replay, never at instantiation.
        let mut h = null_mut();
        ok(cuGraphCreate(&mut h, 0));
        let mut hn = null_mut();
        let hp = HostNodeParams {
            f: Some(bump),
            data: 42 as *mut c_void,
        };
        ok(cuGraphAddHostNode(&mut hn, h, null(), 0, &hp));
        let mut t = 0;
        ok(cuGraphNodeGetType(hn, &mut t));
        assert_eq!(t, 3, "CU_GRAPH_NODE_TYPE_HOST");
        let mut z = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut z, h, 0));
        assert_eq!(
            cuGraphInstantiateWithFlags(&mut z, h, 4),
            CUDA_ERROR_NOT_SUPPORTED,
            "device launch: the handle is the shim's"
        );
        let (mut z1, mut fl) = (null_mut(), 0u64);
        ok(cuGraphInstantiateWithFlags(&mut z1, h, 1));
        ok(cuGraphExecGetFlags(z1, &mut fl));
        assert_eq!(fl, 1, "auto-free on launch, as instantiated");
        ok(cuGraphExecDestroy(z1));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(
            BUMPS.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "not at instantiation"
        );
        for n in 1..=3 {
            ok(cuGraphLaunch(z, s));
            ok(cuStreamSynchronize(s));
            assert_eq!(bumps_reach(n), n, "once per replay");
        }
        ok(cuGraphExecDestroy(z));
        ok(cuGraphDestroy(h));

        // Destroying a node takes its edges; destroyed handles are refused.
        ok(cuGraphDestroyNode(d));
        num = 4;
        ok(cuGraphNodeGetDependencies(e, deps.as_mut_ptr(), &mut num));
        assert_eq!(num, 0);
        assert_eq!(nodes_of(g).len(), 4);
        for h in [x, y] {
            ok(cuGraphExecDestroy(h));
        }
        ok(cuGraphDestroy(g));
        ok(cuGraphDestroy(g2));
        assert_eq!(
            cuGraphAddEmptyNode(&mut extra, g, null(), 0),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(cuGraphLaunch(x, s), CUDA_ERROR_INVALID_HANDLE);

        // A node disabled in an executable graph keeps its place and does nothing.
        let mut g3 = null_mut();
        ok(cuGraphCreate(&mut g3, 0));
        let seven = MemsetNodeParams {
            dst: q,
            pitch: 0,
            value: 7,
            elem: 4,
            width: WORDS,
            height: 1,
        };
        let (mut m, mut after) = (null_mut(), null_mut());
        ok(cuGraphAddMemsetNode(
            &mut m,
            g3,
            null(),
            0,
            &seven,
            null_mut(),
        ));
        ok(cuGraphAddEmptyNode(&mut after, g3, &m, 1));
        let mut x3 = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut x3, g3, 0));
        let mut on = 9u32;
        ok(cuGraphNodeGetEnabled(x3, m, &mut on));
        assert_eq!(on, 1);
        ok(cuGraphNodeSetEnabled(x3, m, 0));
        ok(cuGraphNodeGetEnabled(x3, m, &mut on));
        assert_eq!(on, 0);
        assert_eq!(
            cuGraphNodeSetEnabled(x3, after, 0),
            CUDA_ERROR_INVALID_VALUE,
            "an empty node"
        );
        ok(cuMemsetD32_v2(q, 1, WORDS));
        ok(cuGraphLaunch(x3, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(q), vec![1; WORDS], "disabled");
        ok(cuGraphNodeSetEnabled(x3, m, 1));
        ok(cuGraphLaunch(x3, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(q), vec![7; WORDS], "enabled again");
        // The generic set calls: the executable graph's memset now writes 3, the graph's 4.
        let mut gp: NodeParams = std::mem::zeroed();
        gp.ty = 2;
        let three = MemsetNodeParams { value: 3, ..seven };
        std::ptr::copy_nonoverlapping(&three, gp.params.as_mut_ptr() as *mut MemsetNodeParams, 1);
        ok(cuGraphExecNodeSetParams(x3, m, &mut gp));
        ok(cuGraphLaunch(x3, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(q), vec![3; WORDS]);
        (*(gp.params.as_mut_ptr() as *mut MemsetNodeParams)).value = 4;
        ok(cuGraphNodeSetParams(m, &mut gp));
        let mut got4: MemsetNodeParams = std::mem::zeroed();
        ok(cuGraphMemsetNodeGetParams(m, &mut got4));
        assert_eq!(got4.value, 4);
        gp.ty = 5; // an empty node's parameters for a memset node
        assert_eq!(cuGraphNodeSetParams(m, &mut gp), CUDA_ERROR_INVALID_VALUE);
        // A child node owns a copy of its graph; the handle it gives out is that copy.
        let mut cg = null_mut();
        ok(cuGraphCreate(&mut cg, 0));
        let mut only = null_mut();
        ok(cuGraphAddEmptyNode(&mut only, cg, null(), 0));
        let mut cn = null_mut();
        ok(cuGraphAddChildGraphNode(&mut cn, g3, &after, 1, cg));
        let mut owned = null_mut();
        ok(cuGraphChildGraphNodeGetGraph(cn, &mut owned));
        assert_ne!(owned, cg, "a copy");
        let mut more = null_mut();
        ok(cuGraphAddEmptyNode(&mut more, owned, null(), 0));
        assert_eq!(nodes_of(owned).len(), 2, "the node's graph changed");
        assert_eq!(nodes_of(cg).len(), 1, "the original did not");
        let mut again = null_mut();
        ok(cuGraphChildGraphNodeGetGraph(cn, &mut again));
        assert_eq!(again, owned);
        // A graph with memory nodes is no child; a destroyed child node's graph is gone.
        let mut mg = null_mut();
        ok(cuGraphCreate(&mut mg, 0));
        let mut ap: MemAllocNodeParams = std::mem::zeroed();
        ap.pool_props[0] = 1;
        ap.pool_props[8] = 1;
        ap.bytesize = 64;
        let mut an = null_mut();
        ok(cuGraphAddMemAllocNode(&mut an, mg, null(), 0, &mut ap));
        let mut bad = null_mut();
        assert_eq!(
            cuGraphAddChildGraphNode(&mut bad, g3, null(), 0, mg),
            CUDA_ERROR_INVALID_VALUE
        );
        ok(cuGraphDestroy(mg));
        let (mut cn2, mut owned2) = (null_mut(), null_mut());
        ok(cuGraphAddChildGraphNode(&mut cn2, g3, null(), 0, cg));
        ok(cuGraphChildGraphNodeGetGraph(cn2, &mut owned2));
        ok(cuGraphDestroyNode(cn2));
        assert_eq!(
            cuGraphGetNodes(owned2, null_mut(), &mut num),
            CUDA_ERROR_INVALID_HANDLE
        );
        let mut g3c = null_mut();
        ok(cuGraphClone(&mut g3c, g3));
        let cn_clone = nodes_of(g3c)[2];
        let mut owned_clone = null_mut();
        ok(cuGraphChildGraphNodeGetGraph(cn_clone, &mut owned_clone));
        assert_ne!(owned_clone, owned, "a clone's child is its own");
        assert_eq!(nodes_of(owned_clone).len(), 2);
        let mut xc = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut xc, g3c, 0));
        ok(cuGraphExecChildGraphNodeSetParams(xc, cn_clone, cg));
        ok(cuGraphLaunch(xc, s));
        ok(cuStreamSynchronize(s));
        ok(cuGraphExecDestroy(xc));
        ok(cuGraphDestroy(g3c));
        assert_eq!(
            cuGraphGetNodes(owned_clone, null_mut(), &mut num),
            CUDA_ERROR_INVALID_HANDLE,
            "gone with its node's graph"
        );
        ok(cuGraphDestroy(cg));
        ok(cuGraphExecDestroy(x3));
        ok(cuGraphDestroy(g3));
    }
}
