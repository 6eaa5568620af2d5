//! A range pinned at the address of one the client gave back a moment ago: the first is
//! unmapped only once the client's work has passed a fence (here held back), and the new
//! one waits for that rather than failing, as after cudaHostUnregister natively the address
//! is free again (rt/host_register failed this way once on the H100).

mod common;
use common::*;
use omps_ring::wire::hostmem;
use omps_shim::conn::{settings_from, Conn};
use std::os::fd::AsRawFd;
use std::time::Duration;

#[test]
fn a_range_pinned_again_at_an_address_given_back_waits_for_its_fence() {
    let srv = TestServer::start("pin-again");
    let c = Conn::connect_with(&srv.socket(), &settings_from(|_| None).unwrap()).unwrap();
    let len = 64 << 10;
    let (addr, fd) = pin_somewhere(&c, len);
    srv.gpu.stick_releases(true);
    c.host_request(hostmem::UNPIN, addr, 0, None)
        .expect("unpin");
    let gpu = srv.gpu.clone();
    let unstick = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        gpu.stick_releases(false);
    });
    let again = c.host_request(hostmem::PIN, addr, len as u64, Some(fd.as_raw_fd()));
    unstick.join().unwrap();
    assert_eq!(again, Ok(()), "pinned again once the first was let go");
}

/// A pin waiting for its client's unpin holds up no other client's pin (issue 23 review,
/// finding 6: it waited on the one thread that answers every client's pins).
#[test]
fn a_pin_waiting_for_an_unpin_holds_up_no_other_clients_pin() {
    let srv = TestServer::start("pin-again-others");
    let plain = settings_from(|_| None).unwrap();
    let a = Conn::connect_with(&srv.socket(), &plain).unwrap();
    let b = Conn::connect_with(&srv.socket(), &plain).unwrap();
    let len = 64 << 10;
    let (addr, fd) = pin_somewhere(&a, len);
    srv.gpu.stick_releases(true);
    a.host_request(hostmem::UNPIN, addr, 0, None)
        .expect("unpin");
    std::thread::scope(|s| {
        let waits =
            s.spawn(|| a.host_request(hostmem::PIN, addr, len as u64, Some(fd.as_raw_fd())));
        // A's pin is waiting now.
        std::thread::sleep(Duration::from_millis(100));
        let t = std::time::Instant::now();
        let _ = pin_somewhere(&b, len);
        let took = t.elapsed();
        std::thread::sleep(Duration::from_millis(100));
        srv.gpu.stick_releases(false);
        assert_eq!(
            waits.join().unwrap(),
            Ok(()),
            "A pinned again once its unpin passed"
        );
        assert!(
            took < Duration::from_millis(500),
            "B's pin waited {took:?} behind A's"
        );
    });
}
