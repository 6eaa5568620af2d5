//! While more clients are connected than the server has CPUs, waiting clients are asked to
//! sleep soon instead of spinning and yielding (`SegmentHeader::wait_active_us`): 1,024
//! clients that spin take the CPUs from the lanes and from each other (issue 25, their
//! times spread 200-fold). The new client is told at its connection, the others when the
//! count crosses the CPUs, both ways; crowded clients' calls and synchronizations are
//! answered as before (through the futex their lane wakes).

mod common;
use common::*;
use omps_ring::segment::WaitPlan;
use omps_shim::conn::Conn;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn hint(c: &Conn) -> u32 {
    c.seg().header().wait_active_us.load(Ordering::Relaxed)
}

fn wait_for_hint(c: &Conn, want: impl Fn(u32) -> bool) -> u32 {
    let t = Instant::now();
    while !want(hint(c)) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    hint(c)
}

#[test]
fn clients_beyond_the_cpus_are_asked_to_sleep_soon() {
    let srv = TestServer::start_with("crowded-waits", |c| c.crowd_cpus = 2);
    let connect = || Conn::connect_to(&srv.socket()).expect("connects");
    let (a, b) = (connect(), connect());
    assert_eq!(
        (hint(&a), hint(&b)),
        (0, 0),
        "as many clients as CPUs: the default"
    );
    let c = connect();
    let crowded = hint(&c);
    assert_ne!(crowded, 0, "the third is told at its connection");
    assert!(WaitPlan::from_header(crowded).active < WaitPlan::DEFAULT.active);
    assert_eq!(wait_for_hint(&a, |h| h != 0), crowded, "and the others");
    assert_eq!(wait_for_hint(&b, |h| h != 0), crowded);
    for k in [&a, &b, &c] {
        k.ping(0).unwrap();
        let p = alloc(k, 4096);
        memset(k, p);
        sync_default_stream(k).unwrap();
    }
    drop(c);
    assert_eq!(
        wait_for_hint(&a, |h| h == 0),
        0,
        "as many as CPUs again: the default"
    );
    assert_eq!(hint(&b), 0);
    a.ping(0).unwrap();
}
