//! Clients' QoS: a latency-critical client's streams run on the most urgent work streams,
//! a below-normal client's on the least urgent, and an operator's change moves a running
//! client's streams at its next work.

mod common;
use common::*;
use omps_ring::wire::{self, ClientSettings, Op};
use omps_shim::conn::Conn;
use std::time::{Duration, Instant};

/// A memset on the default stream, handled before this returns.
fn memset_now(c: &Conn, dst: u64) {
    memset(c, dst);
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
    let at = f
        .iter()
        .position(|&w| w == "streams")
        .expect("streams field");
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
    memset_now(&a, pa);
    memset_now(&b, pb);
    // Classes: background / normal / raised / critical.
    assert_eq!(
        streams_of(&srv, a.client_id()),
        "0/0/0/1",
        "latency-critical"
    );
    assert_eq!(
        streams_of(&srv, b.client_id()),
        "0/1/0/0@4",
        "normal, beside a latency-critical client: off its reserve"
    );

    let me = std::process::id();
    let (ok, why) = srv.ctl(&format!("set_client_qos {me} below-normal"));
    assert!(ok, "{why}");
    assert_eq!(srv.ctl(&format!("get_client_qos {me}")).1, "below-normal\n");
    // The move happens at the next work, and the old work streams are given up.
    memset_now(&a, pa);
    memset_now(&b, pb);
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
    assert_eq!(
        settings_from(env(&[("CUDA_MPS_CLIENT_PRIORITY", "1")]))
            .unwrap()
            .qos,
        1
    );
    assert_eq!(
        settings_from(env(&[
            ("CUDA_MPS_CLIENT_PRIORITY", "1"),
            ("OMPS_CLIENT_QOS", "latency-critical")
        ]))
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

/// The SM count client `c` sees on GPU 0 (CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).
fn sms(c: &Conn) -> i32 {
    c.seg().snapshot().devices[0].attributes[16]
}

fn settings(pct: Option<&str>, partition: Option<&str>) -> ClientSettings {
    let mut s = ClientSettings::none();
    if let Some(p) = pct {
        s.thread_milli_pct = wire::parse_percentage(p).unwrap();
    }
    if let Some(p) = partition {
        s.partition[..p.len()].copy_from_slice(p.as_bytes());
    }
    s
}

// The host GPU has 4 SMs in chunks of one: thread limits take the last k chunks (slots
// 0..=3), slot 4 is everything but the latency-critical reserve, partitions from slot 5.

#[test]
fn thread_limits_confine_and_a_client_only_lowers_the_default() {
    let srv = TestServer::start_with("limits", |c| c.default_thread_pct = Some("50".into()));
    assert_eq!(srv.ctl("get_default_active_thread_percentage").1, "50.0\n");
    let a = Conn::connect_with(&srv.socket(), &settings(None, None)).unwrap();
    let b = Conn::connect_with(&srv.socket(), &settings(Some("25"), None)).unwrap();
    let c = Conn::connect_with(&srv.socket(), &settings(Some("100"), None)).unwrap();
    assert_eq!(
        (sms(&a), sms(&b), sms(&c)),
        (2, 1, 2),
        "the default, lowered, not raised"
    );
    let pb = alloc(&b, 4096);
    memset_now(&b, pb);
    assert_eq!(
        streams_of(&srv, b.client_id()),
        "0/1/0/0@0",
        "the last chunk only"
    );
    assert_eq!(srv.gpu.confinement(0).unwrap().chunks, vec![3]);
    // An operator raises every client of this process to 75% while they run.
    let me = std::process::id();
    assert!(srv.ctl(&format!("set_active_thread_percentage {me} 75")).0);
    assert_eq!(
        srv.ctl(&format!("get_active_thread_percentage {me}")).1,
        "75.0\n"
    );
    assert_eq!(sms(&b), 3);
    memset_now(&b, pb);
    assert_eq!(wait_streams(&srv, b.client_id(), "0/1/0/0@2"), "0/1/0/0@2");
    let (ok, why) = srv.ctl(&format!("set_active_thread_percentage {me} 0"));
    assert!(!ok && why.contains("'0'"), "{why}");
    let (ok, why) = srv.ctl("set_default_active_thread_percentage 150");
    assert!(!ok && why.contains("150"), "{why}");
}

#[test]
fn a_latency_critical_client_gets_a_reserve_while_it_is_connected() {
    let srv = TestServer::start("reserve");
    let be = Conn::connect_to(&srv.socket()).unwrap();
    let p = alloc(&be, 4096);
    memset_now(&be, p);
    assert_eq!(
        streams_of(&srv, be.client_id()),
        "0/1/0/0",
        "the whole device"
    );
    let lc = Conn::connect_with(
        &srv.socket(),
        &ClientSettings {
            qos: 2,
            ..ClientSettings::none()
        },
    )
    .unwrap();
    memset_now(&be, p);
    assert_eq!(wait_streams(&srv, be.client_id(), "0/1/0/0@4"), "0/1/0/0@4");
    assert_eq!(srv.gpu.confinement(4).unwrap().chunks, vec![1, 2, 3]);
    assert_eq!(sms(&be), 3, "it sees the SMs it can use");
    drop(lc);
    let t = Instant::now();
    loop {
        memset_now(&be, p);
        let got = streams_of(&srv, be.client_id());
        if got == "0/1/0/0" || t.elapsed() > Duration::from_secs(5) {
            assert_eq!(got, "0/1/0/0", "back on the whole device once it left");
            assert_eq!(sms(&be), 4);
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn static_partitions_as_mps_has_them() {
    let srv = TestServer::start("parts");
    let uuid = "GPU-10101010-1010-1010-1010-101010101010";
    let (ok, id) = srv.ctl(&format!("sm_partition add {uuid} 2"));
    assert!(ok, "{id}");
    let id = id.trim().to_string();
    assert_eq!(id, format!("{uuid}/p1"));
    let (ok, why) = srv.ctl("sm_partition add GPU-1010 3");
    assert!(
        !ok && why.contains("CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"),
        "{why}"
    );
    let (ok, why) = srv.ctl("sm_partition add GPU-ffff 1");
    assert!(!ok && why.contains("no GPU"), "{why}");

    let c = Conn::connect_with(&srv.socket(), &settings(None, Some(&id))).unwrap();
    assert_eq!(sms(&c), 2);
    let p = alloc(&c, 4096);
    memset_now(&c, p);
    assert_eq!(streams_of(&srv, c.client_id()), "0/1/0/0@5");
    assert_eq!(srv.gpu.confinement(5).unwrap().chunks, vec![0, 1]);
    let ls = srv.ctl("lspart").1;
    assert!(ls.contains(&format!("{id} 2 2 1")), "{ls}");
    let (ok, why) = srv.ctl(&format!("sm_partition rm {id}"));
    assert!(!ok && why.contains("in use"), "{why}");

    let Err((code, _)) = Conn::connect_with(&srv.socket(), &settings(None, Some("GPU-1010/p9")))
    else {
        panic!("a client naming no partition was admitted");
    };
    assert_eq!(code, 915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION");

    drop(c);
    let t = Instant::now();
    loop {
        let (ok, why) = srv.ctl(&format!("sm_partition rm {uuid} p1"));
        if ok || t.elapsed() > Duration::from_secs(5) {
            assert!(ok, "{why}");
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(srv.ctl("lspart").1.contains("4 free"));
}
