//! Stream capture and graphs in the server: a capture holds only the capturing client's
//! stream's work, replays on launch, and operations illegal during capture fail and
//! invalidate it, as natively. The host GPU records a captured stream's work and replays
//! it.

mod common;
use common::*;
use omps_ring::wire::{self, graph, Op};
use omps_shim::conn::Conn;
use std::time::{Duration, Instant};

const S: u32 = 5;

fn status(c: &Conn, stream: u32) -> wire::CaptureInfo {
    let mut ch = c.channel();
    ch.call(0, Op::CaptureStatus, |call| {
        bytemuck::bytes_of(&wire::HandleCall {
            call,
            id: stream,
            _pad: 0,
        })
        .to_vec()
    })
    .unwrap();
    ch.reply()
}

/// Destroys executable graph `exec` of `c`, then waits (5 s at most) until `gone` holds:
/// what the graph held goes after a fence.
fn destroy_exec_until(c: &Conn, exec: u32, gone: impl Fn() -> bool) -> bool {
    c.push(
        0,
        Op::GraphExecDestroy,
        &[bytemuck::bytes_of(&wire::Handle { id: exec, _pad: 0 })],
    )
    .unwrap();
    c.ping(0).unwrap();
    let t = Instant::now();
    while !gone() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    gone()
}

fn instantiate(c: &Conn, graph: u32) -> Result<u32, i32> {
    instantiate_graph(c, graph, 0).map(|e| e as u32)
}

fn sync(c: &Conn, op: Op, stream: u32) -> Result<(), i32> {
    c.channel().call(0, op, |call| {
        if op == Op::CtxSync {
            return bytemuck::bytes_of(&call).to_vec();
        }
        bytemuck::bytes_of(&wire::HandleCall {
            call,
            id: stream,
            _pad: 0,
        })
        .to_vec()
    })
}

fn launch_fill(c: &Conn, func: u32, stream: u32, p: u64) {
    let mut args = p.to_le_bytes().to_vec();
    args.extend_from_slice(&7u32.to_le_bytes());
    args.extend_from_slice(&16u32.to_le_bytes());
    let l = wire::Launch {
        func,
        stream,
        grid: [1; 3],
        block: [1; 3],
        args_len: args.len() as u32,
        ..Default::default()
    };
    c.push(0, Op::Launch, &[bytemuck::bytes_of(&l), &args])
        .unwrap();
}

#[test]
fn a_captured_stream_replays_its_own_work_only() {
    let srv = TestServer::start("graphs");
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let (_, funcs) = load_image(&a, HOST_MODULE.as_bytes()).unwrap();
    let fill = funcs.iter().find(|f| f.0 == "fill_u32").unwrap().1;
    let (pa, pb) = (alloc(&a, 4096), alloc(&b, 4096));
    stream_create(&a, S);
    assert_eq!(
        capture(&a, Op::CaptureBegin, 0),
        Err(900),
        "the legacy stream"
    );
    capture(&a, Op::CaptureBegin, S).unwrap();
    assert_eq!(
        capture(&a, Op::CaptureBegin, S),
        Err(401),
        "already capturing"
    );
    let st = status(&a, S);
    assert_eq!(st.status, graph::STATUS_ACTIVE);
    assert_ne!(st.id, 0);
    let before = srv.gpu.launches();
    launch_fill(&a, fill, S, pa);
    launch_fill(&a, fill, S, pa);
    // Another client's work, and this client's on another stream, run now.
    memset(&b, pb);
    launch_fill(&a, fill, 0, pa);
    b.ping(0).unwrap();
    a.ping(0).unwrap();
    assert_eq!(
        srv.gpu.launches() - before,
        1,
        "captured launches do not run"
    );
    let g = capture(&a, Op::CaptureEnd, S).unwrap() as u32;
    assert_eq!(status(&a, S).status, graph::STATUS_NONE);
    let e = instantiate(&a, g).unwrap();
    for _ in 0..3 {
        let l = wire::GraphLaunch { exec: e, stream: S };
        a.push(0, Op::GraphLaunch, &[bytemuck::bytes_of(&l)])
            .unwrap();
    }
    sync(&a, Op::StreamSync, S).unwrap();
    assert_eq!(
        srv.gpu.launches() - before,
        1 + 3 * 2,
        "each launch replays the two"
    );
    assert_eq!(instantiate(&a, 999), Err(400), "not a graph of this client");
    assert_eq!(instantiate(&b, g), Err(400), "nor another client's");
    for (op, id) in [(Op::GraphExecDestroy, e), (Op::GraphDestroy, g)] {
        a.push(0, op, &[bytemuck::bytes_of(&wire::Handle { id, _pad: 0 })])
            .unwrap();
    }
    a.ping(0).unwrap();
    let t = Instant::now();
    while srv.gpu.graph_count() != (0, 0) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(srv.gpu.graph_count(), (0, 0), "destroyed");
}

