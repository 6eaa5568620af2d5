//! What a client may hold and how many may connect, with small bounds set for this test
//! binary: streams and events beyond the bound are refused by the shim (out of memory)
//! and cost a lying client its connection; clients beyond the bound are refused with
//! CUDA_ERROR_MPS_MAX_CLIENTS_REACHED; an image over the bound fails to load; peers that
//! stay silent, trickle a handshake or hold a control connection open stall nobody and
//! are dropped at their deadline.

mod common;
use common::*;
use omps_ring::wire::{self, Op};
use omps_shim::conn::Conn;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

const STREAMS: u32 = 4;
const CLIENTS: usize = 3;
const GRAPHS: usize = 3;

fn small_bounds() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (k, v) in [
            ("OMPS_MAX_STREAMS", STREAMS.to_string()),
            ("OMPS_MAX_EVENTS", "4".into()),
            ("OMPS_MAX_CLIENTS", CLIENTS.to_string()),
            ("OMPS_MAX_IMAGE_BYTES", "4096".into()),
            ("OMPS_MAX_HANDSHAKES", "6".into()),
            ("OMPS_MAX_GRAPHS", GRAPHS.to_string()),
        ] {
            std::env::set_var(k, v);
        }
    });
}

#[test]
fn streams_and_events_beyond_the_bound() {
    small_bounds();
    let srv = TestServer::start("bound-streams");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    for _ in 0..STREAMS {
        c.streams.take().unwrap();
    }
    assert_eq!(
        c.streams.take(),
        Err(2),
        "CUDA_ERROR_OUT_OF_MEMORY from the shim"
    );
    c.streams.give_back();
    assert!(c.streams.take().is_ok(), "one given back, one more");
    // A client that ignores the bound is cut off.
    let liar = Conn::connect_to(&srv.socket()).unwrap();
    for id in 1..=STREAMS + 1 {
        let sc = wire::StreamCreate {
            id,
            ..Default::default()
        };
        liar.push(0, Op::StreamCreate, &[bytemuck::bytes_of(&sc)])
            .unwrap();
    }
    assert!(
        wait_disconnected(&liar),
        "streams beyond the bound were accepted"
    );
    let liar = Conn::connect_to(&srv.socket()).unwrap();
    for id in 1..=5 {
        let ec = wire::EventCreate { id, flags: 0 };
        liar.push(0, Op::EventCreate, &[bytemuck::bytes_of(&ec)])
            .unwrap();
    }
    assert!(
        wait_disconnected(&liar),
        "events beyond the bound were accepted"
    );
    assert!(alloc(&c, 64) != 0, "the others go on");
}

