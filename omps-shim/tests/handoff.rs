//! A connection a control daemon accepted and passed to the server through its handoff
//! socket (omps-ctl's daemon of several users does this) is served as if it had come to
//! the server's own socket; a handoff that carries no connection, or two, is refused and
//! the server goes on.

mod common;
use common::*;
use omps_ring::sock;
use omps_shim::conn::{settings_from, Conn};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};

#[test]
fn a_handed_over_connection_is_served_and_bad_handoffs_are_refused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Handoffs come from root's daemon only (issue 23 review, finding 7a).
        eprintln!("skipped: only root may pass a connection to a server");
        return;
    }
    let srv = TestServer::start("handoff");
    let handoff = srv.dir.join(sock::HANDOFF_NAME);
    // Where the "daemon" listens: the client connects there, not to the server.
    let front_dir = temp_dir("handoff-front");
    std::fs::create_dir_all(&front_dir).unwrap();
    let front = front_dir.join(sock::SOCKET_NAME);
    let listener = UnixListener::bind(&front).unwrap();
    let client = std::thread::spawn(move || {
        let settings = settings_from(|_| None).expect("settings");
        let c = Conn::connect_with(&front, &settings).expect("served after the handoff");
        let p = alloc(&c, 4096);
        assert_ne!(p, 0);
        c.ping(0).unwrap();
        c.client_id()
    });
    // Bad handoffs first: a message with no descriptor, and one with two.
    let h = UnixStream::connect(&handoff).unwrap();
    sock::send_with_fds(h.as_raw_fd(), b"h", &[]).unwrap();
    drop(h);
    let (a, b) = UnixStream::pair().unwrap();
    let h = UnixStream::connect(&handoff).unwrap();
    sock::send_with_fds(h.as_raw_fd(), b"h", &[a.as_raw_fd(), b.as_raw_fd()]).unwrap();
    drop(h);
    let (conn, _) = listener.accept().unwrap();
    let h = UnixStream::connect(&handoff).unwrap();
    sock::send_with_fds(h.as_raw_fd(), b"h", &[conn.as_raw_fd()]).unwrap();
    drop((h, conn));
    let id = client.join().unwrap();
    assert!(id > 0);
    let (ok, list) = srv.ctl("get_server_list");
    assert!(
        ok && !list.trim().is_empty(),
        "the server still answers: {list}"
    );
    let _ = std::fs::remove_dir_all(&front_dir);
}
