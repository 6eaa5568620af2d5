//! Clients that try to stall or reach others through the scheduler (issue 23, findings 2,
//! 3 and 8): the hardware queues they hold, the driver operations they queue behind a long
//! kernel, and the work streams they capture on. The host GPU plays the queues and the
//! driver's depth bound (omps-server/src/gpu_host/queues.rs).

mod common;
use common::*;
use omps_ring::wire::{self, CallHdr, HandleCall, Op};
use omps_shim::conn::Conn;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Runs `f` on a thread; its result if it returns within `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// Memset of `dst` to `value` on the default stream, then a synchronization of it.
fn memset_and_sync(c: &Conn, dst: u64, value: u32) -> Result<(), i32> {
    memset_words(c, 0, dst, value);
    sync_default_stream(c)
}

fn host_func(c: &Conn, stream: u32, slot: u32, seq: u32) {
    let h = wire::HostFunc {
        stream,
        slot,
        seq,
        _pad: 0,
    };
    c.push(0, Op::HostFunc, &[bytemuck::bytes_of(&h)]).unwrap();
}

/// Finding 2: a client whose streams each wait for a host function it never acknowledges
/// holds every hardware queue it is given. It is given only its share, so a newcomer's
/// work runs on a queue of its own.
#[test]
fn host_functions_never_acknowledged_leave_queues_to_others() {
    let srv = TestServer::start("queues-held");
    srv.gpu.model_queues(true);
    let a = Conn::connect_to(&srv.socket()).unwrap();
    // More streams than the host GPU's normal class has (8) and queues (4).
    for id in 1..=12u32 {
        stream_create(&a, id);
        host_func(&a, id, id, 1);
    }
    a.ping(0).unwrap();
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let p = alloc(&b, 4096);
    let b = within(Duration::from_secs(3), move || {
        let r = memset_and_sync(&b, p, 7);
        (b, r)
    });
    // Let the attacker's functions go before asserting, so the server can shut down.
    for slot in 1..=12 {
        a.seg()
            .hostfn(slot)
            .unwrap()
            .ack
            .store(1, Ordering::Release);
    }
    let (b, r) = b.expect("a newcomer's synchronize waited behind another client's queues");
    assert_eq!(r, Ok(()));
    assert_eq!(
        srv.gpu.peek(p, 4).unwrap(),
        7u32.to_le_bytes(),
        "its memset ran"
    );
    b.ping(0).unwrap();
    a.ping(0).unwrap();
}

/// Finding 8: clients that capture on every work stream they can get leave one that no
/// capture holds; a newcomer's work never goes into their graphs.
#[test]
fn a_capturing_stream_is_never_handed_to_another_client() {
    let srv = TestServer::start("capture-hijack");
    let attackers: Vec<Conn> = (0..3)
        .map(|_| Conn::connect_to(&srv.socket()).unwrap())
        .collect();
    let mut captured = 0;
    for (k, a) in attackers.iter().enumerate() {
        for id in 1..=8u32 {
            stream_create(a, id);
            if capture(a, Op::CaptureBegin, id).is_ok() {
                captured += 1;
            } else {
                // Refused as the driver refuses a stream it cannot capture.
                assert_eq!(
                    capture(a, Op::CaptureBegin, id),
                    Err(900),
                    "attacker {k}, stream {id}"
                );
            }
        }
    }
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let p = alloc(&b, 4096);
    let b = within(Duration::from_secs(3), move || {
        let r = memset_and_sync(&b, p, 7);
        (b, r)
    });
    let (b, r) = b.expect("the newcomer's synchronize went into another client's capture");
    assert_eq!(r, Ok(()));
    assert_eq!(srv.gpu.peek(p, 4).unwrap(), 7u32.to_le_bytes());
    // Each attacker got its share of the queues' streams, one stream stayed shareable.
    assert!(
        (4..8).contains(&captured),
        "{captured} of the class's 8 work streams captured"
    );
    // Their captures end cleanly, with graphs of their own.
    for a in &attackers {
        for id in 1..=8u32 {
            if let Ok(g) = capture(a, Op::CaptureEnd, id) {
                assert_ne!(g, 0);
            }
        }
        a.ping(0).unwrap();
    }
    memset_and_sync(&b, p, 9).unwrap();
    assert_eq!(srv.gpu.peek(p, 4).unwrap(), 9u32.to_le_bytes());
}

/// Runs `flood` (client a's work, on a thread of its own) behind a long kernel on the host
/// GPU's depth model, while client b, of the same lane, pings: b must be answered at once
/// and no stream may near the driver's bound. The kernel then ends and both go on.
fn lane_stays_free_behind_a_long_kernel(
    tag: &str,
    flood: impl FnOnce(&Conn, u64) + Send + 'static,
) {
    let srv = TestServer::start(tag);
    srv.gpu.model_depth(true);
    let a = Conn::connect_to(&srv.socket()).unwrap();
    // A client of the same lane (the test server has two: id modulo 2).
    let mut others = Vec::new();
    let b = loop {
        let c = Conn::connect_to(&srv.socket()).unwrap();
        if c.client_id() % 2 == a.client_id() % 2 {
            break c;
        }
        others.push(c);
    };
    let p = alloc(&a, 4096);
    memset_and_sync(&a, p, 1).unwrap();
    // The long kernel.
    srv.gpu.stick_releases(true);
    let sender = std::thread::spawn(move || {
        flood(&a, p);
        a
    });
    std::thread::sleep(Duration::from_millis(300));
    let worst = within(Duration::from_secs(3), move || {
        let mut worst = Duration::ZERO;
        for _ in 0..20 {
            let t = Instant::now();
            b.ping(0).unwrap();
            worst = worst.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(20));
        }
        (b, worst)
    });
    let deepest = srv.gpu.deepest_stream();
    // The kernel ends before any assertion, so that a failure cannot hang the shutdown.
    srv.gpu.stick_releases(false);
    let (b, worst) = worst.expect("a client of the same lane waited for the driver");
    assert!(
        worst < Duration::from_millis(500),
        "a ping of the same lane took {worst:?}"
    );
    assert!(
        deepest <= 900,
        "{deepest} operations queued on one stream behind the kernel"
    );
    let a = sender.join().unwrap();
    memset_and_sync(&a, p, 2).unwrap();
    b.ping(0).unwrap();
}

/// Finding 3: synchronizations queued behind a long kernel are driver operations as
/// launches are. Uncounted, 4,000 of them led the worker into the driver's wait at about
/// a thousand, and every client of its lane with it; counted, their client is held back
/// on its own ring and another client of the lane is answered at once.
#[test]
fn stream_syncs_behind_a_long_kernel_do_not_hold_up_the_lane() {
    lane_stays_free_behind_a_long_kernel("deep-syncs", |a, p| {
        // New work, so that no synchronization is answered from the CPU.
        memset_words(a, 0, p, 3);
        let mut ch = a.channel();
        for _ in 0..4000 {
            let call: CallHdr = ch.next_call();
            let h = HandleCall {
                call,
                id: 0,
                _pad: 0,
            };
            a.push(0, Op::StreamSync, &[bytemuck::bytes_of(&h)])
                .unwrap();
        }
    });
}

/// Streams given up behind a long kernel: each leaves an event recorded on its work
/// stream, and past 64 of them the client's sync stream waits for them all. Uncounted,
/// about thirty such folds put over a thousand operations on the sync stream and the
/// worker into the driver's wait; counted, the client is held back on its own ring and
/// another client of the lane is answered at once.
#[test]
fn streams_given_up_behind_a_long_kernel_do_not_hold_up_the_lane() {
    lane_stays_free_behind_a_long_kernel("deep-give-ups", |a, p| {
        for id in 1..=1500u32 {
            stream_create(a, id);
            memset_words_on(a, id, p, id, 0);
            a.push(
                0,
                Op::StreamDestroy,
                &[bytemuck::bytes_of(&omps_ring::wire::Handle { id, _pad: 0 })],
            )
            .unwrap();
        }
    });
}

/// Found in review: one record on the legacy stream ordered it after every dirty blocking
/// stream of the client, an event and a wait each: with 1,200 of them behind a long
/// kernel, one memset put 1,200 waits on the legacy work stream, past the driver's bound,
/// inside one record the depth hold never saw. Now each work stream is ordered once.
#[test]
fn one_legacy_record_after_many_blocking_streams_does_not_hold_up_the_lane() {
    lane_stays_free_behind_a_long_kernel("deep-legacy-order", |a, p| {
        for id in 1..=1200u32 {
            let sc = omps_ring::wire::StreamCreate {
                id,
                flags: 0, // blocking: ordered against the legacy stream
                ..Default::default()
            };
            a.push(0, Op::StreamCreate, &[bytemuck::bytes_of(&sc)])
                .unwrap();
            memset_words_on(a, id, p, id, 0);
        }
        memset_words_on(a, 0, p, 7, 0);
    });
}

/// A client of the same lane as `a` (the test server has two: id modulo 2), and the
/// clients connected on the way, to keep open.
fn same_lane(srv: &TestServer, a: &Conn) -> (Conn, Vec<Conn>) {
    let mut others = Vec::new();
    loop {
        let c = Conn::connect_to(&srv.socket()).unwrap();
        if c.client_id() % 2 == a.client_id() % 2 {
            return (c, others);
        }
        others.push(c);
    }
}

/// A host module whose load takes the host GPU's `slow_loads` time, with a global of
/// 4 KiB (device memory its unload gives back).
const SLOW_IMAGE: &[u8] = b"omps-host-module\nfn omps-host-slow-load 0:8\nglobal g 4096\n\0";

/// Found in review: a module load ran on the lane, verifier and driver compile included,
/// so PTX made to compile slowly stopped every other client of the lane for as long.
/// Now it compiles off the lane (omps-server/src/compile.rs): only its client waits, and
/// another client of the same lane keeps getting its pings and memsets answered.
#[test]
fn a_slow_module_load_does_not_hold_up_the_lane() {
    let srv = TestServer::start("slow-load");
    srv.gpu.slow_loads(Duration::from_secs(2));
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let (b, _others) = same_lane(&srv, &a);
    let p = alloc(&b, 4096);
    let loader = std::thread::spawn(move || {
        let r = load_image(&a, SLOW_IMAGE);
        (a, r)
    });
    std::thread::sleep(Duration::from_millis(200));
    let worst = within(Duration::from_secs(10), move || {
        let mut worst = Duration::ZERO;
        for k in 0..10 {
            let t = Instant::now();
            b.ping(0).unwrap();
            memset_and_sync(&b, p, k).unwrap();
            worst = worst.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(20));
        }
        (b, worst)
    });
    let (a, r) = loader.join().unwrap();
    let (b, worst) = worst.expect("a client of the same lane waited for the load");
    assert!(
        worst < Duration::from_millis(500),
        "a ping and memset of the same lane took {worst:?} behind another client's load"
    );
    let (_, funcs) = r.expect("the slow load itself succeeds");
    assert_eq!(funcs.len(), 1);
    assert_eq!(srv.gpu.peek(p, 4).unwrap(), 9u32.to_le_bytes());
    a.ping(0).unwrap();
    b.ping(0).unwrap();
}

/// A client that goes while its load compiles off the lane leaves nothing behind: the
/// module loaded after it left is unloaded (its global's memory with it), and the server
/// serves the next client.
#[test]
fn a_client_gone_during_its_load_leaves_nothing_behind() {
    let srv = TestServer::start("gone-during-load");
    srv.gpu.slow_loads(Duration::from_millis(600));
    let before = srv.gpu.bytes_allocated();
    let a = Conn::connect_to(&srv.socket()).unwrap();
    // The load, its answer never waited for.
    push_load(&a, SLOW_IMAGE);
    std::thread::sleep(Duration::from_millis(150));
    drop(a);
    assert!(
        eventually(|| srv.gpu.module_loads() == (1, 0) && srv.gpu.bytes_allocated() == before),
        "left behind: (loads, loaded) {:?}, {} bytes",
        srv.gpu.module_loads(),
        srv.gpu.bytes_allocated() - before
    );
    let c = Conn::connect_to(&srv.socket()).unwrap();
    c.ping(0).unwrap();
    let (_, funcs) = load_image(&c, b"omps-host-module\nfn k 0:8\n\0").unwrap();
    assert_eq!(funcs.len(), 1);
}
