//! Clients' QoS: a latency-critical client's streams run on the most urgent work streams,
//! a below-normal client's on the least urgent, and an operator's change moves a running
//! client's streams at its next work.

mod common;
use common::*;
use omps_ring::wire::{self, ClientSettings, Memset, Op};
use omps_shim::conn::Conn;
use std::time::{Duration, Instant};

fn memset(c: &Conn, dst: u64) {
    let m = Memset {
        dst,
        count: 16,
        value: 7,
        elem_size: 4,
        stream: 0,
        _pad: 0,
    };
    c.push(0, Op::Memset, &[bytemuck::bytes_of(&m)]).unwrap();
    c.ping(0).unwrap();
}

/// The `streams` field (bound work streams per class on GPU 0) of client `id`.
fn streams_of(srv: &TestServer, id: u32) -> String {
    let (ok, stats) = srv.ctl("stats");
    assert!(ok, "{stats}");
    let row = stats
        .lines()
        .find(|l| l.starts_with(&format!("client {id} ")))
        .unwrap_or_else(|| panic!("no stats row for client {id}:\n{stats}"));
    let f: Vec<&str> = row.split_whitespace().collect();
    let at = f.iter().position(|&w| w == "streams").expect("streams field");
    f[at + 1].to_string()
}

fn wait_streams(srv: &TestServer, id: u32, want: &str) -> String {
    let t = Instant::now();
    loop {
        let got = streams_of(srv, id);
        if got == want || t.elapsed() > Duration::from_secs(5) {
            return got;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn qos_places_streams_and_follows_the_operator() {
    let srv = TestServer::start("qos");
    let lc = ClientSettings {
        qos: 2,
        ..ClientSettings::none()
    };
    let a = Conn::connect_with(&srv.socket(), &lc).unwrap();
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let (pa, pb) = (alloc(&a, 4096), alloc(&b, 4096));
    memset(&a, pa);
    memset(&b, pb);
    // Classes: background / normal / raised / critical.
    assert_eq!(streams_of(&srv, a.client_id()), "0/0/0/1", "latency-critical");
    assert_eq!(streams_of(&srv, b.client_id()), "0/1/0/0", "normal");

    let me = std::process::id();
    let (ok, why) = srv.ctl(&format!("set_client_qos {me} below-normal"));
    assert!(ok, "{why}");
    assert_eq!(srv.ctl(&format!("get_client_qos {me}")).1, "below-normal\n");
    // The move happens at the next work, and the old work streams are given up.
    memset(&a, pa);
    memset(&b, pb);
    assert_eq!(wait_streams(&srv, a.client_id(), "1/0/0/0"), "1/0/0/0");
    assert_eq!(wait_streams(&srv, b.client_id(), "1/0/0/0"), "1/0/0/0");
    // And the work itself still runs and completes in order.
    b.channel()
        .call(0, Op::CtxSync, |call: wire::CallHdr| {
            bytemuck::bytes_of(&call).to_vec()
        })
        .unwrap();
}

#[test]
fn a_bad_qos_is_refused_with_a_reason() {
    let srv = TestServer::start("qosbad");
    let bad = ClientSettings {
        qos: 9,
        ..ClientSettings::none()
    };
    let Err((code, _)) = Conn::connect_with(&srv.socket(), &bad) else {
        panic!("a client asking for QoS 9 was admitted");
    };
    assert_eq!(code, 1, "CUDA_ERROR_INVALID_VALUE");
    // The server is none the worse.
    let c = Conn::connect_to(&srv.socket()).unwrap();
    c.ping(0).unwrap();
    let (ok, why) = srv.ctl("set_client_qos 1 urgent");
    assert!(!ok && why.contains("urgent"), "{why}");
}

#[test]
fn the_environment_is_read_as_mps_reads_it() {
    use omps_shim::conn::settings_from;
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
    };
    assert_eq!(settings_from(env(&[("CUDA_MPS_CLIENT_PRIORITY", "1")])).unwrap().qos, 1);
    assert_eq!(
        settings_from(env(&[("CUDA_MPS_CLIENT_PRIORITY", "1"), ("OMPS_CLIENT_QOS", "latency-critical")]))
            .unwrap()
            .qos,
        2
    );
    let e = settings_from(env(&[("CUDA_MPS_CLIENT_PRIORITY", "high")])).unwrap_err();
    assert!(e.contains("CUDA_MPS_CLIENT_PRIORITY=high"), "{e}");
    let s = settings_from(env(&[("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "12.5")])).unwrap();
    assert_eq!(s.thread_milli_pct, 12_500);
    for bad in ["0", "101", "abc", "-5"] {
        let pairs: &'static [(&'static str, &'static str)] =
            Box::leak(Box::new([("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", bad)]));
        assert!(settings_from(env(pairs)).is_err(), "{bad} accepted");
    }
}