#[test]
fn illegal_operations_invalidate_the_capture() {
    let srv = TestServer::start("graphbad");
    let a = Conn::connect_to(&srv.socket()).unwrap();
    stream_create(&a, S);
    for op in [Op::StreamSync, Op::StreamQuery, Op::CtxSync] {
        capture(&a, Op::CaptureBegin, S).unwrap();
        assert_eq!(sync(&a, op, S), Err(900), "{op:?} during capture");
        assert_eq!(status(&a, S).status, graph::STATUS_INVALIDATED);
        assert_eq!(capture(&a, Op::CaptureEnd, S), Err(901), "after {op:?}");
        assert_eq!(status(&a, S).status, graph::STATUS_NONE);
    }
    // A client that dies with graphs leaves none behind.
    capture(&a, Op::CaptureBegin, S).unwrap();
    let g = capture(&a, Op::CaptureEnd, S).unwrap() as u32;
    instantiate(&a, g).unwrap();
    assert_eq!(srv.gpu.graph_count(), (1, 1));
    drop(a);
    let t = Instant::now();
    while srv.gpu.graph_count() != (0, 0) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(srv.gpu.graph_count(), (0, 0));
}

#[test]
fn captured_events_frees_and_a_death_mid_capture() {
    let srv = TestServer::start("graphedge");
    let a = Conn::connect_to(&srv.socket()).unwrap();
    stream_create(&a, S);
    let p = alloc(&a, 4096);
    a.push(
        0,
        Op::EventCreate,
        &[bytemuck::bytes_of(&wire::EventCreate { id: 9, flags: 2 })],
    )
    .unwrap();
    capture(&a, Op::CaptureBegin, S).unwrap();
    let rec = wire::EventRecord {
        event: 9,
        stream: S,
    };
    a.push(0, Op::EventRecord, &[bytemuck::bytes_of(&rec)])
        .unwrap();
    assert_eq!(
        sync(&a, Op::EventSync, 9),
        Err(907),
        "an event a capture recorded"
    );
    assert_eq!(sync(&a, Op::EventQuery, 9), Err(907));
    // A free during the capture does not touch it (its fence waits for other streams).
    a.push(
        0,
        Op::MemFree,
        &[bytemuck::bytes_of(&wire::MemFree { ptr: p })],
    )
    .unwrap();
    assert_eq!(
        status(&a, S).status,
        graph::STATUS_ACTIVE,
        "still capturing"
    );
    let g = capture(&a, Op::CaptureEnd, S).unwrap();
    assert!(g != 0);
    // Recorded again outside a capture, it can be waited for.
    a.push(
        0,
        Op::EventRecord,
        &[bytemuck::bytes_of(&wire::EventRecord {
            event: 9,
            stream: 0,
        })],
    )
    .unwrap();
    sync(&a, Op::EventSync, 9).unwrap();
    // A client that dies in the middle of a capture leaves none behind.
    capture(&a, Op::CaptureBegin, S).unwrap();
    assert_eq!(srv.gpu.captures(), 1);
    drop(a);
    let t = Instant::now();
    while srv.gpu.captures() != 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(srv.gpu.captures(), 0, "its capture ended with it");
}

