//! Hostile clients and what they are charged for (issue 23, findings 10, 12, 13, 14):
//! a client's word is not taken for what it runs, one process's connections share one
//! budget, memory the driver takes for a client counts against it, and every table a
//! client fills is bounded.

mod common;
use common::*;
use omps_ring::wire::{self, Op};
use omps_shim::conn::Conn;

/// Writes `text` to device memory of `c` at `p`.
fn put_text(c: &Conn, p: u64, text: &[u8]) {
    let inline = wire::InlineCopy {
        dev: p,
        len: text.len() as u32,
        ..Default::default()
    };
    c.push(0, Op::CopyHtoDInline, &[bytemuck::bytes_of(&inline), text])
        .unwrap();
}

#[test]
fn a_printf_declaration_without_printing_code_diverts_no_ones_text() {
    let srv = TestServer::start("printf-claim");
    // It loads nothing that prints, but says it does: were it believed, two clients would
    // run printing code and the victim's text would go to the log.
    let liar = Conn::connect_to(&srv.socket()).unwrap();
    liar.socket_request(wire::hostmem::PRINTF_USE, 0, wire::printf_use::YES, None)
        .unwrap();
    let victim = Conn::connect_to(&srv.socket()).unwrap();
    let img = b"omps-host-module\nextern vprintf\nfn print 0:8 8:4\n\0";
    let (_, funcs) = load_image(&victim, img).unwrap();
    let text = b"my text\n";
    let p = alloc(&victim, 64);
    put_text(&victim, p, text);
    // Give the control thread a poll to learn what the victim loaded.
    std::thread::sleep(std::time::Duration::from_millis(200));
    launch_print(&victim, funcs[0].1, p, text.len() as u32);
    victim.ping(0).unwrap();
    let got = victim
        .socket_request(wire::hostmem::PRINTF_FLUSH, 0, 1 << 16, None)
        .unwrap();
    let (out, _) = wire::split_printf_reply(&got).unwrap();
    assert_eq!(out, text, "the only client that prints gets its text");
    liar.ping(0).unwrap();
}

const OOM: i32 = 2;

