//! No worker waits for the GPU on a client's behalf: frees (and module unloads) that the
//! driver holds up (behind a long kernel, on a real GPU) leave every client's calls
//! answered. The host GPU's "stuck" switch plays the long kernel.

mod common;
use common::*;
use omps_ring::wire::{self, Op};
use omps_shim::conn::Conn;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Runs `f` on a thread; its result, or None if it has not returned within 5 s.
fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(5)).ok()
}

#[test]
fn frees_the_gpu_holds_up_stall_no_client() {
    let srv = TestServer::start("stuck");
    // Three clients: with two lanes, the first and the third share one.
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let p = alloc(&a, 1 << 20);
    srv.gpu.stick_releases(true);
    a.push(
        0,
        Op::MemFree,
        &[bytemuck::bytes_of(&wire::MemFree { ptr: p })],
    )
    .unwrap();
    // A client that exits leaves its memory to be freed too.
    alloc(&c, 1 << 20);
    drop(c);
    let answered = within_5s(move || {
        for _ in 0..50 {
            a.ping(0).unwrap();
            b.ping(0).unwrap();
        }
        let q = alloc(&a, 4096);
        (a, b, q)
    });
    let held = srv.gpu.bytes_allocated();
    // Unstuck before any assertion, so that a failure cannot hang the server's shutdown.
    srv.gpu.stick_releases(false);
    let (a, _b, q) = answered.expect("a client's calls waited for a stuck free");
    assert!(q != 0);
    assert_eq!(held, (2 << 20) + 4096, "the stuck frees had not happened");
    let t = Instant::now();
    while srv.gpu.bytes_allocated() != 4096 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(srv.gpu.bytes_allocated(), 4096, "released once unstuck");
    a.ping(0).unwrap();
}

#[test]
fn connecting_clients_take_segments_made_ahead() {
    let srv = TestServer::start("spare");
    let wait_ranges = |n: usize| {
        let t = Instant::now();
        while srv.gpu.registered_ranges() != n && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(2));
        }
        srv.gpu.registered_ranges()
    };
    // The server keeps two segments registered before anyone connects.
    assert_eq!(wait_ranges(2), 2, "spare segments ready");
    let a = Conn::connect_to(&srv.socket()).unwrap();
    // One became a's; another was made to keep two spare.
    assert_eq!(wait_ranges(3), 3);
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let c = Conn::connect_to(&srv.socket()).unwrap();
    assert_eq!(wait_ranges(5), 5, "three clients and two spares");
    for x in [&a, &b, &c] {
        assert!(
            alloc(x, 4096) != 0,
            "a client on a segment made ahead works"
        );
    }
    drop((a, b, c));
    assert_eq!(wait_ranges(2), 2, "the clients' segments unregistered");
}

#[test]
fn an_allocation_right_after_a_free_gets_the_freed_memory() {
    // PyTorch's out-of-memory path frees its cached blocks and allocates again at once;
    // the free is still on its way back (fence, releaser) when the allocation comes.
    let srv = TestServer::start("reclaim");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let big = 1u64 << 30; // the whole host GPU
    let p = alloc(&c, big);
    assert!(p != 0);
    c.push(
        0,
        Op::MemFree,
        &[bytemuck::bytes_of(&wire::MemFree { ptr: p })],
    )
    .unwrap();
    assert!(
        alloc(&c, big - 4096) != 0,
        "the allocation did not wait for the memory just freed"
    );
}

/// Unregistering host memory waits for every running kernel and holds up every client's
/// launches: a client that exits beside a long kernel leaves its segment registered until
/// the GPU is quiet, and no one waits for it.
#[test]
fn an_exiting_clients_segment_waits_for_a_quiet_gpu() {
    let srv = TestServer::start_with("quiet", |c| c.spare_segments = 0);
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let b = Conn::connect_to(&srv.socket()).unwrap();
    assert_eq!(srv.gpu.registered_ranges(), 2);
    srv.gpu.stick_releases(true);
    drop(b);
    // a's calls go on while b's segment waits; it is still registered.
    let answered = within_5s(move || {
        for _ in 0..50 {
            a.ping(0).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
        a
    });
    let held = srv.gpu.registered_ranges();
    srv.gpu.stick_releases(false);
    let a = answered.expect("a client waited for another's unregistration");
    assert_eq!(held, 2, "unregistered while the GPU was busy");
    let t = Instant::now();
    while srv.gpu.registered_ranges() != 1 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(srv.gpu.registered_ranges(), 1, "unregistered once quiet");
    a.ping(0).unwrap();
}

/// A stream queued about a thousand operations deep makes the driver's next launch wait
/// for the GPU: the worker stops taking that client's records instead, and other clients
/// go on. The host GPU's stuck switch keeps every recorded event from completing.
#[test]
fn a_client_queued_too_deep_waits_on_its_own_ring() {
    let srv = TestServer::start("deep");
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let (_, funcs) = load_image(&a, HOST_MODULE.as_bytes()).unwrap();
    let fill = funcs.iter().find(|f| f.0 == "fill_u32").unwrap().1;
    let p = alloc(&a, 4096);
    let mut args = p.to_le_bytes().to_vec();
    args.extend_from_slice(&7u32.to_le_bytes());
    args.extend_from_slice(&16u32.to_le_bytes());
    let launch = wire::Launch {
        func: fill,
        grid: [1; 3],
        block: [1; 3],
        args_len: args.len() as u32,
        ..Default::default()
    };
    let before = srv.gpu.launches();
    srv.gpu.stick_releases(true);
    for _ in 0..2000 {
        a.push(0, Op::Launch, &[bytemuck::bytes_of(&launch), &args])
            .unwrap();
    }
    let b = within_5s(move || {
        for _ in 0..50 {
            b.ping(0).unwrap();
        }
        b
    });
    std::thread::sleep(Duration::from_millis(200));
    let held = srv.gpu.launches() - before;
    srv.gpu.stick_releases(false);
    assert!(b.is_some(), "another client waited");
    assert!(
        (512..=800).contains(&held),
        "{held} launches went to a stream the GPU had not caught up with"
    );
    let t = Instant::now();
    while srv.gpu.launches() - before < 2000 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        srv.gpu.launches() - before,
        2000,
        "all of them, once it caught up"
    );
    a.ping(0).unwrap();
}