#[test]
fn a_fork_takes_in_no_other_clients_work() {
    // Every queue to each client, so that A can hold the whole class.
    let srv = TestServer::start_with("graph-fork", |c| c.client_queues = Some(4));
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let fa = load_image(&a, HOST_MODULE.as_bytes()).unwrap().1;
    let fb = load_image(&b, HOST_MODULE.as_bytes()).unwrap().1;
    let find = |f: &Vec<(String, u32)>| f.iter().find(|f| f.0 == "fill_u32").unwrap().1;
    let (fa, fb) = (find(&fa), find(&fb));
    let (pa, pb) = (alloc(&a, 4096), alloc(&b, 4096));
    // A's streams take every work stream of the class (the host GPU has 8); B's first
    // stream then shares one of them.
    let mine: Vec<u32> = (11..19).collect();
    for &id in &mine {
        stream_create(&a, id);
        launch_fill(&a, fa, id, pa);
    }
    a.ping(0).unwrap();
    stream_create(&b, S);
    launch_fill(&b, fb, S, pb);
    b.ping(0).unwrap();
    // A captures on a stream of its own and forks into all its others, the one B shares
    // included, through an event recorded in the capture.
    let origin = *mine
        .iter()
        .find(|&&id| capture(&a, Op::CaptureBegin, id).is_ok())
        .expect("a stream A holds alone");
    let ev = wire::EventCreate { id: 50, flags: 2 };
    a.push(0, Op::EventCreate, &[bytemuck::bytes_of(&ev)])
        .unwrap();
    let rec = wire::EventRecord {
        event: 50,
        stream: origin,
    };
    a.push(0, Op::EventRecord, &[bytemuck::bytes_of(&rec)])
        .unwrap();
    for &id in mine.iter().filter(|&&id| id != origin) {
        let w = wire::EventRecord {
            event: 50,
            stream: id,
        };
        a.push(0, Op::StreamWaitEvent, &[bytemuck::bytes_of(&w)])
            .unwrap();
    }
    a.ping(0).ok();
    // B's work runs now: none of it enters A's graph.
    let before = srv.gpu.launches();
    launch_fill(&b, fb, S, pb);
    sync(&b, Op::StreamSync, S).unwrap();
    assert_eq!(
        srv.gpu.launches() - before,
        1,
        "B's launch ran, not captured"
    );
    let _ = capture(&a, Op::CaptureEnd, origin);
}

/// A host node on two words of pinned memory (HostNodeAt, the staged copies of
/// api/staged.rs): only inside a capture, only on 8-aligned words of the client's own
/// pinned memory; its replay writes `done`, waits for `ack == 1` and clears it.
#[test]
fn host_node_words_lie_in_the_clients_pinned_memory() {
    let srv = TestServer::start("hostwords");
    let a = Conn::connect_to(&srv.socket()).unwrap();
    stream_create(&a, S);
    let len = 64 << 10;
    let (addr, _fd) = pin_somewhere(&a, len);
    let node = |words: u64| {
        let h = wire::HostNodeAt {
            stream: S,
            _pad: 0,
            words,
        };
        a.push(0, Op::HostNodeAt, &[bytemuck::bytes_of(&h)])
            .unwrap();
    };
    node(addr);
    assert_eq!(sync(&a, Op::CtxSync, 0), Err(401), "outside a capture");
    for bad in [addr + 4, 0x10_0000, addr + len as u64 - 4, u64::MAX - 7] {
        capture(&a, Op::CaptureBegin, S).unwrap();
        node(bad);
        capture(&a, Op::CaptureEnd, S).unwrap();
        assert_eq!(sync(&a, Op::CtxSync, 0), Err(1), "words at {bad:#x}");
    }
    capture(&a, Op::CaptureBegin, S).unwrap();
    node(addr);
    let g = capture(&a, Op::CaptureEnd, S).unwrap() as u32;
    let e = instantiate(&a, g).unwrap();
    // The server in this process mapped the pinned range at its address.
    // SAFETY: two words of that mapping, which stays until the client goes.
    let (done, ack) = unsafe {
        (
            &*(addr as *const std::sync::atomic::AtomicU32),
            &*((addr + 4) as *const std::sync::atomic::AtomicU32),
        )
    };
    ack.store(1, std::sync::atomic::Ordering::SeqCst);
    let l = wire::GraphLaunch { exec: e, stream: S };
    a.push(0, Op::GraphLaunch, &[bytemuck::bytes_of(&l)])
        .unwrap();
    sync(&a, Op::StreamSync, S).unwrap();
    assert_eq!(
        done.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "done set"
    );
    assert_eq!(
        ack.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "ack cleared"
    );
}

