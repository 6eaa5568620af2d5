//! Graphs whose copies touch host memory, on the host GPU (which records captured work and
//! replays it, host nodes waiting for this process's host-function thread): copies from
//! and to pinned memory (cuMemHostAlloc, a page-aligned cuMemHostRegister) DMA in every
//! replay; copies from and to pageable memory, and host to host, read and write the
//! program's memory when the replay gets there, not when the graph is made. Both for a
//! captured stream and for memcpy nodes of a graph built by hand (3D parameters with a
//! pitched host pointer, as simpleCudaGraphs makes them), replayed several times with the
//! host data changed in between; a memcpy node given a new destination in the executable
//! graph. And cuStreamBeginCaptureToGraph into a graph built by hand: what was captured
//! follows the given dependencies, as a child-graph node, also in a conditional body (the
//! way graphConditionalNodes fills a WHILE body).

mod common;
use common::*;
use omps_shim::api::capture::*;
use omps_shim::api::exec::*;
use omps_shim::api::graph::*;
use omps_shim::api::graph_build::*;
use omps_shim::api::hostmem::*;
use omps_shim::api::mem::*;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

const WORDS: usize = 64;
const BYTES: usize = 4 * WORDS;

fn read(p: u64) -> Vec<u32> {
    let mut v = vec![0u32; WORDS];
    // SAFETY: v holds WORDS words.
    ok(unsafe { cuMemcpyDtoH_v2(v.as_mut_ptr() as *mut c_void, p, BYTES) });
    v
}

fn pattern(k: u32) -> Vec<u32> {
    (0..WORDS as u32).map(|i| k * 1000 + i).collect()
}

fn dev_buf() -> u64 {
    let mut p = 0u64;
    // SAFETY: a valid out-pointer.
    ok(unsafe { cuMemAlloc_v2(&mut p, BYTES) });
    ok(cuMemsetD32_v2(p, 0, WORDS));
    p
}

/// `WORDS` words of pinned memory from cuMemHostAlloc.
fn pinned() -> &'static mut [u32] {
    let mut p = null_mut();
    // SAFETY: a valid out-pointer; the memory lives for the process.
    unsafe {
        ok(cuMemHostAlloc(&mut p, BYTES, 0));
        std::slice::from_raw_parts_mut(p as *mut u32, WORDS)
    }
}

/// Whether the server maps `p` (the device pointer of shared pinned memory is itself).
fn is_pinned(p: *const u32) -> bool {
    let mut d = 0u64;
    // SAFETY: a valid out-pointer.
    unsafe { cuMemHostGetDevicePointer_v2(&mut d, p as *mut c_void, 0) == CUDA_SUCCESS }
}

fn ptr<T>(v: &mut T) -> *mut c_void {
    v as *mut T as *mut c_void
}

/// Set in the child process that plays the client.
const CLIENT: &str = "OMPS_TEST_GRAPH_HOST_CLIENT";

/// The server runs here; the client is this test run again in a child process, so its
/// pinned memory is shared with the server as between two processes (in one process the
/// server cannot map it at the client's address, which is taken).
#[test]
fn graphs_copy_host_memory_when_they_run() {
    if std::env::var_os(CLIENT).is_some() {
        return client();
    }
    let srv = TestServer::start("graph-host");
    run_client_child(&srv, "graphs_copy_host_memory_when_they_run", CLIENT);
}

fn client() {
    use omps_shim::api::{ctx::*, device::*};
    let mut ctx = null_mut();
    // SAFETY: valid out-pointers.
    unsafe {
        ok(cuInit(0));
        ok(cuDevicePrimaryCtxRetain(&mut ctx, 0));
        ok(cuCtxSetCurrent(ctx));
    }
    // The pinned memory is the server's to reach, or this test tests nothing.
    let pin = pinned();
    assert!(
        is_pinned(pin.as_ptr()),
        "cuMemHostAlloc gave memory the server reaches"
    );
    let mut s = null_mut();
    // SAFETY: a valid out-pointer.
    ok(unsafe { cuStreamCreate(&mut s, 1) });
    captured_copies(s);
    assert_eq!(
        word_nodes_soon(0),
        0,
        "the captured graphs' staging went with them"
    );
    built_memcpy_nodes(s);
    capture_into_built_graphs(s);
    assert_eq!(word_nodes_soon(0), 0, "every graph's staging went with it");
}

