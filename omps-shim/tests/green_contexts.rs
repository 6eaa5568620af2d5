//! Green contexts on the host GPU (4 SMs in chunks of one): a client carves its own share
//! as the driver lets it, and the server runs the work of a green context's streams in
//! the confinement slot of its SM count, never wider than the client's share.

mod common;
use common::*;
use omps_ring::wire::{self, ClientSettings, GreenCall, Op};
use omps_server::gpu::Gpu;
use omps_shim::api::ctx::*;
use omps_shim::api::exec::*;
use omps_shim::api::green::*;
use omps_shim::api::green_res::*;
use omps_shim::api::mem::*;
use omps_shim::conn::Conn;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::ptr::null_mut;

/// The confinement slot of the work stream the host GPU's last launch ran on.
fn last_slot(srv: &TestServer) -> Option<usize> {
    srv.gpu.layout().slot_at(srv.gpu.last_launch_stream())
}

/// Bound work streams of client `id` in the normal class (`omps-ctl stats`).
fn normal_streams(srv: &TestServer, id: u32) -> u32 {
    let (_, stats) = srv.ctl("stats");
    let row = stats
        .lines()
        .find(|l| l.starts_with(&format!("client {id} ")))
        .unwrap_or_else(|| panic!("no row for client {id}:\n{stats}"));
    let f: Vec<&str> = row.split_whitespace().collect();
    let at = f.iter().position(|&w| w == "streams").unwrap();
    f[at + 1].split(['/', '@']).nth(1).unwrap().parse().unwrap()
}

fn zeroed() -> CUdevResource {
    // SAFETY: a plain C struct; zeroes are its invalid value.
    unsafe { std::mem::zeroed() }
}

/// Fills 64 words at `p` with `v` on stream `s`, through the shim.
fn fill(f: CUfunction, s: CUstream, p: u64, v: u32) {
    let (mut ptr, mut val, mut cnt) = (p, v, 64u32);
    let mut args = [
        &mut ptr as *mut _ as *mut c_void,
        &mut val as *mut _ as *mut c_void,
        &mut cnt as *mut _ as *mut c_void,
    ];
    // SAFETY: the arguments are valid locals of fill_u32's layout.
    ok(unsafe { cuLaunchKernel(f, 1, 1, 1, 64, 1, 1, 0, s, args.as_mut_ptr(), null_mut()) });
}

fn words(p: u64) -> Vec<u32> {
    let mut back = vec![0u32; 64];
    // SAFETY: 256 writable bytes.
    ok(unsafe { cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, p, 256) });
    back
}