/// A stream the capture forked into, destroyed after it joined back (graphMemoryNodes
/// does this inside its capture): the capture goes on, as natively, and the graph holds
/// the forked stream's work. The work stream stays the client's until the capture ends.
#[test]
fn a_forked_stream_destroyed_after_it_joined_keeps_the_capture() {
    let srv = TestServer::start("graph-fork-destroy");
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let f = load_image(&a, HOST_MODULE.as_bytes()).unwrap().1;
    let fill = f.iter().find(|f| f.0 == "fill_u32").unwrap().1;
    let p = alloc(&a, 4096);
    let (origin, forked) = (31, 32);
    stream_create(&a, origin);
    stream_create(&a, forked);
    capture(&a, Op::CaptureBegin, origin).unwrap();
    let event = |id: u32, op: Op, stream: u32| {
        let r = wire::EventRecord { event: id, stream };
        a.push(0, op, &[bytemuck::bytes_of(&r)]).unwrap();
    };
    for id in [60, 61] {
        let ev = wire::EventCreate { id, flags: 2 };
        a.push(0, Op::EventCreate, &[bytemuck::bytes_of(&ev)])
            .unwrap();
    }
    event(60, Op::EventRecord, origin);
    event(60, Op::StreamWaitEvent, forked); // the fork
    launch_fill(&a, fill, forked, p);
    event(61, Op::EventRecord, forked);
    event(61, Op::StreamWaitEvent, origin); // the join
    let h = wire::Handle {
        id: forked,
        _pad: 0,
    };
    a.push(0, Op::StreamDestroy, &[bytemuck::bytes_of(&h)])
        .unwrap();
    a.ping(0).unwrap();
    assert_eq!(
        status(&a, origin).status,
        graph::STATUS_ACTIVE,
        "the capture goes on"
    );
    let before = srv.gpu.launches();
    let g = capture(&a, Op::CaptureEnd, origin).expect("the capture ends in a graph") as u32;
    let e = instantiate(&a, g).unwrap();
    let l = wire::GraphLaunch {
        exec: e,
        stream: origin,
    };
    a.push(0, Op::GraphLaunch, &[bytemuck::bytes_of(&l)])
        .unwrap();
    sync(&a, Op::StreamSync, origin).unwrap();
    assert_eq!(
        srv.gpu.launches() - before,
        1,
        "the replay ran the forked stream's launch"
    );
}

/// Found in review: a graph whose memory ranges could not be read was instantiated
/// unchecked, so nothing said its replays wrote only the client's memory. Now it is
/// refused, and instantiated once they can be read.
#[test]
fn a_graph_whose_memory_cannot_be_read_is_not_instantiated() {
    let srv = TestServer::start("graph-unreadable");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let p = alloc(&c, 64);
    stream_create(&c, S);
    capture(&c, Op::CaptureBegin, S).unwrap();
    memset_words_on(&c, S, p, 3, 0);
    let g = capture(&c, Op::CaptureEnd, S).unwrap() as u32;
    srv.gpu.fail_graph_reads(true);
    assert_eq!(instantiate(&c, g), Err(1), "CUDA_ERROR_INVALID_VALUE");
    srv.gpu.fail_graph_reads(false);
    assert!(instantiate(&c, g).is_ok());
}