/// The host nodes on pinned words alive once they dropped to `n` (destructors run on
/// threads of their own, a moment after the release), or after 2 s.
fn word_nodes_soon(n: usize) -> usize {
    let t = std::time::Instant::now();
    while omps_shim::hostfn::word_nodes() > n && t.elapsed() < std::time::Duration::from_secs(2) {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    omps_shim::hostfn::word_nodes()
}

/// A capture with pageable, pinned, registered and host-to-host copies.
fn captured_copies(s: CUstream) {
    let (p, q, r) = (dev_buf(), dev_buf(), dev_buf());
    let mut page_in = vec![0u32; WORDS];
    let mut page_out = vec![0u32; WORDS];
    let mut host_out = vec![0u32; WORDS];
    let (pin_in, pin_out) = (pinned(), pinned());
    // A page-aligned registered range is shared with the server, as cuMemHostAlloc's is.
    let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
    // SAFETY: a non-zero layout; freed at the end.
    let reg = unsafe { std::alloc::alloc_zeroed(layout) } as *mut u32;
    ok(cuMemHostRegister_v2(reg as *mut c_void, 4096, 0));
    // SAFETY (whole block): every pointer is a live buffer of BYTES bytes or a handle.
    unsafe {
        ok(cuStreamBeginCapture_v2(s, 0));
        ok(cuMemcpyHtoDAsync_v2(
            p,
            page_in.as_ptr() as *const c_void,
            BYTES,
            s,
        ));
        ok(cuMemcpyDtoDAsync_v2(q, p, BYTES, s));
        ok(cuMemcpyDtoHAsync_v2(
            page_out.as_mut_ptr() as *mut c_void,
            q,
            BYTES,
            s,
        ));
        // Host to host through cuMemcpyAsync (unified addressing: the pointers tell).
        ok(cuMemcpyAsync(
            host_out.as_mut_ptr() as u64,
            page_in.as_ptr() as u64,
            BYTES,
            s,
        ));
        ok(cuMemcpyHtoDAsync_v2(
            r,
            pin_in.as_ptr() as *const c_void,
            BYTES,
            s,
        ));
        ok(cuMemcpyDtoHAsync_v2(
            pin_out.as_mut_ptr() as *mut c_void,
            r,
            BYTES,
            s,
        ));
        ok(cuMemcpyDtoHAsync_v2(reg as *mut c_void, r, BYTES, s));
        let mut g = null_mut();
        ok(cuStreamEndCapture(s, &mut g));
        assert_eq!(read(p), vec![0; WORDS], "captured work does not run");
        let mut e = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut e, g, 0));
        // A clone replays the same copies, with its own hold on their buffers.
        let mut clone = null_mut();
        ok(cuGraphClone(&mut clone, g));
        ok(cuGraphDestroy(g));
        for k in 1..=3u32 {
            page_in.copy_from_slice(&pattern(k));
            pin_in.copy_from_slice(&pattern(k + 10));
            ok(cuGraphLaunch(e, s));
            ok(cuStreamSynchronize(s));
            assert_eq!(page_out, pattern(k), "pageable in and out, launch {k}");
            assert_eq!(host_out, pattern(k), "host to host, launch {k}");
            assert_eq!(
                pin_out,
                &pattern(k + 10)[..],
                "pinned in and out, launch {k}"
            );
            let regd = std::slice::from_raw_parts(reg, WORDS);
            assert_eq!(regd, &pattern(k + 10)[..], "registered, launch {k}");
        }
        ok(cuGraphExecDestroy(e));
        let mut e2 = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut e2, clone, 0));
        ok(cuGraphDestroy(clone));
        page_in.copy_from_slice(&pattern(7));
        ok(cuGraphLaunch(e2, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(page_out, pattern(7), "the clone's executable graph");
        ok(cuGraphExecDestroy(e2));

        // An executable graph updated to another capture replays that capture's staged
        // copies, which it holds: the captured graphs may go.
        let capture_out = |out: &mut Vec<u32>| {
            ok(cuStreamBeginCapture_v2(s, 0));
            ok(cuMemcpyDtoHAsync_v2(
                out.as_mut_ptr() as *mut c_void,
                q,
                BYTES,
                s,
            ));
            let mut g = null_mut();
            ok(cuStreamEndCapture(s, &mut g));
            g
        };
        let mut other_out = vec![0u32; WORDS];
        let g1 = capture_out(&mut page_out);
        let g2 = capture_out(&mut other_out);
        let mut e = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut e, g1, 0));
        let mut info: ExecUpdateResultInfo = std::mem::zeroed();
        ok(cuGraphExecUpdate_v2(e, g2, &mut info));
        ok(cuGraphDestroy(g1));
        ok(cuGraphDestroy(g2));
        ok(cuMemcpyHtoD_v2(
            q,
            pattern(8).as_ptr() as *const c_void,
            BYTES,
        ));
        ok(cuGraphLaunch(e, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(other_out, pattern(8), "the update's destination");
        assert_eq!(page_out, pattern(7), "not the first capture's");
        ok(cuGraphExecDestroy(e));
        ok(cuMemHostUnregister(reg as *mut c_void));
        std::alloc::dealloc(reg as *mut u8, layout);
    }
}

