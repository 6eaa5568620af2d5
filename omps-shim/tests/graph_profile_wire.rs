//! The server's side of profiled graph replays (docs/design.md 12b, design G) through a
//! raw connection: the twin's timed nodes name the client's own function, a replay with
//! the right count is timed, one whose count the twin does not have runs untimed with
//! each pair recorded end first (a negative length the profiler drops, never old times),
//! and a launch whose ids do not fill its count, or name an event not the client's own,
//! cuts the client off, others untouched. A client that leaves holding a twin and a kept
//! graph leaves the server serving.

mod common;
use common::*;
use omps_ring::wire::{self, Op};
use omps_shim::conn::Conn;

fn info(c: &Conn, exec: u32) -> Result<(wire::ProfiledNodes, Vec<wire::ProfiledNode>), i32> {
    let mut ch = c.channel();
    ch.call(0, Op::GraphProfileInfo, |call| {
        bytemuck::bytes_of(&wire::GraphProfileInfo {
            call,
            exec,
            first: 0,
        })
        .to_vec()
    })?;
    let (h, n) = (8, std::mem::size_of::<wire::ProfiledNode>());
    let b = ch.reply_bytes(h + wire::PROFILED_PER_REPLY * n);
    let head: wire::ProfiledNodes = bytemuck::pod_read_unaligned(&b[..h]);
    let nodes = b[h..h + head.count as usize * n]
        .chunks_exact(n)
        .map(bytemuck::pod_read_unaligned)
        .collect();
    Ok((head, nodes))
}

fn launch(c: &Conn, exec: u32, stream: u32, count: u32, ids: &[u32]) {
    let l = wire::GraphLaunchProfiled {
        exec,
        stream,
        count,
        _pad: 0,
    };
    let ids: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    c.push(0, Op::GraphLaunchProfiled, &[bytemuck::bytes_of(&l), &ids])
        .unwrap();
}

/// Milliseconds between each pair (start, end) of `ids`, measured from `anchor`.
fn lengths(c: &Conn, anchor: u32, ids: &[u32]) -> Vec<f32> {
    let mut ch = c.channel();
    ch.call(0, Op::EventTimes, |call| {
        let mut r = bytemuck::bytes_of(&wire::EventTimes {
            call,
            anchor,
            count: ids.len() as u32 / 2,
        })
        .to_vec();
        r.extend(ids.iter().flat_map(|i| i.to_le_bytes()));
        r
    })
    .unwrap();
    let size = std::mem::size_of::<wire::EventTime>();
    ch.reply_bytes(ids.len() / 2 * size)
        .chunks_exact(size)
        .map(|b| {
            let t: wire::EventTime = bytemuck::pod_read_unaligned(b);
            assert_eq!(t.result, 0);
            t.length_ms
        })
        .collect()
}

/// A client with a one-kernel graph captured on stream 5, instantiated, its graph
/// destroyed: (the connection, the executable graph, the kernel's function id).
fn client_with_graph(srv: &TestServer) -> (Conn, u32, u32) {
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let (_, funcs) = load_image(&c, HOST_MODULE.as_bytes()).unwrap();
    let fill = funcs.iter().find(|(n, _)| n == "fill_u32").unwrap().1;
    let p = alloc(&c, 4096);
    stream_create(&c, 5);
    capture(&c, Op::CaptureBegin, 5).unwrap();
    launch_fill_words(&c, 0, fill, 5, p, 7);
    let g = capture(&c, Op::CaptureEnd, 5).unwrap() as u32;
    let x = instantiate_graph(&c, g, 0).unwrap() as u32;
    let h = wire::Handle { id: g, _pad: 0 };
    c.push(0, Op::GraphDestroy, &[bytemuck::bytes_of(&h)])
        .unwrap();
    (c, x, fill)
}

#[test]
fn profiled_replays_are_timed_checked_and_never_read_old_times() {
    let srv = TestServer::start("graph-profile");
    let (c, x, fill) = client_with_graph(&srv);
    let (head, nodes) = info(&c, x).unwrap();
    assert_eq!((head.total, head.count), (1, 1));
    assert_eq!(nodes[0].func, fill, "the client's own function id");

    for id in 1..=7 {
        event_create_raw(&c, id);
    }
    event_record_raw(&c, 1);
    launch(&c, x, 5, 1, &[2, 3]);
    let timed = lengths(&c, 1, &[2, 3]);
    assert!(timed[0] >= 0.0, "timed: {timed:?}");
    // A count the twin does not have: the replay runs untimed, its pairs end first.
    launch(&c, x, 5, 2, &[4, 5, 6, 7]);
    let untimed = lengths(&c, 1, &[4, 5, 6, 7]);
    assert!(untimed.iter().all(|&l| l < 0.0), "untimed: {untimed:?}");

    let liars: [(u32, Vec<u32>, &str); 2] = [
        (2, vec![1, 2], "a count the ids do not fill"),
        (1, vec![1, 99], "an event that is not its own"),
    ];
    for (count, ids, what) in liars {
        let (liar, lx, _) = client_with_graph(&srv);
        for id in 1..=2 {
            event_create_raw(&liar, id);
        }
        launch(&liar, lx, 5, count, &ids);
        assert!(wait_disconnected(&liar), "accepted: {what}");
    }
    // Leaving with a twin and a kept graph.
    drop(c);
    let other = Conn::connect_to(&srv.socket()).unwrap();
    assert!(alloc(&other, 64) != 0, "the server serves on");
    assert!(srv.ctl("status").0);
}
