//! The profiler's ops as hostile input. EventTimes (its batched timing call): the answer
//! for pairs of the client's own events, and a client cut off, others untouched, when the
//! count and the ids that follow disagree, when it asks for more than a reply holds, or
//! names an event that is not its own. GraphProfileInfo and GraphLaunchProfiled: a
//! client that names an executable graph it does not have is cut off.

mod common;
use common::*;
use omps_ring::wire::{self, Op};
use omps_shim::conn::Conn;

/// Sends EventTimes with `count` in the header and `ids` after it.
fn ask(c: &Conn, anchor: u32, count: u32, ids: &[u32]) -> Result<Vec<wire::EventTime>, i32> {
    let mut ch = c.channel();
    ch.call(0, Op::EventTimes, |call| {
        let mut rec = bytemuck::bytes_of(&wire::EventTimes {
            call,
            anchor,
            count,
        })
        .to_vec();
        for id in ids {
            rec.extend_from_slice(&id.to_le_bytes());
        }
        rec
    })?;
    let size = std::mem::size_of::<wire::EventTime>();
    Ok(ch
        .reply_bytes(count as usize * size)
        .chunks_exact(size)
        .map(bytemuck::pod_read_unaligned)
        .collect())
}

/// Sends Profiling (`on`): the server's answer.
fn profiling(c: &Conn, on: u32) -> Result<(), i32> {
    c.channel()
        .call(0, Op::Profiling, |call| {
            bytemuck::bytes_of(&wire::Profiling { call, on, _pad: 0 }).to_vec()
        })
        .map(|_| ())
}

/// Records event 1, queues a memset, records event 2 (all on the default stream) and asks
/// for the pair's times, anchored at event 3: the answer and the host window around the
/// work.
fn span(c: &Conn, dst: u64) -> (wire::EventTime, u64, u64) {
    let t0 = omps_shim::state::profile::monotonic_ns();
    event_record_raw(c, 1);
    memset(c, dst);
    event_record_raw(c, 2);
    let t = ask(c, 3, 1, &[1, 2]).unwrap()[0];
    (t, t0, omps_shim::state::profile::monotonic_ns())
}

/// A client whose profiler traces (Profiling on) gets its spans from the server's own
/// record of the work (source GPU, CLOCK_MONOTONIC nanoseconds), each client its own
/// though both use the same event ids; off again, the events answer; a Profiling that is
/// neither on nor off cuts its sender off.
#[test]
fn a_traced_client_is_timed_by_the_servers_record_of_its_work() {
    let srv = TestServer::start("event-times-timed");
    let (a, b) = (
        Conn::connect_to(&srv.socket()).unwrap(),
        Conn::connect_to(&srv.socket()).unwrap(),
    );
    let mut windows = Vec::new();
    for c in [&a, &b] {
        for id in 1..=3 {
            event_create_raw(c, id);
        }
        event_record_raw(c, 3);
        assert_eq!(profiling(c, 1), Ok(()), "the host GPU times work itself");
        let dst = alloc(c, 4096);
        let (t, from, to) = span(c, dst);
        assert_eq!((t.result, t.source), (0, wire::time_source::GPU));
        assert!(
            from <= t.start_ns && t.start_ns <= t.end_ns && t.end_ns <= to,
            "{from} {} {} {to}",
            t.start_ns,
            t.end_ns
        );
        windows.push((from, to, t));
    }
    assert!(
        windows[1].2.start_ns >= windows[1].0 && windows[1].2.start_ns > windows[0].1,
        "the second client's span is its own work, not the first's (same event ids)"
    );
    // The span was asked once: asked again, its events answer.
    let again = ask(&a, 3, 1, &[1, 2]).unwrap()[0];
    assert_eq!((again.result, again.source), (0, wire::time_source::EVENTS));
    assert_eq!(profiling(&a, 0), Ok(()));
    let (t, _, _) = span(&a, alloc(&a, 4096));
    assert_eq!(
        (t.result, t.source),
        (0, wire::time_source::EVENTS),
        "off: events"
    );
    assert!(t.length_ms >= 0.0);

    let liar = Conn::connect_to(&srv.socket()).unwrap();
    let _ = profiling(&liar, 7);
    assert!(wait_disconnected(&liar), "accepted: Profiling on = 7");
    assert_eq!(profiling(&b, 0), Ok(()), "the others go on");
}

#[test]
fn event_times_answers_its_own_pairs_and_cuts_off_a_liar() {
    let srv = TestServer::start("event-times");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    for id in 1..=4 {
        event_create_raw(&c, id);
    }
    event_record_raw(&c, 1);
    event_record_raw(&c, 2);
    memset(&c, alloc(&c, 4096));
    event_record_raw(&c, 3);
    let t = ask(&c, 1, 2, &[2, 3, 3, 4]).unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!(t[0].result, 0);
    assert!(t[0].from_anchor_ms >= 0.0 && t[0].length_ms >= 0.0);
    assert_ne!(t[1].result, 0, "event 4 was never recorded: no time");

    let liars: [(u32, Vec<u32>, &str); 3] = [
        (3, vec![2, 3], "a count the ids do not fill"),
        (65, [2, 3].repeat(65), "more pairs than a reply holds"),
        (1, vec![2, 99], "an event that is not its own"),
    ];
    for (count, ids, what) in liars {
        let liar = Conn::connect_to(&srv.socket()).unwrap();
        for id in 1..=3 {
            event_create_raw(&liar, id);
        }
        let _ = ask(&liar, 1, count, &ids);
        assert!(wait_disconnected(&liar), "accepted: {what}");
    }
    // The graph profiling ops name executable graphs: one the client does not have is a
    // lie, whether asked about or launched.
    let liar = Conn::connect_to(&srv.socket()).unwrap();
    let _ = liar.channel().call(0, Op::GraphProfileInfo, |call| {
        bytemuck::bytes_of(&wire::GraphProfileInfo {
            call,
            exec: 77,
            first: 0,
        })
        .to_vec()
    });
    assert!(
        wait_disconnected(&liar),
        "accepted: info of an unknown graph"
    );
    let liar = Conn::connect_to(&srv.socket()).unwrap();
    event_create_raw(&liar, 1);
    let l = wire::GraphLaunchProfiled {
        exec: 77,
        stream: 0,
        count: 1,
        _pad: 0,
    };
    liar.push(
        0,
        Op::GraphLaunchProfiled,
        &[bytemuck::bytes_of(&l), &[1, 0, 0, 0, 1, 0, 0, 0]],
    )
    .unwrap();
    assert!(
        wait_disconnected(&liar),
        "accepted: launch of an unknown graph"
    );
    assert!(alloc(&c, 64) != 0, "the others go on");
    assert_eq!(ask(&c, 1, 1, &[2, 3]).unwrap()[0].result, 0);
}
