//! What graphs keep alive. Graph memory (cuMemAllocAsync during a capture, memory nodes
//! built by hand) counts against the client from the node's making, a free inside the
//! graph or outside it leaves it to the graph, and it goes once the graph and every
//! executable graph made from it are destroyed, unless a launch left it to the program,
//! which then frees it. A user object's destructor runs once its
//! last reference, a graph's or an executable graph's included, is gone.

mod common;
use common::*;
use omps_shim::api::capture::*;
use omps_shim::api::exec::*;
use omps_shim::api::graph::*;
use omps_shim::api::graph_build::*;
use omps_shim::api::graph_mem::*;
use omps_shim::api::mem::*;
use omps_shim::api::pool::*;
use omps_shim::api::user_object::*;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

const WORDS: usize = 16;

static DESTROYED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

unsafe extern "C" fn destroyed(p: *mut c_void) {
    assert_eq!(p as usize, 77, "the object's pointer");
    DESTROYED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// The destructor count, once it has stopped changing for 50 ms (up to 2 s for `want`).
fn destroyed_count(want: u32) -> u32 {
    let t = std::time::Instant::now();
    while DESTROYED.load(std::sync::atomic::Ordering::SeqCst) != want
        && t.elapsed() < std::time::Duration::from_secs(2)
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    DESTROYED.load(std::sync::atomic::Ordering::SeqCst)
}
const BYTES: u64 = 4 * WORDS as u64;

fn read(p: u64) -> Vec<u32> {
    let mut v = vec![0u32; WORDS];
    // SAFETY: v holds WORDS words.
    ok(unsafe { cuMemcpyDtoH_v2(v.as_mut_ptr() as *mut c_void, p, 4 * WORDS) });
    v
}

/// fill_u32(ptr, value, WORDS) on stream `s`.
fn fill(f: CUfunction, s: CUstream, ptr: u64, value: u32) {
    let (mut p, mut v, mut n) = (ptr, value, WORDS as u32);
    let mut args = [
        &mut p as *mut _ as *mut c_void,
        &mut v as *mut _ as *mut c_void,
        &mut n as *mut _ as *mut c_void,
    ];
    // SAFETY: the arguments fill_u32 takes, alive for the call.
    ok(unsafe { cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args.as_mut_ptr(), null_mut()) });
}

fn graph_mem_used() -> u64 {
    let mut v = 0u64;
    // SAFETY: a u64 to write.
    ok(unsafe { cuDeviceGetGraphMemAttribute(0, 0, &mut v as *mut u64 as *mut c_void) });
    v
}