#[test]
fn a_memory_limit_holds_for_a_process_over_all_its_connections() {
    let srv = TestServer::start_with("per-process", |c| c.default_mem_limit = Some("0=1M".into()));
    // Every connection of this test is this process's: together they hold 1 MiB.
    let conns: Vec<Conn> = (0..4)
        .map(|_| Conn::connect_to(&srv.socket()).unwrap())
        .collect();
    let held: Vec<u64> = conns
        .iter()
        .map(|c| try_alloc(c, 768 << 10))
        .filter_map(Result::ok)
        .collect();
    assert_eq!(held.len(), 1, "one process, one limit: {held:?}");
    assert_eq!(
        try_alloc(&conns[3], 256 << 10).map(drop),
        Ok(()),
        "the rest"
    );
    assert_eq!(try_alloc(&conns[2], 4096), Err(OOM));
    // The operator's limit for the process reaches every connection, new ones too.
    let me = std::process::id();
    assert!(srv.ctl(&format!("set_device_pinned_mem_limit {me} 0 2M")).0);
    let late = Conn::connect_to(&srv.socket()).unwrap();
    assert_eq!(try_alloc(&late, 768 << 10).map(drop), Ok(()));
    assert_eq!(try_alloc(&conns[0], 768 << 10), Err(OOM));
    // A connection that goes gives back what it held to the process.
    drop(conns);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while try_alloc(&late, 768 << 10).is_err() {
        assert!(std::time::Instant::now() < deadline, "never given back");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

const OTHER_PROCESS: &str = "OMPS_TEST_ACCOUNT_CHILD";

#[test]
fn another_process_has_a_budget_of_its_own() {
    if std::env::var_os(OTHER_PROCESS).is_some() {
        // The child: the parent holds 768K of the 1M limit, and the operator set the
        // default to 2M meanwhile; this process gets the new default, all of it.
        let c = Conn::connect().expect("connects");
        assert_eq!(try_alloc(&c, 1536 << 10).map(drop), Ok(()));
        return;
    }
    let srv = TestServer::start_with("other-process", |c| {
        c.default_mem_limit = Some("0=1M".into())
    });
    let c = Conn::connect_to(&srv.socket()).unwrap();
    try_alloc(&c, 768 << 10).expect("within the limit");
    assert!(srv.ctl("set_default_device_pinned_mem_limit 0 2M").0);
    assert_eq!(
        try_alloc(&c, 768 << 10),
        Err(OOM),
        "a running process keeps its limit"
    );
    run_client_child(
        &srv,
        "another_process_has_a_budget_of_its_own",
        OTHER_PROCESS,
    );
}

#[test]
fn streams_given_up_behind_endless_work_leave_a_bounded_number_of_events() {
    let srv = TestServer::start("left-events");
    let c = std::sync::Arc::new(Conn::connect_to(&srv.socket()).unwrap());
    let p = alloc(&c, 64);
    c.ping(0).unwrap();
    let before = srv.gpu.events_live();
    // Work that never ends: nothing recorded after it completes.
    srv.gpu.stick_releases(true);
    let giver = {
        let c = c.clone();
        std::thread::spawn(move || {
            for id in 1..=1000u32 {
                stream_create(&c, id);
                memset_words_on(&c, id, p, id, 0);
                c.push(
                    0,
                    Op::StreamDestroy,
                    &[bytemuck::bytes_of(&wire::Handle { id, _pad: 0 })],
                )
                .unwrap();
            }
            c.ping(0).unwrap();
        })
    };
    // Behind work that does not end the client is held back once its streams' waits and
    // records near the driver's bound (session/depth.rs; hostile_scheduling.rs shows the
    // lane stays free): what it gave up so far holds few events.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let live = srv.gpu.events_live() - before;
    assert!(
        live <= 200,
        "{live} driver events for the streams given up so far"
    );
    // The work ends: the client goes on, and is served to the end.
    srv.gpu.stick_releases(false);
    giver.join().unwrap();
    c.ping(0).unwrap();
    let after = srv.gpu.events_live() - before;
    assert!(
        after <= 200,
        "{after} driver events after 1000 streams given up"
    );
}

#[test]
fn graph_instantiate_flags_the_driver_does_not_know_are_refused() {
    let srv = TestServer::start("instantiate-flags");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let p = alloc(&c, 64);
    stream_create(&c, 1);
    capture(&c, Op::CaptureBegin, 1).unwrap();
    let m = wire::Memset {
        dst: p,
        count: 16,
        value: 3,
        elem_size: 4,
        stream: 1,
        _pad: 0,
    };
    c.push(0, Op::Memset, &[bytemuck::bytes_of(&m)]).unwrap();
    let g = capture(&c, Op::CaptureEnd, 1).unwrap() as u32;
    const INVALID_VALUE: i32 = 1;
    for flags in [2, 16, 1 << 40, u64::MAX] {
        assert_eq!(
            instantiate_graph(&c, g, flags),
            Err(INVALID_VALUE),
            "{flags:#x}"
        );
    }
    for flags in [0, 1, 4, 8, 1 | 8] {
        instantiate_graph(&c, g, flags).unwrap_or_else(|e| panic!("{flags:#x}: {e}"));
    }
    c.ping(0).unwrap();
}

fn set_limit(c: &Conn, limit: i64, value: i64) -> Result<(), i32> {
    let mut ch = c.channel();
    ch.call(0, Op::Query, |call| {
        bytemuck::bytes_of(&wire::Query {
            call,
            kind: wire::query::CTX_SET_LIMIT,
            args: [limit, value, 0, 0, 0, 0, 0],
            ..Default::default()
        })
        .to_vec()
    })?;
    ch.reply::<wire::U64Reply>();
    Ok(())
}

#[test]
fn raising_a_context_limit_is_charged_to_the_client_that_asks() {
    let srv = TestServer::start_with("limit-charge", |c| {
        c.default_mem_limit = Some("0=64M".into())
    });
    let c = Conn::connect_to(&srv.socket()).unwrap();
    const STACK: i64 = 0;
    const HEAP: i64 = 2;
    // A 64 KiB stack for every thread the GPU holds resident is far beyond 64M.
    assert_eq!(set_limit(&c, STACK, 64 << 10), Err(OOM));
    // A heap of 48M fits, and then counts: 32M more of memory does not.
    set_limit(&c, HEAP, 48 << 20).expect("within the limit");
    assert_eq!(try_alloc(&c, 32 << 20), Err(OOM));
    // Lowered again, it is given back.
    set_limit(&c, HEAP, 1024).expect("lowered");
    try_alloc(&c, 32 << 20).expect("given back");
}
