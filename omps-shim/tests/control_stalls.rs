//! Peers that stall on purpose must hold up no one else (issue 23, findings 4, 6 and 7):
//! connections to the control and handoff sockets that never speak or never read, a
//! release that the driver blocks behind a kernel that never ends, a GPU whose fences never
//! pass, and idle connections to the metrics endpoint.

mod common;
use common::*;
use omps_ring::sock;
use omps_ring::wire::{self, Hello};
use omps_shim::conn::{settings_from, Conn};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// What a peer may cost the control thread at most: far below the 200 ms a silent handoff
/// and the 500 ms an unread answer once cost, far above a status on a busy machine.
const PROMPT: Duration = Duration::from_millis(100);

/// A control connection that sends `n` `metrics` commands and never reads an answer.
fn deaf_operator(srv: &TestServer, n: usize) -> UnixStream {
    let s = UnixStream::connect(srv.operator_socket()).unwrap();
    let hello = Hello {
        magic: wire::HELLO_MAGIC,
        version: wire::PROTOCOL_VERSION,
        kind: wire::kind::CONTROL,
    };
    // In one write: each write is a buffer of its own on the socket, and a few hundred
    // small ones fill it.
    let mut bytes = bytemuck::bytes_of(&hello).to_vec();
    for _ in 0..n {
        sock::write_frame(&mut bytes, b"metrics").unwrap();
    }
    (&s).write_all(&bytes).unwrap();
    s
}