#[test]
fn clients_beyond_the_bound_are_refused() {
    small_bounds();
    let srv = TestServer::start("bound-clients");
    let mut held: Vec<Conn> = (0..CLIENTS)
        .map(|_| Conn::connect_to(&srv.socket()).unwrap())
        .collect();
    match Conn::connect_to(&srv.socket()) {
        Err((code, _)) => assert_eq!(code, 808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"),
        Ok(_) => panic!("a client beyond OMPS_MAX_CLIENTS was taken"),
    }
    drop(held.pop());
    let t = Instant::now();
    let again = loop {
        match Conn::connect_to(&srv.socket()) {
            Ok(c) => break c,
            Err(_) if t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err((code, why)) => panic!("no room after a client left: {code} {why}"),
        }
    };
    assert!(alloc(&again, 64) != 0);
}

#[test]
fn an_image_over_the_bound_fails_to_load_and_the_client_goes_on() {
    small_bounds();
    let srv = TestServer::start("bound-image");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let mut img = b"omps-host-module\nfn trap\n".to_vec();
    img.resize(8000, b' ');
    img.push(0);
    assert_eq!(
        load_image(&c, &img).map(drop),
        Err(2),
        "CUDA_ERROR_OUT_OF_MEMORY"
    );
    assert!(
        load_image(&c, b"omps-host-module\nfn trap\n\0").is_ok(),
        "a small one loads"
    );
}

/// Whether the server closed `s` (reading gives end of stream).
fn closed(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    matches!(s.read(&mut [0u8; 1]), Ok(0))
}

#[test]
fn silent_slow_and_idle_peers_stall_nobody() {
    small_bounds();
    let srv = TestServer::start("bound-peers");
    let mut silent: Vec<UnixStream> = (0..3)
        .map(|_| UnixStream::connect(srv.socket()).unwrap())
        .collect();
    // One sends the first byte of a hello and then nothing; one opens a control
    // connection and sends no command.
    let mut slow = UnixStream::connect(srv.socket()).unwrap();
    slow.write_all(&[0x4f]).unwrap();
    let mut idle = UnixStream::connect(srv.operator_socket()).unwrap();
    let hello = wire::Hello {
        magic: wire::HELLO_MAGIC,
        version: wire::PROTOCOL_VERSION,
        kind: wire::kind::CONTROL,
    };
    idle.write_all(bytemuck::bytes_of(&hello)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // Meanwhile a client connects and works, and a command is answered, while every
    // one of those peers is still connected: none had to time out first.
    let c = Conn::connect_to(&srv.socket()).unwrap();
    assert!(alloc(&c, 64) != 0);
    let (ok, status) = srv.ctl("status");
    assert!(ok, "{status}");
    for s in silent.iter_mut().chain([&mut slow, &mut idle]) {
        assert!(
            !closed(s),
            "a peer was dropped before the others were served"
        );
    }
    // A handshake slot is bounded: beyond OMPS_MAX_HANDSHAKES a connection is closed
    // (the operator's socket has slots of its own: the idle control connection takes
    // none of the clients').
    let mut more: Vec<UnixStream> = (0..3)
        .map(|_| UnixStream::connect(srv.socket()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        closed(more.last_mut().unwrap()),
        "a seventh peer on the clients' socket was kept"
    );
    // At their deadline the silent and slow ones go (the idle control connection has a
    // longer one).
    let t = Instant::now();
    while !silent.iter_mut().all(closed) && t.elapsed() < Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        silent.iter_mut().all(closed),
        "silent peers were kept past the deadline"
    );
    assert!(
        closed(&mut slow),
        "a slow handshake was kept past the deadline"
    );
    assert!(alloc(&c, 64) != 0);
}

#[test]
fn graphs_beyond_the_bound() {
    small_bounds();
    let srv = TestServer::start("bound-graphs");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    c.streams.take().unwrap();
    stream_create(&c, 1);
    let graph = || capture(&c, Op::CaptureBegin, 1).and_then(|_| capture(&c, Op::CaptureEnd, 1));
    for _ in 0..GRAPHS {
        graph().expect("a graph within the bound");
    }
    assert_eq!(graph(), Err(2), "CUDA_ERROR_OUT_OF_MEMORY beyond it");
    c.ping(0).expect("the client goes on");
    assert!(srv.ctl("status").0);
}

/// A graph destroyed right after its instantiation (PyTorch's way) no longer counts,
/// though the server keeps it for a profiler's twin while its executable graph lives.
#[test]
fn graphs_destroyed_after_instantiation_free_their_place() {
    small_bounds();
    let srv = TestServer::start("bound-kept");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    c.streams.take().unwrap();
    stream_create(&c, 1);
    let mut execs = Vec::new();
    for _ in 0..GRAPHS - 1 {
        capture(&c, Op::CaptureBegin, 1).unwrap();
        let g = capture(&c, Op::CaptureEnd, 1).unwrap() as u32;
        execs.push(instantiate_graph(&c, g, 0).expect("within the bound"));
        let h = wire::Handle { id: g, _pad: 0 };
        c.push(0, Op::GraphDestroy, &[bytemuck::bytes_of(&h)])
            .unwrap();
    }
    c.ping(0).unwrap();
    assert_eq!(execs.len(), GRAPHS - 1);
    c.ping(0).expect("the client goes on");
}

#[test]
fn a_client_that_never_reads_its_answers_is_cut_off_without_stalling_anyone() {
    small_bounds();
    let srv = TestServer::start("bound-unread");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let other = Conn::connect_to(&srv.socket()).unwrap();
    // Requests (an unpin of nothing: each answered at once) sent, answers never read.
    let req = wire::HostMemRequest {
        kind: wire::hostmem::UNPIN,
        _pad: 0,
        addr: 1 << 40,
        len: 4096,
    };
    let t = Instant::now();
    let mut sent = 0;
    while t.elapsed() < Duration::from_secs(20) && !wait_disconnected_now(&c) {
        // SAFETY: sending a live buffer on this test's own socket.
        let n = unsafe {
            libc::send(
                c.socket_fd(),
                bytemuck::bytes_of(&req).as_ptr() as *const libc::c_void,
                std::mem::size_of::<wire::HostMemRequest>(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n > 0 {
            sent += 1;
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert!(wait_disconnected(&c), "kept after {sent} unread answers");
    // The control thread never waited on it: commands and the other client go on at once.
    let t = Instant::now();
    assert!(srv.ctl("status").0);
    other.ping(0).unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
}

/// Whether the server has cut `c` off already (no waiting).
fn wait_disconnected_now(c: &Conn) -> bool {
    c.check_alive().is_err()
}
