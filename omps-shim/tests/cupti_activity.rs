//! The shim's CUPTI (issue 26): a profiler that enables activity kinds and registers its
//! buffers, as Kineto does, gets back one kernel record per launch with the kernel's
//! name, its launch's correlation id shared with a driver API record and with the
//! external id it pushed, copy, memset and synchronization records, all in its own
//! clock, and nothing once activity is off. On the host GPU, whose events are stamped
//! with the host time the server handles them.

mod common;
use common::*;
use omps_shim::cupti::abi::{kind, off, result};
use omps_shim::cupti::*;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Mutex;

static DELIVERED: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
/// Buffers the profiler gave and has not been given back.
static OUTSTANDING: AtomicIsize = AtomicIsize::new(0);
const BUF: usize = 1 << 12;
/// The profiler's clock: monotonic nanoseconds plus this, so that a converted time shows.
const CLOCK_OFFSET: u64 = 1 << 50;

unsafe extern "C" fn request(buf: *mut *mut u8, size: *mut usize, max: *mut usize) {
    OUTSTANDING.fetch_add(1, Ordering::SeqCst);
    let b: &'static mut [u8] = Box::leak(vec![0u8; BUF].into_boxed_slice());
    // SAFETY: the shim's out-pointers.
    unsafe {
        *buf = b.as_mut_ptr();
        *size = BUF;
        *max = 0;
    }
}

unsafe extern "C" fn complete(_: *mut c_void, _: u32, buf: *mut u8, _size: usize, valid: usize) {
    OUTSTANDING.fetch_sub(1, Ordering::SeqCst);
    // Walked as a profiler walks it: record by record until MAX_LIMIT_REACHED.
    let mut rec: *mut c_void = std::ptr::null_mut();
    let mut out = Vec::new();
    loop {
        // SAFETY: the buffer the shim filled, `valid` bytes.
        let r = unsafe { cuptiActivityGetNextRecord(buf, valid, &mut rec) };
        if r != result::SUCCESS {
            assert_eq!(r, result::MAX_LIMIT_REACHED);
            break;
        }
        let at = rec as usize - buf as usize;
        // SAFETY: inside the buffer.
        let k = unsafe { *(rec as *const u32) };
        let size = omps_shim::cupti::abi::record_size(k).unwrap();
        // SAFETY: the record lies inside the valid bytes.
        out.extend_from_slice(unsafe { std::slice::from_raw_parts(buf.add(at), size) });
    }
    assert_eq!(out.len(), valid, "the walk covers every valid byte");
    DELIVERED.lock().unwrap().push(out);
}

unsafe extern "C" fn profiler_clock() -> u64 {
    omps_shim::state::profile::monotonic_ns() + CLOCK_OFFSET
}

/// Every record delivered so far, split.
fn take_records() -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    for buf in DELIVERED.lock().unwrap().drain(..) {
        let mut at = 0;
        while at < buf.len() {
            let k = u32::from_le_bytes(buf[at..at + 4].try_into().unwrap());
            let size = omps_shim::cupti::abi::record_size(k).unwrap();
            all.push(buf[at..at + size].to_vec());
            at += size;
        }
    }
    all
}

fn u32_at(r: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(r[o..o + 4].try_into().unwrap())
}
fn u64_at(r: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(r[o..o + 8].try_into().unwrap())
}
fn of_kind(all: &[Vec<u8>], k: u32) -> Vec<&Vec<u8>> {
    all.iter().filter(|r| u32_at(r, 0) == k).collect()
}

const TRACED: [u32; 6] = [
    kind::CONCURRENT_KERNEL,
    kind::MEMCPY,
    kind::MEMSET,
    kind::DRIVER,
    kind::SYNCHRONIZATION,
    kind::EXTERNAL_CORRELATION,
];