#[test]
fn graph_memory_lives_as_long_as_its_graphs() {
    // Every queue to the client: two captures at once beside its other streams need more
    // of the host GPU's 8 work streams than the default share's 4.
    let srv = start_as_client_with("graph-mem", |c| c.client_queues = Some(4));
    let pid = std::process::id();
    // The host module's 16-byte `counter` variable counts as the client's memory.
    let mem = |graphs: u64| {
        let want = graphs + 16;
        let ps = srv.wait_ps(2, |ps| ps_mem(ps, pid) == Some(want));
        assert_eq!(ps_mem(&ps, pid), Some(want), "{ps}");
    };
    let f = host_function(c"fill_u32");
    // SAFETY (whole test): every pointer passed is a valid local or a handle made here.
    unsafe {
        let mut out = 0u64;
        ok(cuMemAlloc_v2(&mut out, BYTES as usize));
        let mut s = null_mut();
        ok(cuStreamCreate(&mut s, 1));

        // Captured: tmp = 7; out = tmp; free(tmp). The free stays in the graph.
        ok(cuStreamBeginCapture_v2(s, 0));
        let mut tmp = 0u64;
        ok(cuMemAllocAsync(&mut tmp, BYTES as usize, s));
        assert!(tmp != 0);
        fill(f, s, tmp, 7);
        ok(cuMemcpyDtoDAsync_v2(out, tmp, BYTES as usize, s));
        ok(cuMemFreeAsync(tmp, s));
        let mut g = null_mut();
        ok(cuStreamEndCapture(s, &mut g));
        mem(2 * BYTES);
        assert_eq!(graph_mem_used(), BYTES);
        let mut e = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut e, g, 0));
        ok(cuGraphDestroy(g));
        // The executable graph still holds the memory its replays use.
        for _ in 0..3 {
            ok(cuGraphLaunch(e, s));
        }
        ok(cuStreamSynchronize(s));
        assert_eq!(read(out), vec![7; WORDS]);
        mem(2 * BYTES);
        ok(cuGraphExecDestroy(e));
        mem(BYTES);
        assert_eq!(graph_mem_used(), 0);

        // By hand: alloc (its address fixed now), fill 9, copy out, free.
        let mut g = null_mut();
        ok(cuGraphCreate(&mut g, 0));
        let mut p: MemAllocNodeParams = std::mem::zeroed();
        p.pool_props[0] = 1; // pinned
        p.pool_props[8] = 1; // on a device: device 0
        p.bytesize = 0;
        let mut a = null_mut();
        assert_eq!(
            cuGraphAddMemAllocNode(&mut a, g, null(), 0, &mut p),
            CUDA_ERROR_INVALID_VALUE,
            "no size"
        );
        p.bytesize = BYTES as usize;
        ok(cuGraphAddMemAllocNode(&mut a, g, null(), 0, &mut p));
        let ptr = p.dptr;
        assert!(ptr != 0);
        mem(2 * BYTES);
        let mut back: MemAllocNodeParams = std::mem::zeroed();
        ok(cuGraphMemAllocNodeGetParams(a, &mut back));
        assert_eq!((back.bytesize, back.dptr), (BYTES as usize, ptr));
        let (mut pp, mut nine, mut n) = (ptr, 9u32, WORDS as u32);
        let mut args = [
            &mut pp as *mut _ as *mut c_void,
            &mut nine as *mut _ as *mut c_void,
            &mut n as *mut _ as *mut c_void,
        ];
        let kp = KernelNodeParams {
            func: f,
            grid: [1; 3],
            block: [1; 3],
            shared: 0,
            kernel_params: args.as_mut_ptr(),
            extra: null_mut(),
        };
        let mut k = null_mut();
        ok(cuGraphAddKernelNode(&mut k, g, &a, 1, &kp));
        let mut copy: omps_shim::api::hostmem::Memcpy3D = std::mem::zeroed();
        copy.src_type = 2;
        copy.src_device = ptr;
        copy.dst_type = 2;
        copy.dst_device = out;
        copy.width = BYTES as usize;
        copy.height = 1;
        copy.depth = 1;
        let mut c = null_mut();
        ok(cuGraphAddMemcpyNode(&mut c, g, &k, 1, &copy, null_mut()));
        let mut fr = null_mut();
        assert_eq!(
            cuGraphAddMemFreeNode(&mut fr, g, &c, 1, out),
            CUDA_ERROR_INVALID_VALUE,
            "a free node frees only graph memory"
        );
        ok(cuGraphAddMemFreeNode(&mut fr, g, &c, 1, ptr));
        let mut freed = 0u64;
        ok(cuGraphMemFreeNodeGetParams(fr, &mut freed));
        assert_eq!(freed, ptr);
        let mut ty = 0u32;
        ok(omps_shim::api::graph::cuGraphNodeGetType(a, &mut ty));
        assert_eq!(ty, 10, "a memory allocation node");

        let mut e = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut e, g, 0));
        ok(cuGraphLaunch(e, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(out), vec![9; WORDS]);
        // Freed outside the graph: still the graph's until it goes.
        ok(cuMemFreeAsync(ptr, s));
        ok(cuMemFree_v2(ptr));
        ok(cuGraphLaunch(e, s));
        ok(cuStreamSynchronize(s));
        mem(2 * BYTES);
        ok(cuGraphDestroy(g));
        mem(2 * BYTES);
        ok(cuGraphExecDestroy(e));
        mem(BYTES);

        // An allocation the graph does not free: a relaunch waits for the program's free,
        // unless the graph was instantiated to free on launch.
        let mut g = null_mut();
        ok(cuGraphCreate(&mut g, 0));
        p.dptr = 0;
        ok(cuGraphAddMemAllocNode(&mut a, g, null(), 0, &mut p));
        let kept = p.dptr;
        let (mut plain, mut auto) = (null_mut(), null_mut());
        ok(cuGraphInstantiateWithFlags(&mut plain, g, 0));
        ok(cuGraphInstantiateWithFlags(&mut auto, g, 1));
        ok(cuGraphLaunch(plain, s));
        assert_eq!(
            cuGraphLaunch(plain, s),
            CUDA_ERROR_INVALID_VALUE,
            "not freed yet"
        );
        ok(cuMemFreeAsync(kept, s));
        ok(cuGraphLaunch(plain, s));
        ok(cuGraphLaunch(auto, s));
        ok(cuGraphLaunch(auto, s));
        ok(cuStreamSynchronize(s));
        for x in [plain, auto] {
            ok(cuGraphExecDestroy(x));
        }
        ok(cuGraphDestroy(g));
        // The last launch left it to the program: it outlives its graphs until freed.
        mem(2 * BYTES);
        ok(cuMemsetD32_v2(kept, 5, WORDS));
        assert_eq!(read(kept), vec![5; WORDS]);
        ok(cuMemFreeAsync(kept, s));
        ok(cuStreamSynchronize(s));
        mem(BYTES);
        assert_eq!(graph_mem_used(), 0);

        // A user object held by the caller, a graph, and an executable graph made from it.
        let mut o = null_mut();
        assert_eq!(
            cuUserObjectCreate(&mut o, 77 as *mut c_void, Some(destroyed), 1, 0),
            CUDA_ERROR_INVALID_VALUE,
            "the no-destructor-sync flag is required"
        );
        ok(cuUserObjectCreate(
            &mut o,
            77 as *mut c_void,
            Some(destroyed),
            2,
            1,
        ));
        let mut g = null_mut();
        ok(cuGraphCreate(&mut g, 0));
        let mut k = null_mut();
        // The earlier graph's memory is gone with it: this one fills `out`.
        let (mut op, mut one) = (out, 1u32);
        let mut oargs = [
            &mut op as *mut _ as *mut c_void,
            &mut one as *mut _ as *mut c_void,
            &mut n as *mut _ as *mut c_void,
        ];
        let kp = KernelNodeParams {
            kernel_params: oargs.as_mut_ptr(),
            ..kp
        };
        ok(cuGraphAddKernelNode(&mut k, g, null(), 0, &kp));
        ok(cuGraphRetainUserObject(g, o, 1, 1)); // moves one of the caller's two
        ok(cuGraphRetainUserObject(g, o, 2, 0));
        ok(cuGraphReleaseUserObject(g, o, 2));
        assert_eq!(
            cuGraphReleaseUserObject(g, o, 5),
            CUDA_ERROR_INVALID_VALUE,
            "more than the graph holds"
        );
        let mut e = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut e, g, 0));
        ok(cuUserObjectRelease(o, 1));
        ok(cuGraphDestroy(g));
        ok(cuGraphLaunch(e, s));
        assert_eq!(destroyed_count(0), 0, "the executable graph holds it");
        ok(cuGraphExecDestroy(e));
        ok(cuStreamSynchronize(s));
        assert_eq!(
            destroyed_count(1),
            1,
            "destroyed once, after the last launch"
        );
        assert_eq!(cuUserObjectRetain(o, 1), CUDA_ERROR_INVALID_HANDLE);

        // Moved into the graph of a capture still going: the handle the capture ends in.
        let mut o2 = null_mut();
        ok(cuUserObjectCreate(
            &mut o2,
            77 as *mut c_void,
            Some(destroyed),
            1,
            1,
        ));
        ok(cuStreamBeginCapture_v2(s, 0));
        let (mut st, mut cid, mut cg) = (0u32, 0u64, null_mut::<c_void>());
        ok(omps_shim::api::stream_info::cuStreamGetCaptureInfo_v2(
            s,
            &mut st,
            &mut cid,
            &mut cg,
            null_mut(),
            null_mut(),
        ));
        assert_eq!(st, 1);
        assert!(!cg.is_null(), "the capture's graph");
        ok(cuGraphRetainUserObject(cg as CUgraph, o2, 1, 1));
        let mut n2 = 0usize;
        assert_eq!(
            cuGraphGetNodes(cg as CUgraph, null_mut(), &mut n2),
            CUDA_ERROR_NOT_SUPPORTED,
            "not while the capture goes on"
        );
        fill(f, s, out, 3);
        let mut g = null_mut();
        ok(cuStreamEndCapture(s, &mut g));
        assert_eq!(g as *mut c_void, cg, "the same handle");
        ok(cuGraphDestroy(g));
        assert_eq!(destroyed_count(2), 2, "gone with its graph");

        // Two threads capture their own per-thread default streams at once, each with
        // graph memory: each capture ends in its own graph holding its own memory.
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let b = barrier.clone();
                std::thread::spawn(move || {
                    let ctx = {
                        let mut c = null_mut();
                        ok(omps_shim::api::ctx::cuDevicePrimaryCtxRetain(&mut c, 0));
                        c
                    };
                    ok(omps_shim::api::ctx::cuCtxSetCurrent(ctx));
                    let s = 2usize as CUstream; // CU_STREAM_PER_THREAD
                    ok(cuStreamBeginCapture_v2(s, 2));
                    b.wait(); // both captures going
                    let mut m = 0u64;
                    ok(cuMemAllocAsync(&mut m, BYTES as usize, s));
                    b.wait();
                    let mut g = null_mut();
                    ok(cuStreamEndCapture(s, &mut g));
                    (g as usize, m)
                })
            })
            .collect();
        let got: Vec<(usize, u64)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_ne!(got[0].0, got[1].0, "two graphs");
        mem(3 * BYTES);
        ok(cuGraphDestroy(got[0].0 as CUgraph));
        mem(2 * BYTES);
        ok(cuGraphDestroy(got[1].0 as CUgraph));
        mem(BYTES);

        // A capture that fails gives back what it allocated.
        ok(cuStreamBeginCapture_v2(s, 0));
        ok(cuMemAllocAsync(&mut tmp, BYTES as usize, s));
        mem(2 * BYTES);
        assert_eq!(cuStreamSynchronize(s), 900, "illegal during capture");
        let mut g = null_mut();
        assert_eq!(cuStreamEndCapture(s, &mut g), 901, "invalidated");
        mem(BYTES);
    }
}