/// Found in review: a VMM reservation given back while an executable graph's memset
/// writes a range in it went to the driver at once, and its addresses could become
/// another client's reservation, which the next replay would write. The driver keeps it
/// reserved until the graph goes; the client sees it freed, as natively.
#[test]
fn a_reservation_a_live_graph_writes_stays_reserved_until_the_graph_goes() {
    use omps_ring::wire::vmm;
    let srv = TestServer::start("graph-vmm-reservation");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let g = vmm_call(&c, vmm::GRANULARITY, 0, [0, 0, 0]).unwrap();
    let at = vmm_call(&c, vmm::RESERVE, 0, [g, 0, 0]).unwrap();
    let h = vmm_call(&c, vmm::CREATE, 0, [g, 0, 0]).unwrap() as u32;
    vmm_call(&c, vmm::MAP, h, [at, g, 0]).unwrap();
    vmm_call(&c, vmm::SET_ACCESS, 0, [at, g, 0]).unwrap();
    stream_create(&c, S);
    capture(&c, Op::CaptureBegin, S).unwrap();
    memset_words_on(&c, S, at, 3, 0);
    let graph = capture(&c, Op::CaptureEnd, S).unwrap() as u32;
    let exec = instantiate(&c, graph).unwrap();
    vmm_call(&c, vmm::UNMAP, 0, [at, g, 0]).unwrap();
    vmm_call(&c, vmm::RELEASE, h, [0, 0, 0]).unwrap();
    vmm_call(&c, vmm::ADDRESS_FREE, 0, [at, g, 0]).expect("freed, as natively");
    c.ping(0).unwrap();
    assert_eq!(
        srv.gpu.vmm_live().0,
        1,
        "the driver still holds the reservation"
    );
    assert!(
        vmm_call(&c, vmm::ADDRESS_FREE, 0, [at, g, 0]).is_err(),
        "the client's no more"
    );
    assert!(
        destroy_exec_until(&c, exec, || srv.gpu.vmm_live().0 == 0),
        "the graph went, and the reservation with it"
    );
}

/// Found in review: page-locked memory a graph copies into stayed out of the graph's
/// ranges, so once the client unregistered it the server unmapped it while the graph
/// lived, and a replay copied to whatever the server mapped there next (another client's
/// segment, say). It stays registered and mapped until the graph goes.
#[test]
fn page_locked_memory_a_live_graph_copies_into_stays_until_the_graph_goes() {
    let srv = TestServer::start("graph-pinned");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let p = alloc(&c, 4096);
    let (addr, _fd) = pin_somewhere(&c, 64 << 10);
    assert!(srv.gpu.registered_at(addr));
    stream_create(&c, S);
    capture(&c, Op::CaptureBegin, S).unwrap();
    let copy = wire::PinnedCopy {
        dev: p,
        host: addr,
        len: 4096,
        stream: S,
        _pad: 0,
    };
    c.push(0, Op::CopyDtoHPinned, &[bytemuck::bytes_of(&copy)])
        .unwrap();
    let graph = capture(&c, Op::CaptureEnd, S).unwrap() as u32;
    let exec = instantiate(&c, graph).unwrap();
    c.host_request(wire::hostmem::UNPIN, addr, 0, None)
        .expect("unregistered, as natively");
    c.ping(0).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        srv.gpu.registered_at(addr),
        "still registered while the graph copies there"
    );
    assert!(
        destroy_exec_until(&c, exec, || !srv.gpu.registered_at(addr)),
        "gone with the graph"
    );
}

/// Review of the server core (issue 23): a host node's two words (HostNodeAt) lie in
/// page-locked memory and every replay writes them, but they are batch memory operation
/// nodes, which the graph's ranges leave out. So once the client unregisters that memory
/// the server unmaps and unregisters it while the executable graph lives, and a replay
/// writes (and waits on) whatever the server maps there next. Expected: held as a memcpy
/// node's page-locked side is.
#[test]
fn page_locked_words_a_live_graphs_host_node_uses_stay_until_the_graph_goes() {
    let srv = TestServer::start("graph-pinned-words");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    stream_create(&c, S);
    let (addr, _fd) = pin_somewhere(&c, 64 << 10);
    assert!(srv.gpu.registered_at(addr));
    capture(&c, Op::CaptureBegin, S).unwrap();
    let h = wire::HostNodeAt {
        stream: S,
        _pad: 0,
        words: addr,
    };
    c.push(0, Op::HostNodeAt, &[bytemuck::bytes_of(&h)])
        .unwrap();
    let graph = capture(&c, Op::CaptureEnd, S).unwrap() as u32;
    let _exec = instantiate(&c, graph).unwrap();
    c.host_request(wire::hostmem::UNPIN, addr, 0, None)
        .expect("unregistered, as natively");
    c.ping(0).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        srv.gpu.registered_at(addr),
        "unregistered while a live graph's host node writes it"
    );
}

