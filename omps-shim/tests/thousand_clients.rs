//! 1,024 clients work at once through one server (the figure README.md gives): each gets
//! its segment, allocates, and is answered, and every byte comes back when they go. Its
//! own binary, because it lifts the cap on one process's clients for the whole process.

mod common;
use common::*;
use omps_shim::conn::Conn;
use std::time::{Duration, Instant};

#[test]
fn a_thousand_and_twenty_four_clients_work_at_once() {
    // Client and server share this process: three descriptors per client (its socket and
    // the server's two ends), 3,087 in all. Raise the soft limit as far as it may go.
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        assert!(
            r.rlim_cur >= 4096,
            "this test needs 4096 descriptors; the hard limit here is {}",
            r.rlim_max
        );
    }
    // Here one process stands for 1,024 client processes: lift the cap on one process's
    // clients (OMPS_MAX_CLIENTS_PER_PROCESS, 64 by default) before the server reads it.
    // SAFETY: set before any server in this process (this binary has one test) starts.
    unsafe { std::env::set_var("OMPS_MAX_CLIENTS_PER_PROCESS", "1024") };
    let srv = TestServer::start("many");
    let clients: Vec<Conn> = (0..1024)
        .map(|i| Conn::connect_to(&srv.socket()).unwrap_or_else(|e| panic!("client {i}: {e:?}")))
        .collect();
    // Beyond the first 64, clients get small segments (2.3 MiB, not 33 MiB).
    assert_eq!(clients[0].params().num_channels, 8);
    assert_eq!(clients[1023].params().num_channels, 2);
    for c in &clients {
        assert!(alloc(c, 4096) != 0);
    }
    // And beyond the first few, only their channel headers are registered (pinned, and
    // resident in the server) until a copy goes through their staging: 4 GB at 1,024
    // clients before (issue 25), now the first few segments and the spares, whole (32 MiB
    // each), and some 36 KiB per client.
    let ahead = omps_server::release::segpool::STAGING_AHEAD + 2 + 2;
    let pinned = srv.gpu.registered_bytes();
    assert!(
        pinned < ahead * (33 << 20) + 1024 * (64 << 10),
        "{} MiB registered for 1,024 clients",
        pinned >> 20
    );
    for c in &clients {
        c.ping(0).unwrap();
    }
    assert_eq!(srv.gpu.bytes_allocated(), 1024 * 4096);
    drop(clients);
    let t = Instant::now();
    while srv.gpu.bytes_allocated() != 0 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        srv.gpu.bytes_allocated(),
        0,
        "every client's memory released"
    );
}