#[test]
fn a_green_context_of_two_sms_runs_its_streams_on_two_sms() {
    // Every queue to the client: each of its streams then gets a work stream of its own,
    // which the count of bound streams below relies on.
    let srv = start_as_client_with("green", |c| c.client_queues = Some(4));
    // SAFETY (whole test): every pointer passed is a valid local or a handle just made.
    unsafe {
        // The client's view: its 4 SMs, confined in chunks of one.
        let mut all = zeroed();
        ok(cuDeviceGetDevResource(0, &mut all, 1));
        assert_eq!(
            (all.type_, all.sm_count, all.min_sm_partition_size),
            (1, 4, 1)
        );
        assert_eq!(
            cuDeviceGetDevResource(0, &mut all, 2),
            CUDA_ERROR_INVALID_RESOURCE_TYPE
        );
        assert_eq!(
            cuDeviceGetDevResource(0, null_mut(), 1),
            CUDA_ERROR_INVALID_VALUE
        );

        // Splits: counted, made, refused as the driver refuses them.
        let mut n = 0;
        ok(cuDevSmResourceSplitByCount(
            null_mut(),
            &mut n,
            &all,
            null_mut(),
            0,
            2,
        ));
        assert_eq!(n, 2, "4 SMs hold two groups of 2");
        assert_eq!(
            cuDevSmResourceSplitByCount(null_mut(), &mut n, &all, null_mut(), 0, 5),
            CUDA_ERROR_INVALID_VALUE,
            "more SMs than the input has"
        );
        assert_eq!(
            cuDevSmResourceSplitByCount(null_mut(), &mut n, &all, null_mut(), 8, 2),
            CUDA_ERROR_INVALID_VALUE,
            "unknown flags"
        );
        let (mut groups, mut rest) = ([zeroed(), zeroed()], zeroed());
        let mut n = 1;
        ok(cuDevSmResourceSplitByCount(
            groups.as_mut_ptr(),
            &mut n,
            &all,
            &mut rest,
            0,
            2,
        ));
        assert_eq!((n, groups[0].sm_count, rest.sm_count), (1, 2, 2));
        assert_eq!(
            cuDevSmResourceSplitByCount(null_mut(), &mut n, &groups[0], null_mut(), 0, 1),
            CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
            "a piece is split again only through a green context"
        );
        let mut other = [zeroed()];
        let mut one = 1;
        ok(cuDevSmResourceSplitByCount(
            other.as_mut_ptr(),
            &mut one,
            &all,
            null_mut(),
            0,
            1,
        ));

        // Descriptors: of one split's pieces, each once.
        let mut desc = null_mut();
        let forged = CUdevResource {
            type_: 1,
            sm_count: 2,
            ..zeroed()
        };
        assert_eq!(
            cuDevResourceGenerateDesc(&mut desc, &forged, 1),
            CUDA_ERROR_INVALID_VALUE
        );
        let mixed = [groups[0], other[0]];
        assert_eq!(
            cuDevResourceGenerateDesc(&mut desc, mixed.as_ptr(), 2),
            CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION
        );
        let twice = [groups[0], groups[0]];
        assert_eq!(
            cuDevResourceGenerateDesc(&mut desc, twice.as_ptr(), 2),
            CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION
        );
        ok(cuDevResourceGenerateDesc(&mut desc, groups.as_ptr(), 1));

        let mut g = null_mut();
        assert_eq!(
            cuGreenCtxCreate(&mut g, desc, 0, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuGreenCtxCreate(&mut g, desc, 1, 1),
            CUDA_ERROR_INVALID_DEVICE
        );
        ok(cuGreenCtxCreate(&mut g, desc, 0, 1));
        let mut r = zeroed();
        ok(cuGreenCtxGetDevResource(g, &mut r, 1));
        assert_eq!(r.sm_count, 2);
        let (mut gctx, mut primary) = (null_mut(), null_mut());
        ok(cuCtxFromGreenCtx(&mut gctx, g));
        ok(cuCtxGetCurrent(&mut primary));
        ok(cuCtxGetDevResource(gctx, &mut r, 1));
        assert_eq!(r.sm_count, 2);
        ok(cuCtxGetDevResource(primary, &mut r, 1));
        assert_eq!(r.sm_count, 4);

        let f = host_function(c"fill_u32");
        let mut p = 0u64;
        ok(cuMemAlloc_v2(&mut p, 3 * 256));

        // Its legacy stream: stream 0 while its context is current.
        ok(cuCtxPushCurrent_v2(gctx));
        fill(f, null_mut(), p, 11);
        assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
        assert_eq!(
            last_slot(&srv),
            Some(1),
            "2 SMs: the slot of the last 2 chunks"
        );
        assert_eq!(srv.gpu.confinement(1).unwrap().chunks, vec![2, 3]);
        let (mut id, mut via_null) = (0u64, 0u64);
        ok(cuGreenCtxGetId(g, &mut id));
        ok(cuGreenCtxGetId(null_mut(), &mut via_null));
        assert_eq!(id, via_null, "null names the current green context");
        let mut of = null_mut();
        ok(cuStreamGetGreenCtx(null_mut(), &mut of));
        assert_eq!(of, g);

        // A stream made in it by cuStreamCreate while it is current.
        let mut s2 = null_mut();
        ok(cuStreamCreate(&mut s2, 0));
        fill(f, s2, p + 256, 22);
        ok(cuStreamSynchronize(s2));
        assert_eq!(last_slot(&srv), Some(1));
        let mut pc = null_mut();
        ok(cuCtxPopCurrent_v2(&mut pc));
        assert_eq!(pc, gctx);

        // One made by cuGreenCtxStreamCreate (non-blocking only).
        let mut s = null_mut();
        assert_eq!(
            cuGreenCtxStreamCreate(&mut s, g, 0, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        ok(cuGreenCtxStreamCreate(&mut s, g, 1, 0));
        ok(cuStreamGetGreenCtx(s, &mut of));
        assert_eq!(of, g);
        let mut sc = null_mut();
        ok(cuStreamGetCtx(s, &mut sc));
        assert_eq!(sc, gctx as *mut c_void);
        fill(f, s, p + 512, 33);
        ok(cuStreamSynchronize(s));
        assert_eq!(last_slot(&srv), Some(1));

        // The primary context's legacy stream is another stream, on the whole device.
        fill(f, null_mut(), p, 44);
        ok(cuCtxSynchronize());
        assert_eq!(last_slot(&srv), None);
        ok(cuStreamGetGreenCtx(null_mut(), &mut of));
        assert!(of.is_null());
        let w = words(p);
        assert!(w.iter().all(|&x| x == 44), "{w:?}");
        let w = words(p + 256);
        assert!(w.iter().all(|&x| x == 22), "{w:?}");
        let w = words(p + 512);
        assert!(w.iter().all(|&x| x == 33), "{w:?}");

        let mut e = null_mut();
        ok(cuEventCreate(&mut e, 0));
        ok(cuGreenCtxRecordEvent(g, e));
        ok(cuEventSynchronize(e));
        ok(cuGreenCtxWaitEvent(g, e));
        ok(cuCtxSynchronize());

        // Destroy frees its streams (legacy, made while current, made for it, the join
        // stream of the event record): the server holds 4 fewer work streams for it.
        let held = normal_streams(&srv, 1);
        ok(cuGreenCtxDestroy(g));
        assert_eq!(cuGreenCtxDestroy(g), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(cuCtxFromGreenCtx(&mut gctx, g), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(cuStreamGetGreenCtx(s, &mut of), CUDA_ERROR_INVALID_HANDLE);
        ok(cuStreamDestroy_v2(s));
        assert_eq!(cuStreamDestroy_v2(s), CUDA_ERROR_INVALID_HANDLE);
        ok(cuStreamDestroy_v2(s2));
        ok(cuCtxSynchronize());
        assert_eq!(normal_streams(&srv, 1), held - 4);
    }
}

fn green_call(c: &Conn, kind: u32, green: u32, sms: u32, stream: u32) -> Result<(), i32> {
    let mut ch = c.channel();
    ch.call(0, Op::Green, |call| {
        bytemuck::bytes_of(&GreenCall {
            call,
            kind,
            green,
            sms,
            stream,
            flags: 1,
            priority: 0,
        })
        .to_vec()
    })
}

/// Launches fill_u32 over 16 words at `p` on stream `stream` of a raw connection, and
/// waits until the server handled it.
fn raw_fill(c: &Conn, func: u32, stream: u32, p: u64) {
    let l = wire::Launch {
        func,
        stream,
        grid: [1; 3],
        block: [16, 1, 1],
        args_len: 16,
        ..Default::default()
    };
    let mut args = p.to_le_bytes().to_vec();
    args.extend(5u32.to_le_bytes());
    args.extend(16u32.to_le_bytes());
    c.push(0, Op::Launch, &[bytemuck::bytes_of(&l), &args])
        .unwrap();
    c.ping(0).unwrap();
}

#[test]
fn a_green_context_never_widens_a_clients_share_and_a_lie_cuts_off_only_the_liar() {
    let srv = TestServer::start("green-raw");
    let quarter = ClientSettings {
        thread_milli_pct: wire::parse_percentage("25").unwrap(),
        ..ClientSettings::none()
    };
    let a = Conn::connect_with(&srv.socket(), &quarter).unwrap();
    let fill = load_image(&a, HOST_MODULE.as_bytes()).unwrap().1[0].1;
    let p = alloc(&a, 4096);
    // The server says how it confines: 4 SMs in chunks of one.
    let mut ch = a.channel();
    ch.call(0, Op::Green, |call| {
        bytemuck::bytes_of(&GreenCall {
            call,
            ..Default::default()
        })
        .to_vec()
    })
    .unwrap();
    let info = ch.reply::<wire::GreenInfo>();
    drop(ch);
    assert_eq!((info.total, info.chunk, info.chunks), (4, 1, 4));
    // A 25% client (one chunk) asking for every SM gets its one chunk, no more.
    green_call(&a, wire::green::CREATE, 1, 4, 100).unwrap();
    raw_fill(&a, fill, 100, p);
    assert_eq!(last_slot(&srv), Some(0), "its own slot: the last chunk");
    green_call(&a, wire::green::STREAM, 1, 0, 101).unwrap();
    raw_fill(&a, fill, 101, p);
    assert_eq!(last_slot(&srv), Some(0));
    green_call(&a, wire::green::DESTROY, 1, 0, 0).unwrap();

    // Lies: more SMs than the GPU has, a stream of no green context, an id used twice,
    // an unknown kind. Each cuts off that client and no other.
    let lies: [(u32, u32, u32, u32); 4] = [
        (wire::green::CREATE, 1, 99, 200),
        (wire::green::STREAM, 7, 0, 200),
        (wire::green::CREATE, 0, 1, 200),
        (9, 1, 1, 200),
    ];
    for (kind, green, sms, stream) in lies {
        let liar = Conn::connect_to(&srv.socket()).unwrap();
        let _ = green_call(&liar, kind, green, sms, stream);
        assert!(
            wait_disconnected(&liar),
            "kind {kind} green {green} sms {sms}: not cut off"
        );
        raw_fill(&a, fill, 0, p);
        assert!(a.check_alive().is_ok(), "an honest client was cut off");
    }
    sync_default_stream(&a).unwrap();
}