/// A 3D copy description between a host pointer and device memory, as the runtime makes
/// it from cudaMemcpy3DParms with make_cudaPitchedPtr (the host side's pitch the row).
fn copy3d(host: *mut u32, dev: u64, to_device: bool) -> Memcpy3D {
    // SAFETY: all-zero is a valid CUDA_MEMCPY3D.
    let mut c: Memcpy3D = unsafe { std::mem::zeroed() };
    let (h, d) = (1, 2);
    if to_device {
        (c.src_type, c.src_host, c.src_pitch, c.src_height) = (h, host as *const c_void, BYTES, 1);
        (c.dst_type, c.dst_device, c.dst_pitch, c.dst_height) = (d, dev, BYTES, 1);
    } else {
        (c.src_type, c.src_device, c.src_pitch, c.src_height) = (d, dev, BYTES, 1);
        (c.dst_type, c.dst_host, c.dst_pitch, c.dst_height) = (h, host as *mut c_void, BYTES, 1);
    }
    (c.width, c.height, c.depth) = (BYTES, 1, 1);
    c
}

/// Memcpy nodes of a graph built by hand: pageable in, device to device, pageable out,
/// host to host, pinned in.
fn built_memcpy_nodes(s: CUstream) {
    let (p, q, r) = (dev_buf(), dev_buf(), dev_buf());
    let mut page_in = vec![0u32; WORDS];
    let mut page_out = vec![0u32; WORDS];
    let mut other_out = vec![0u32; WORDS];
    let mut host_out = vec![0u32; WORDS];
    let pin_in = pinned();
    // SAFETY (whole block): every pointer is a live buffer of BYTES bytes or a handle.
    unsafe {
        let mut g = null_mut();
        ok(cuGraphCreate(&mut g, 0));
        let mut a = null_mut();
        let cin = copy3d(page_in.as_mut_ptr(), p, true);
        ok(cuGraphAddMemcpyNode(&mut a, g, null(), 0, &cin, null_mut()));
        let mut dd: Memcpy3D = std::mem::zeroed();
        (dd.src_type, dd.src_device, dd.dst_type, dd.dst_device) = (2, p, 2, q);
        (dd.width, dd.height, dd.depth) = (BYTES, 1, 1);
        let mut b = null_mut();
        ok(cuGraphAddMemcpyNode(&mut b, g, &a, 1, &dd, null_mut()));
        let mut c = null_mut();
        let cout = copy3d(page_out.as_mut_ptr(), q, false);
        ok(cuGraphAddMemcpyNode(&mut c, g, &b, 1, &cout, null_mut()));
        let mut hh: Memcpy3D = std::mem::zeroed();
        (hh.src_type, hh.src_host, hh.dst_type, hh.dst_host) = (
            1,
            page_in.as_ptr() as *const c_void,
            1,
            host_out.as_mut_ptr() as *mut c_void,
        );
        (hh.width, hh.height, hh.depth) = (BYTES, 1, 1);
        let mut d = null_mut();
        ok(cuGraphAddMemcpyNode(&mut d, g, null(), 0, &hh, null_mut()));
        let mut pn = null_mut();
        let cpin = copy3d(pin_in.as_mut_ptr(), r, true);
        ok(cuGraphAddMemcpyNode(
            &mut pn,
            g,
            null(),
            0,
            &cpin,
            null_mut(),
        ));
        let mut e = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut e, g, 0));
        assert_eq!(page_out, vec![0; WORDS], "instantiation copies nothing");
        for k in 1..=3u32 {
            page_in.copy_from_slice(&pattern(k));
            pin_in.copy_from_slice(&pattern(k + 20));
            ok(cuGraphLaunch(e, s));
            ok(cuStreamSynchronize(s));
            assert_eq!(page_out, pattern(k), "pageable nodes, launch {k}");
            assert_eq!(host_out, pattern(k), "host-to-host node, launch {k}");
            assert_eq!(read(r), pattern(k + 20), "pinned node, launch {k}");
        }
        // The executable graph's out node now writes elsewhere (made again: its old
        // staging goes after its last launch).
        let cother = copy3d(other_out.as_mut_ptr(), q, false);
        for round in 0..40u32 {
            ok(cuGraphExecMemcpyNodeSetParams(e, c, &cother, null_mut()));
            page_in.copy_from_slice(&pattern(50 + round));
            ok(cuGraphLaunch(e, s));
            ok(cuStreamSynchronize(s));
            assert_eq!(other_out, pattern(50 + round), "the new destination");
        }
        assert_eq!(page_out, pattern(3), "the old destination is left alone");
        // Forty instantiations: the old ones' staged copies went after their last launch;
        // the three of the last remain (pageable in, out and host to host).
        assert_eq!(word_nodes_soon(3), 3, "staged copies of old instantiations");
        assert!(
            omps_shim::api::staged::arena_bytes() <= 1 << 20,
            "one arena block"
        );
        ok(cuGraphExecDestroy(e));
        ok(cuGraphDestroy(g));
    }
}