/// As above, for a copy of the graph (cuGraphClone, GRAPH_CLONE) whose original is gone:
/// the copy's host node writes the same words, so they stay while its executable graph
/// lives.
#[test]
fn page_locked_words_a_cloned_graphs_host_node_uses_stay_until_the_graph_goes() {
    let srv = TestServer::start("graph-pinned-words-clone");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    stream_create(&c, S);
    let (addr, _fd) = pin_somewhere(&c, 64 << 10);
    capture(&c, Op::CaptureBegin, S).unwrap();
    let h = wire::HostNodeAt {
        stream: S,
        _pad: 0,
        words: addr,
    };
    c.push(0, Op::HostNodeAt, &[bytemuck::bytes_of(&h)])
        .unwrap();
    let graph = capture(&c, Op::CaptureEnd, S).unwrap() as u32;
    let mut ch = c.channel();
    ch.call(0, Op::GraphCond, |call| {
        bytemuck::bytes_of(&wire::GraphCond {
            call,
            kind: wire::graph::GRAPH_CLONE,
            graph,
            ..Default::default()
        })
        .to_vec()
    })
    .unwrap();
    let copy = ch.reply::<wire::U64Reply>().value as u32;
    let gone = wire::Handle { id: graph, _pad: 0 };
    c.push(0, Op::GraphDestroy, &[bytemuck::bytes_of(&gone)])
        .unwrap();
    let _exec = instantiate(&c, copy).unwrap();
    c.host_request(wire::hostmem::UNPIN, addr, 0, None)
        .expect("unregistered, as natively");
    c.ping(0).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        srv.gpu.registered_at(addr),
        "unregistered while a live copy's host node writes it"
    );
}

/// Review of the server core (issue 23, finding 3): a capture's copy to a CUDA array is a
/// memcpy node naming the array, which the graph's ranges leave out (an array is no
/// device range), so destroying the array freed it while a live graph copied there, and
/// its handle could become another client's array. It stays until the client's graphs go.
#[test]
fn an_array_a_live_graph_copies_into_stays_until_the_graphs_go() {
    let srv = TestServer::start("graph-array");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    stream_create(&c, S);
    let p = alloc(&c, 4096);
    let mut ch = c.channel();
    ch.call(0, Op::Array, |call| {
        bytemuck::bytes_of(&wire::ArrayCall {
            call,
            kind: wire::array::CREATE,
            id: 0,
            // 16 x 8 floats, one channel.
            args: [16, 8, 0, 0x20, 1, 0, 0],
        })
        .to_vec()
    })
    .unwrap();
    let array = ch.reply::<wire::U64Reply>().value as u32;
    let before = srv.gpu.arrays_live();
    capture(&c, Op::CaptureBegin, S).unwrap();
    let copy = wire::ArrayCopy {
        stream: S,
        src: wire::CopySide {
            dev: p,
            pitch: 64,
            ..Default::default()
        },
        dst: wire::CopySide {
            array,
            ..Default::default()
        },
        width: 64,
        height: 8,
        depth: 1,
        ..Default::default()
    };
    c.push(0, Op::ArrayCopy, &[bytemuck::bytes_of(&copy)])
        .unwrap();
    let graph = capture(&c, Op::CaptureEnd, S).unwrap() as u32;
    let exec = instantiate(&c, graph).unwrap();
    let gone = wire::ArrayCall {
        kind: wire::array::DESTROY,
        id: array,
        ..Default::default()
    };
    ch.call(0, Op::Array, |call| {
        bytemuck::bytes_of(&wire::ArrayCall { call, ..gone }).to_vec()
    })
    .unwrap();
    c.ping(0).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        srv.gpu.arrays_live(),
        before,
        "destroyed while a live graph copies into it"
    );
    let g = wire::Handle { id: graph, _pad: 0 };
    c.push(0, Op::GraphDestroy, &[bytemuck::bytes_of(&g)])
        .unwrap();
    assert!(
        destroy_exec_until(&c, exec, || srv.gpu.arrays_live() + 1 == before),
        "gone with the graphs"
    );
}
