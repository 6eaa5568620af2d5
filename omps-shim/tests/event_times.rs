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