/// cuStreamBeginCaptureToGraph into graphs built by hand.
fn capture_into_built_graphs(s: CUstream) {
    let fill = host_function(c"fill_u32");
    let set = host_function(c"set_cond");
    let (p, q) = (dev_buf(), dev_buf());
    let mut page_out = vec![0u32; WORDS];
    // SAFETY (whole block): every pointer is a live local or a handle made here.
    unsafe {
        let mut g = null_mut();
        ok(cuGraphCreate(&mut g, 0));
        // A: p = 5.  Then captured after A: q = p, and q copied out to pageable memory.
        let ms = MemsetNodeParams {
            dst: p,
            pitch: 0,
            value: 5,
            elem: 4,
            width: WORDS,
            height: 1,
        };
        let mut a = null_mut();
        ok(cuGraphAddMemsetNode(&mut a, g, null(), 0, &ms, null_mut()));
        ok(cuStreamBeginCaptureToGraph(s, g, &a, null(), 1, 0));
        ok(cuMemcpyDtoDAsync_v2(q, p, BYTES, s));
        ok(cuMemcpyDtoHAsync_v2(
            page_out.as_mut_ptr() as *mut c_void,
            q,
            BYTES,
            s,
        ));
        let mut got = null_mut();
        ok(cuStreamEndCapture(s, &mut got));
        assert_eq!(got, g, "the capture ends in the graph it went into");
        let mut n = 0usize;
        ok(cuGraphGetNodes(g, null_mut(), &mut n));
        assert_eq!(n, 2, "the memset and the captured work");
        let mut deps = [null_mut(); 2];
        let mut roots = 2usize;
        ok(cuGraphGetRootNodes(g, deps.as_mut_ptr(), &mut roots));
        assert_eq!(&deps[..roots], &[a], "the captured work follows A");
        let mut e = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut e, g, 0));
        ok(cuGraphLaunch(e, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(q), vec![5; WORDS]);
        assert_eq!(page_out, vec![5; WORDS], "the captured pageable copy ran");
        ok(cuGraphExecDestroy(e));
        ok(cuGraphDestroy(g));

        // A WHILE node's body filled by a capture (graphConditionalNodes'
        // simpleDoWhileGraph): the body sets q = 9 and clears the condition.
        let mut g = null_mut();
        ok(cuGraphCreate(&mut g, 0));
        let mut h = 0u64;
        ok(cuGraphConditionalHandleCreate(&mut h, g, null_mut(), 1, 1));
        let mut np: NodeParams = std::mem::zeroed();
        np.ty = 13;
        let c = np.params.as_mut_ptr() as *mut CondParams;
        ((*c).handle, (*c).ty, (*c).size) = (h, 1, 1);
        let mut cn = null_mut();
        ok(cuGraphAddNode(&mut cn, g, null(), 0, &mut np));
        let body = *(*c).graph_out;
        ok(cuStreamBeginCaptureToGraph(s, body, null(), null(), 0, 0));
        let (mut qq, mut nine, mut words, mut zero) = (q, 9u32, WORDS as u32, 0u32);
        let mut args = [ptr(&mut qq), ptr(&mut nine), ptr(&mut words)];
        ok(cuLaunchKernel(
            fill,
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
        let mut cargs = [ptr(&mut h), ptr(&mut zero)];
        ok(cuLaunchKernel(
            set,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            s,
            cargs.as_mut_ptr(),
            null_mut(),
        ));
        ok(cuStreamEndCapture(s, null_mut()));
        let mut e = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut e, g, 0));
        ok(cuGraphLaunch(e, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(read(q), vec![9; WORDS], "the captured body ran");
        ok(cuGraphExecDestroy(e));
        ok(cuGraphDestroy(g));
    }
}