#[test]
fn silent_handoffs_and_deaf_operators_hold_up_no_status_or_handshake() {
    let srv = TestServer::start("ctl-stalls");
    let handoff = srv.dir.join(sock::HANDOFF_NAME);
    // Connections to the handoff socket that never pass anything on.
    let silent: Vec<UnixStream> = (0..3)
        .map(|_| UnixStream::connect(&handoff).unwrap())
        .collect();
    // Operators that ask for far more text than their sockets hold, and never read it.
    let deaf: Vec<UnixStream> = (0..4).map(|_| deaf_operator(&srv, 400)).collect();
    // Time for the server to fill their sockets and meet the silent ones.
    std::thread::sleep(Duration::from_millis(150));
    for round in 0..3 {
        let t = Instant::now();
        let (ok, text) = srv.ctl("status");
        let took = t.elapsed();
        assert!(ok, "{text}");
        assert!(took < PROMPT, "round {round}: status took {took:?}");
        let t = Instant::now();
        let c = Conn::connect_to(&srv.socket()).expect("a new client connects");
        let took = t.elapsed();
        assert!(took < PROMPT, "round {round}: a handshake took {took:?}");
        c.ping(0).unwrap();
    }
    // An operator that reads late still gets its answers, whole and in order.
    let late = deaf_operator(&srv, 0);
    for cmd in ["get_server_list", "metrics", "get_server_list"] {
        sock::write_frame(&mut &late, cmd.as_bytes()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    late.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answers = Vec::new();
    for _ in 0..3 {
        let r = sock::read_frame(&mut &late, 16 << 20).unwrap().unwrap();
        assert_eq!(r[0], 0, "{}", String::from_utf8_lossy(&r[1..]));
        answers.push(String::from_utf8_lossy(&r[1..]).into_owned());
    }
    assert_eq!(answers[0], answers[2]);
    assert!(answers[1].contains("omps_gpu_memory_total_bytes"));
    drop((silent, deaf));
}

#[test]
fn an_unload_stuck_behind_an_endless_kernel_holds_back_no_ones_memory() {
    let srv = TestServer::start("unload-stuck");
    let victim = Conn::connect_to(&srv.socket()).unwrap();
    // Most of the GPU (1 GiB) is the victim's.
    let big = try_alloc_on(&victim, 0, 700 << 20).unwrap();
    victim.ping(0).unwrap();
    // Another client loads code, runs a kernel that never ends and goes: the driver's
    // unload of its module waits for that kernel.
    let other = Conn::connect_to(&srv.socket()).unwrap();
    load_image(&other, HOST_MODULE.as_bytes()).unwrap();
    other.ping(0).unwrap();
    srv.gpu.hold_unloads(true);
    drop(other);
    // (Its release is not done before the unload is: it stays listed meanwhile.)
    std::thread::sleep(Duration::from_millis(100));
    // The victim gives its memory back and asks for most of it again (another size, so
    // that its own freed block is not simply handed back): only the releaser frees it.
    free_on(&victim, 0, big);
    let again = try_alloc_on(&victim, 0, 600 << 20);
    srv.gpu.hold_unloads(false);
    assert!(
        again.is_ok(),
        "memory a client freed stayed behind another client's unload: {again:?}"
    );
    // The unload went through once the kernel ended.
    let t = Instant::now();
    while srv.gpu.modules_loaded() > 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(srv.gpu.modules_loaded(), 0, "the module was never unloaded");
}

#[test]
fn a_gpu_whose_fences_never_pass_does_not_slow_other_gpus_out_of_memory_answers() {
    let (dir, first, second, thread) = linked_gpus_server("stuck-peer");
    let socket = dir.join(sock::SOCKET_NAME);
    // A client of both GPUs with peer access: what it frees on GPU 0 waits for its work on
    // GPU 1 too, and GPU 1 is stuck (a kernel that never ends: no fence there passes).
    let both = Conn::connect_to(&socket).unwrap();
    peer_access(&both, 0, 1).expect("peer access");
    let p = try_alloc_on(&both, 0, 1 << 20).unwrap();
    second.stick_releases(true);
    free_on(&both, 0, p);
    both.ping(0).unwrap();
    // Long enough for anyone to see that GPU 1 is not coming back soon.
    std::thread::sleep(Duration::from_millis(300));
    // Another client of GPU 0 alone runs out of memory: it is told at once, as natively,
    // not after a wait for GPU 1.
    let settings = settings_from(|k| (k == "CUDA_VISIBLE_DEVICES").then(|| "0".to_string()))
        .expect("settings");
    let alone = Conn::connect_with(&socket, &settings).unwrap();
    let _most = try_alloc_on(&alone, 0, 200 << 20).unwrap();
    let mut worst = Duration::ZERO;
    for _ in 0..3 {
        let t = Instant::now();
        let r = try_alloc_on(&alone, 0, 100 << 20);
        worst = worst.max(t.elapsed());
        assert!(r.is_err(), "more than the GPU has");
    }
    second.stick_releases(false);
    assert!(
        worst < PROMPT,
        "an out-of-memory answer waited {worst:?} for another GPU's fences"
    );
    // GPU 1 came back: the held free goes through.
    let t = Instant::now();
    while first.bytes_allocated() > 200 << 20 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        first.bytes_allocated(),
        200 << 20,
        "the held free never went"
    );
    drop((both, alone));
    assert!(ctl_at(&sock::operator_socket_in(&dir), "quit").0);
    thread.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A scrape of `addr`'s /metrics: how long it took, and whether it answered 200.
fn scrape(addr: std::net::SocketAddr) -> (Duration, bool) {
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    (t.elapsed(), body.starts_with("HTTP/1.1 200 OK\r\n"))
}

#[test]
fn idle_connections_to_the_metrics_endpoint_hold_up_no_scrape() {
    let addr = free_local_addr();
    let srv = TestServer::start_with("metrics-idle", |c| c.metrics = Some(addr));
    let (_, ok) = scrape(addr);
    assert!(ok, "the endpoint serves");
    // A few idle connections (each once cost a scrape 2 s), then more than the endpoint
    // keeps at once.
    let few: Vec<std::net::TcpStream> = (0..3)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    let (took, ok) = scrape(addr);
    assert!(
        ok && took < Duration::from_millis(500),
        "{took:?} behind 3 idle connections"
    );
    let many: Vec<std::net::TcpStream> = (0..200)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    let (took, ok) = scrape(addr);
    assert!(
        ok && took < Duration::from_millis(500),
        "{took:?} behind 200 idle connections"
    );
    // One that trickles its request, a byte at a time, holds up no one either.
    let mut slow = std::net::TcpStream::connect(addr).unwrap();
    slow.write_all(b"GE").unwrap();
    let (took, ok) = scrape(addr);
    assert!(
        ok && took < Duration::from_millis(500),
        "{took:?} behind a trickle"
    );
    drop((few, many, slow, srv));
}