#[test]
fn a_profiler_gets_its_kernels_copies_and_waits_with_their_correlations() {
    let _srv = start_as_client("cupti");
    use omps_shim::api::{ctx::cuCtxSynchronize, exec::cuStreamSynchronize, mem::*};
    // SAFETY: the callbacks above have CUPTI's signatures; valid pointers throughout.
    unsafe {
        let mut sub = std::ptr::null_mut();
        assert_eq!(
            cuptiSubscribe(&mut sub, std::ptr::null_mut(), std::ptr::null_mut()),
            0
        );
        let mut other = std::ptr::null_mut();
        assert_eq!(
            cuptiSubscribe(&mut other, std::ptr::null_mut(), std::ptr::null_mut()),
            result::MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED,
            "one subscriber, as CUPTI"
        );
        assert_eq!(cuptiEnableCallback(1, sub, 3, 2), 0);
        assert_eq!(
            cuptiActivityRegisterCallbacks(Some(request), Some(complete)),
            0
        );
        assert_eq!(
            cuptiActivityRegisterTimestampCallback(Some(profiler_clock)),
            0
        );
        for k in TRACED {
            assert_eq!(cuptiActivityEnable(k), 0, "kind {k}");
        }
        assert_eq!(cuptiActivityEnable(kind::RUNTIME), 0, "accepted, said once");
        assert_eq!(
            cuptiActivityEnable(48),
            result::NOT_SUPPORTED,
            "unknown kind refused"
        );
        assert_eq!(
            OUTSTANDING.load(Ordering::SeqCst),
            1,
            "a buffer is asked for as tracing starts: Kineto flushes only while it has one out"
        );

        let f = host_function(c"fill_u32");
        let mut p = 0u64;
        ok(cuMemAlloc_v2(&mut p, 64));
        let t_begin = profiler_clock();
        assert_eq!(cuptiActivityPushExternalCorrelationId(3, 42), 0);
        fill_kernel(p, 7, 16, std::ptr::null_mut());
        fill_kernel(p, 8, 16, std::ptr::null_mut());
        let mut popped = 0u64;
        assert_eq!(cuptiActivityPopExternalCorrelationId(3, &mut popped), 0);
        assert_eq!(popped, 42);
        ok(cuMemsetD32_v2(p, 0, 16));
        let host = [5u32; 16];
        ok(cuMemcpyHtoD_v2(p, host.as_ptr() as *const c_void, 64));
        let mut back = [0u32; 16];
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, p, 64));
        assert_eq!(back, host, "the work itself is unchanged by tracing");
        ok(cuStreamSynchronize(std::ptr::null_mut()));
        ok(cuCtxSynchronize());
        assert_eq!(cuptiActivityFlushAll(1), 0);
        let t_end = profiler_clock();
        assert_eq!(
            OUTSTANDING.load(Ordering::SeqCst),
            1,
            "a forced flush gives every buffer back and asks for one to go on with"
        );

        let all = take_records();
        let kernels = of_kind(&all, kind::CONCURRENT_KERNEL);
        assert_eq!(kernels.len(), 2, "one record per launch");
        let corr: Vec<u32> = kernels
            .iter()
            .map(|k| u32_at(k, off::kernel::CORRELATION_ID))
            .collect();
        assert!(corr[0] < corr[1]);
        for k in &kernels {
            let name = CStr::from_ptr(u64_at(k, off::kernel::NAME) as *const _);
            assert_eq!(name.to_str().unwrap(), "fill_u32");
            assert_eq!(u32_at(k, off::kernel::GRID), 1);
            assert_eq!(u32_at(k, off::kernel::BLOCK), 1);
            let (s, e) = (u64_at(k, off::kernel::START), u64_at(k, off::kernel::END));
            assert!(
                t_begin <= s && s <= e && e <= t_end,
                "{t_begin} {s} {e} {t_end}"
            );
            assert_eq!(u64_at(k, off::kernel::COMPLETED), e);
        }
        assert!(
            u64_at(kernels[1], off::kernel::START) >= u64_at(kernels[0], off::kernel::END),
            "two kernels of one stream in order"
        );
        assert_eq!(
            u32_at(kernels[0], off::kernel::STREAM_ID),
            u32_at(kernels[1], off::kernel::STREAM_ID)
        );

        let driver = of_kind(&all, kind::DRIVER);
        let launches: Vec<u32> = driver
            .iter()
            .filter(|r| u32_at(r, off::api::CBID) == 307)
            .map(|r| u32_at(r, off::api::CORRELATION_ID))
            .collect();
        assert_eq!(
            launches, corr,
            "each kernel's launch call, by correlation id"
        );
        assert!(driver
            .iter()
            .all(|r| u32_at(r, off::api::PROCESS_ID) == std::process::id()));

        let external: Vec<(u32, u64, u32)> = of_kind(&all, kind::EXTERNAL_CORRELATION)
            .iter()
            .map(|r| {
                (
                    u32_at(r, off::external::EXTERNAL_KIND),
                    u64_at(r, off::external::EXTERNAL_ID),
                    u32_at(r, off::external::CORRELATION_ID),
                )
            })
            .collect();
        assert_eq!(
            external,
            vec![(3, 42, corr[0]), (3, 42, corr[1])],
            "the pushed id names both launches and nothing after the pop"
        );

        let memsets = of_kind(&all, kind::MEMSET);
        assert_eq!(memsets.len(), 1);
        assert_eq!(u64_at(memsets[0], off::memset::BYTES), 64);
        let copies: Vec<(u8, u8, u8, u64)> = of_kind(&all, kind::MEMCPY)
            .iter()
            .map(|r| (r[4], r[5], r[6], u64_at(r, off::memcpy::BYTES)))
            .collect();
        assert_eq!(
            copies,
            vec![(1, 1, 3, 64), (2, 3, 1, 64)],
            "HtoD then DtoH, pageable"
        );
        let syncs: Vec<u32> = of_kind(&all, kind::SYNCHRONIZATION)
            .iter()
            .map(|r| u32_at(r, off::sync::TYPE))
            .collect();
        assert_eq!(syncs, vec![3, 4], "the stream's wait, then the context's");

        // A capture while tracing: the launch into it becomes a graph node, not timed
        // work (no event goes into the graph), and the profiler's own calls meanwhile
        // (a flush's queries) leave the capture valid.
        let mut cs = std::ptr::null_mut();
        ok(omps_shim::api::exec::cuStreamCreate(&mut cs, 1));
        // Work still untimed when the capture begins: the flush inside it queries it.
        fill_kernel(p, 12, 16, std::ptr::null_mut());
        ok(omps_shim::api::capture::cuStreamBeginCapture_v2(cs, 0));
        fill_kernel(p, 10, 16, cs);
        assert_eq!(cuptiActivityFlushAll(0), 0);
        let mut g = std::ptr::null_mut();
        ok(omps_shim::api::capture::cuStreamEndCapture(cs, &mut g));
        assert!(!g.is_null(), "the capture stayed valid");
        let mut nodes = 0usize;
        ok(omps_shim::api::graph::cuGraphGetNodes(
            g,
            std::ptr::null_mut(),
            &mut nodes,
        ));
        assert_eq!(nodes, 1, "the kernel alone: no timing event in the graph");
        assert_eq!(cuptiActivityFlushAll(1), 0);
        let all = take_records();
        assert_eq!(
            of_kind(&all, kind::CONCURRENT_KERNEL).len(),
            1,
            "the launch before the capture; the captured one runs later, as a graph's node"
        );
        assert_eq!(
            of_kind(&all, kind::DRIVER).len(),
            2,
            "both calls are recorded"
        );
        let mut last = 0u64;
        assert_eq!(
            cuptiActivityPopExternalCorrelationId(3, &mut last),
            result::QUEUE_EMPTY
        );

        // Graph replays: each kernel node of each replay is a record, named, with the
        // replay's correlation id, timed by the server's twin of the graph, though the
        // program destroyed its graph right after instantiating it (as PyTorch does).
        {
            use omps_shim::api::graph::*;
            // The capture stream of before: the test server has few work streams.
            let gs = cs;
            ok(omps_shim::api::capture::cuStreamBeginCapture_v2(gs, 0));
            fill_kernel(p, 20, 16, gs);
            ok(cuMemsetD32Async(p, 0, 16, gs));
            fill_kernel(p, 21, 16, gs);
            let mut g = std::ptr::null_mut();
            ok(omps_shim::api::capture::cuStreamEndCapture(gs, &mut g));
            let mut exec = std::ptr::null_mut();
            ok(cuGraphInstantiateWithFlags(&mut exec, g, 0));
            ok(cuGraphDestroy(g));
            assert_eq!(cuptiActivityFlushAll(1), 0);
            let _ = take_records();
            ok(cuGraphLaunch(exec, gs));
            ok(cuGraphLaunch(exec, gs));
            ok(cuStreamSynchronize(gs));
            let mut back = [0u32; 16];
            ok(cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, p, 64));
            assert_eq!(back, [21; 16], "the twin ran the graph's work");
            assert_eq!(cuptiActivityFlushAll(1), 0);
            let all = take_records();
            let nodes = of_kind(&all, kind::CONCURRENT_KERNEL);
            assert_eq!(nodes.len(), 4, "two kernel nodes, two replays");
            let sets = of_kind(&all, kind::MEMSET);
            assert_eq!(sets.len(), 2, "a memset node, two replays");
            assert_eq!(u64_at(sets[0], off::memset::BYTES), 64);
            assert_eq!(
                u32_at(sets[0], off::memset::CORRELATION_ID),
                u32_at(nodes[0], off::kernel::CORRELATION_ID),
                "a replay's nodes share its correlation id"
            );
            let corr: Vec<u32> = nodes
                .iter()
                .map(|k| u32_at(k, off::kernel::CORRELATION_ID))
                .collect();
            assert!(corr[0] == corr[1] && corr[2] == corr[3] && corr[1] != corr[2]);
            for k in &nodes {
                let name = CStr::from_ptr(u64_at(k, off::kernel::NAME) as *const _);
                assert_eq!(name.to_str().unwrap(), "fill_u32");
                assert!(u64_at(k, off::kernel::START) <= u64_at(k, off::kernel::END));
            }
            for w in nodes.windows(2) {
                assert!(
                    u64_at(w[1], off::kernel::START) >= u64_at(w[0], off::kernel::END),
                    "nodes of a chain, replays of a stream, in order"
                );
            }
            ok(cuGraphExecDestroy(exec));
        }

        // KERNEL alone: the serialized kind's records.
        assert_eq!(cuptiActivityDisable(kind::CONCURRENT_KERNEL), 0);
        assert_eq!(cuptiActivityEnable(kind::KERNEL), 0);
        fill_kernel(p, 11, 16, std::ptr::null_mut());
        ok(cuCtxSynchronize());
        assert_eq!(cuptiActivityFlushAll(1), 0);
        assert_eq!(of_kind(&take_records(), kind::KERNEL).len(), 1);
        assert_eq!(cuptiActivityDisable(kind::KERNEL), 0);

        // Four threads launching and copying back at once, past the untimed-span bound
        // (the oldest are then waited for from the program's own calls): nothing lost,
        // nothing stuck.
        assert_eq!(cuptiActivityDisable(kind::DRIVER), 0);
        assert_eq!(cuptiActivityEnable(kind::CONCURRENT_KERNEL), 0);
        const THREADS: usize = 4;
        const EACH: usize = 400;
        let ctx = {
            let mut c = std::ptr::null_mut();
            ok(omps_shim::api::ctx::cuCtxGetCurrent(&mut c));
            c as usize
        };
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                std::thread::spawn(move || {
                    ok(omps_shim::api::ctx::cuCtxSetCurrent(ctx as _));
                    let mut s = std::ptr::null_mut();
                    ok(omps_shim::api::exec::cuStreamCreate(&mut s, 1));
                    let mut q = 0u64;
                    ok(cuMemAlloc_v2(&mut q, 64));
                    for i in 0..EACH {
                        fill_kernel(q, (t * EACH + i) as u32, 16, s);
                        if i % 50 == 0 {
                            let mut out = [0u32; 16];
                            ok(cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut c_void, q, 64));
                        }
                    }
                    ok(cuStreamSynchronize(s));
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(cuptiActivityFlushAll(1), 0);
        let all = take_records();
        assert_eq!(
            of_kind(&all, kind::CONCURRENT_KERNEL).len(),
            THREADS * EACH,
            "every launch of every thread"
        );
        let mut dropped = 0usize;
        assert_eq!(
            cuptiActivityGetNumDroppedRecords(std::ptr::null_mut(), 0, &mut dropped),
            0
        );
        assert_eq!(dropped, 0);

        // Off: work goes on, nothing is recorded.
        for k in TRACED {
            assert_eq!(cuptiActivityDisable(k), 0);
        }
        fill_kernel(p, 9, 16, std::ptr::null_mut());
        ok(cuCtxSynchronize());
        assert_eq!(cuptiActivityFlushAll(1), 0);
        assert!(
            take_records().is_empty(),
            "nothing recorded with activity off"
        );
        assert_eq!(
            OUTSTANDING.load(Ordering::SeqCst),
            0,
            "with every kind off, no buffer is kept"
        );
        let _ = f;
        assert_eq!(cuptiUnsubscribe(sub), 0);
        assert_eq!(cuptiFinalize(), 0);
    }
}
