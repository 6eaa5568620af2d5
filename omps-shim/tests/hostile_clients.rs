//! Clients that misbehave or die must cost the others nothing.

mod common;
use common::*;
use omps_ring::ring::RingHeader;
use omps_ring::segment::state;
use omps_ring::wire::{self, MemAlloc, Op};
use omps_shim::conn::Conn;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[test]
fn garbage_in_the_ring_disconnects_only_that_client() {
    let srv = TestServer::start("garbage");
    let good = Conn::connect_to(&srv.socket()).unwrap();
    let bad = Conn::connect_to(&srv.socket()).unwrap();
    good.ping(0).unwrap();
    bad.ping(0).unwrap();
    let (hdr, _, _) = bad.seg().ring_parts(0);
    // SAFETY: the ring header lies in our own mapping; the tail counter is its first word.
    unsafe { (hdr as *mut RingHeader as *mut u64).write_volatile(0x1234_5678_9abc_def1) };
    bad.ring_bell(0);
    assert!(
        wait_disconnected(&bad),
        "server kept a client with a corrupt ring"
    );
    assert_eq!(
        bad.seg().header().server_state.load(Ordering::SeqCst),
        state::DISCONNECTED
    );
    // The other client and the server go on.
    good.ping(0).unwrap();
    let p = alloc(&good, 4096);
    assert_ne!(p, 0);
    assert!(srv.ctl("status").0);
}

/// A CopyHtoDInline record for `dev` that claims `len` bytes and carries `carried`.
fn inline_lie(dev: u64, len: u32, carried: usize) -> (Op, Vec<u8>) {
    let rec = wire::InlineCopy {
        dev,
        stream: 0,
        len,
    };
    let mut bytes = bytemuck::bytes_of(&rec).to_vec();
    bytes.resize(bytes.len() + carried, 0);
    (Op::CopyHtoDInline, bytes)
}

#[test]
fn records_that_lie_disconnect_the_client() {
    let srv = TestServer::start("lies");
    let good = Conn::connect_to(&srv.socket()).unwrap();
    // Each of these is a well-formed ring record whose contents no honest shim sends.
    let lies: Vec<(Op, Vec<u8>)> = vec![
        (
            Op::Launch,
            bytemuck::bytes_of(&wire::Launch {
                func: 99,
                ..Default::default()
            })
            .to_vec(),
        ),
        (Op::Memset, vec![0u8; 8]),
        // Inline copies of the wrong length, unaligned, or shorter than they say.
        inline_lie(0, 12, 12),
        inline_lie(2, 4, 4),
        inline_lie(0, 8, 4),
        (
            Op::StreamDestroy,
            bytemuck::bytes_of(&wire::Handle { id: 0, _pad: 0 }).to_vec(),
        ),
        (
            Op::EventRecord,
            bytemuck::bytes_of(&wire::EventRecord {
                event: 5,
                stream: 0,
            })
            .to_vec(),
        ),
        (
            Op::CopyHtoDChunk,
            bytemuck::bytes_of(&wire::ChunkCopy {
                channel: 1000,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::CopyHtoDChunk,
            bytemuck::bytes_of(&wire::ChunkCopy {
                chunk: 9,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::CopyDtoHChunk,
            bytemuck::bytes_of(&wire::ChunkCopy {
                len: u32::MAX,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::MemAlloc,
            bytemuck::bytes_of(&MemAlloc {
                call: wire::CallHdr {
                    channel: 77,
                    seq: 1,
                },
                size: 8,
            })
            .to_vec(),
        ),
        // Virtual memory: a call that does not exist, and bytes after the record.
        (
            Op::Vmm,
            bytemuck::bytes_of(&wire::Vmm {
                kind: 99,
                ..Default::default()
            })
            .to_vec(),
        ),
        (Op::Vmm, vec![0u8; std::mem::size_of::<wire::Vmm>() + 8]),
        // A tensor map whose rank would make the driver read past the record's arrays,
        // one of an unknown kind, and a ReplaceAddress without its 128-byte descriptor.
        (
            Op::TensorMap,
            bytemuck::bytes_of(&wire::TensorMap {
                kind: wire::tensor_map::TILED,
                rank: 9,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::TensorMap,
            bytemuck::bytes_of(&wire::TensorMap {
                kind: 42,
                rank: 2,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::TensorMap,
            bytemuck::bytes_of(&wire::TensorMap {
                kind: wire::tensor_map::REPLACE_ADDRESS,
                ..Default::default()
            })
            .to_vec(),
        ),
        // A JIT link of an empty (truncated) container, and a fetch of link output that
        // does not exist.
        (
            Op::Link,
            bytemuck::bytes_of(&wire::ModuleLoad::default()).to_vec(),
        ),
        (
            Op::ModuleLoadJit,
            bytemuck::bytes_of(&wire::ModuleLoad::default()).to_vec(),
        ),
        (
            Op::BlobFetch,
            bytemuck::bytes_of(&wire::ChunkCopy {
                len: 16,
                ..Default::default()
            })
            .to_vec(),
        ),
        // Graphs, capture, host functions and IPC: ids that were never handed out, a slot
        // beyond the page, an event id reused.
        (
            Op::GraphLaunch,
            bytemuck::bytes_of(&wire::GraphLaunch {
                exec: 77,
                stream: 0,
            })
            .to_vec(),
        ),
        (
            Op::GraphDestroy,
            bytemuck::bytes_of(&wire::Handle { id: 77, _pad: 0 }).to_vec(),
        ),
        (
            Op::GraphExecDestroy,
            bytemuck::bytes_of(&wire::Handle { id: 77, _pad: 0 }).to_vec(),
        ),
        (
            Op::CaptureBegin,
            bytemuck::bytes_of(&wire::CaptureCall {
                stream: 55,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::CaptureStatus,
            bytemuck::bytes_of(&wire::HandleCall {
                id: 55,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::HostFunc,
            bytemuck::bytes_of(&wire::HostFunc {
                slot: 1 << 20,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::HostNode,
            bytemuck::bytes_of(&wire::HostFunc {
                slot: 1 << 20,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::EventRecordExternal,
            bytemuck::bytes_of(&wire::EventRecord {
                event: 55,
                stream: 0,
            })
            .to_vec(),
        ),
        (
            Op::StreamWaitEventExternal,
            bytemuck::bytes_of(&wire::EventRecord {
                event: 55,
                stream: 0,
            })
            .to_vec(),
        ),
        (
            Op::IpcGetEventHandle,
            bytemuck::bytes_of(&wire::HandleCall {
                id: 55,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::GraphQuery,
            vec![0u8; std::mem::size_of::<wire::GraphQuery>() + 4],
        ),
        // A conditional-graph operation that does not exist.
        (
            Op::GraphCond,
            bytemuck::bytes_of(&wire::GraphCond {
                kind: 99,
                ..Default::default()
            })
            .to_vec(),
        ),
        // Arrays, copies and texture objects naming what the liar does not hold, or
        // kinds that do not exist.
        (
            Op::Array,
            bytemuck::bytes_of(&wire::ArrayCall {
                kind: wire::array::DESTROY,
                id: 77,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::Array,
            bytemuck::bytes_of(&wire::ArrayCall {
                kind: 99,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::Array,
            bytemuck::bytes_of(&wire::ArrayCall {
                kind: wire::array::CREATE,
                args: [16, 16, 0, 1 << 40, 1, 0, 0],
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::ArrayCopy,
            bytemuck::bytes_of(&wire::ArrayCopy {
                src: wire::CopySide {
                    array: 5,
                    ..Default::default()
                },
                width: 4,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::ArrayCopy,
            bytemuck::bytes_of(&wire::ArrayCopy {
                width: 4,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::TexObject,
            bytemuck::bytes_of(&wire::TexCall {
                kind: wire::tex::CREATE_TEXTURE,
                res_type: 0,
                array: 9,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::TexObject,
            bytemuck::bytes_of(&wire::TexCall {
                kind: wire::tex::DESTROY_SURFACE,
                object: 1234,
                ..Default::default()
            })
            .to_vec(),
        ),
        (
            Op::TexObject,
            bytemuck::bytes_of(&wire::TexCall {
                kind: wire::tex::CREATE_SURFACE,
                res_type: 2,
                ..Default::default()
            })
            .to_vec(),
        ),
    ];
    for (op, rec) in lies {
        let liar = Conn::connect_to(&srv.socket()).unwrap();
        liar.push(0, op, &[&rec]).unwrap();
        assert!(wait_disconnected(&liar), "{op:?} with a lie was accepted");
        good.ping(0).unwrap();
    }
    assert!(alloc(&good, 64) != 0);
}

#[test]
fn a_dead_clients_memory_is_freed_and_others_go_on() {
    let srv = TestServer::start("death");
    let survivor = Conn::connect_to(&srv.socket()).unwrap();
    let keep = alloc(&survivor, 1 << 20);
    let victim = Conn::connect_to(&srv.socket()).unwrap();
    for _ in 0..8 {
        alloc(&victim, 1 << 20);
    }
    assert_eq!(srv.gpu.bytes_allocated(), 9 << 20);
    // Two clients' segments and the two spare ones the server makes ahead.
    let regs = 4;
    let t = Instant::now();
    while srv.gpu.registered_ranges() != regs && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(victim); // the socket closes, as when a process is killed
    let t = Instant::now();
    while srv.gpu.bytes_allocated() != 1 << 20 && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        srv.gpu.bytes_allocated(),
        1 << 20,
        "victim's memory not freed"
    );
    let t = Instant::now();
    while srv.gpu.registered_ranges() != regs - 1 && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        srv.gpu.registered_ranges(),
        regs - 1,
        "victim's segment still registered"
    );
    let ps = srv.wait_ps(2, |ps| ps.lines().count() == 2);
    assert_eq!(ps.lines().count(), 2, "only the survivor is listed: {ps}");
    survivor.ping(0).unwrap();
    assert_ne!(keep, 0);
}

#[test]
fn control_commands_answer_and_unknown_ones_fail() {
    let srv = TestServer::start("ctl");
    let (ok, status) = srv.ctl("status");
    assert!(
        ok && status.contains("ACTIVE") && status.contains("omps host test device 0"),
        "{status}"
    );
    let (ok, text) = srv.ctl("frobnicate");
    assert!(
        !ok && text.contains("unknown or malformed command 'frobnicate'"),
        "{text}"
    );
    let (ok, list) = srv.ctl("get_server_list");
    assert!(ok && list.trim() == std::process::id().to_string());
}

#[test]
fn a_second_server_on_the_same_pipe_directory_is_refused() {
    let srv = TestServer::start("twice");
    let cfg = omps_server::ServerConfig::minimal(srv.dir.clone());
    let err = omps_server::Server::new(cfg, vec![], 13000)
        .err()
        .expect("second server refused");
    assert!(err.to_string().contains("already runs"), "{err}");
    // It took nothing: the first server's socket still serves.
    Conn::connect_to(&srv.socket())
        .expect("the first server still serves")
        .ping(0)
        .unwrap();
}

#[test]
fn a_fault_fails_every_client_refuses_new_ones_and_recovers_once_they_are_gone() {
    let srv = TestServer::start("fault");
    let bystander = Conn::connect_to(&srv.socket()).unwrap();
    let culprit = Conn::connect_to(&srv.socket()).unwrap();
    launch_trap(&culprit);
    let sync = sync_default_stream;
    assert!(
        sync(&culprit).is_err(),
        "the fault surfaces at the next synchronization"
    );
    // Every client of the GPU is told; new clients are refused while it lasts.
    let t = Instant::now();
    while bystander.check_alive().is_ok() && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        bystander.seg().header().server_state.load(Ordering::SeqCst),
        state::FAULT
    );
    assert!(srv.ctl("status").1.contains("FAULT"));
    let refused = Conn::connect_to(&srv.socket())
        .err()
        .expect("refused during the fault");
    assert_eq!(
        refused.0, 807,
        "CUDA_ERROR_MPS_SERVER_NOT_READY: {}",
        refused.1
    );
    // Once the faulted clients are gone, the context is recreated and clients work again.
    drop(culprit);
    drop(bystander);
    let t = Instant::now();
    let fresh = loop {
        match Conn::connect_to(&srv.socket()) {
            Ok(c) => break c,
            Err(_) if t.elapsed() < Duration::from_secs(3) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("no recovery: {}", e.1),
        }
    };
    assert!(srv.ctl("status").1.contains("ACTIVE"));
    assert_ne!(alloc(&fresh, 4096), 0);
    sync(&fresh).unwrap();
}

#[test]
fn bad_printf_requests_are_refused_or_disconnect() {
    let srv = TestServer::start("printf-req");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let other = Conn::connect_to(&srv.socket()).unwrap();
    // A GPU that does not exist is an error, and the client stays.
    assert_eq!(
        c.socket_request(wire::hostmem::PRINTF_FLUSH, 7, 0, None),
        Err(101)
    );
    assert_eq!(
        c.socket_request(wire::hostmem::PRINTF_FLUSH, 0, 0, None),
        Ok(wire::printf_reply(b"", b""))
    );
    c.socket_request(wire::hostmem::PRINTF_USE, 0, wire::printf_use::YES, None)
        .unwrap();
    c.ping(0).unwrap();
    // A level that means nothing is a malformed request: that client goes, no other.
    let _ = c.socket_request(wire::hostmem::PRINTF_USE, 0, 9, None);
    assert!(
        wait_disconnected(&c),
        "server kept a client that sent garbage"
    );
    other.ping(0).unwrap();
    assert!(srv.ctl("status").0);
}

#[test]
fn a_client_cannot_reach_anothers_reservations_or_handles() {
    use omps_ring::wire::vmm;
    let srv = TestServer::start("vmmhostile");
    let owner = Conn::connect_to(&srv.socket()).unwrap();
    let thief = Conn::connect_to(&srv.socket()).unwrap();
    let g = vmm_call(&owner, vmm::GRANULARITY, 0, [0; 3]).unwrap();
    let va = vmm_call(&owner, vmm::RESERVE, 0, [4 * g, 0, 0]).unwrap();
    let h = vmm_call(&owner, vmm::CREATE, 0, [g, 0, 0]).unwrap() as u32;
    // The thief's own reservation, to map the owner's handle into.
    let tva = vmm_call(&thief, vmm::RESERVE, 0, [g, 0, 0]).unwrap();
    assert_eq!(
        vmm_call(&thief, vmm::MAP, h, [tva, g, 0]),
        Err(400),
        "not its handle"
    );
    let th = vmm_call(&thief, vmm::CREATE, 0, [g, 0, 0]).unwrap() as u32;
    // A compression type the driver does not know (the shim checks it too).
    assert_eq!(vmm_call(&thief, vmm::CREATE, 0, [g, 2, 0]), Err(1));
    assert_eq!(
        vmm_call(&thief, vmm::GRANULARITY, 0, [0, u64::MAX, 0]),
        Err(1)
    );
    assert_eq!(
        vmm_call(&thief, vmm::MAP, th, [va, g, 0]),
        Err(1),
        "not its reservation"
    );
    vmm_call(&owner, vmm::MAP, h, [va, g, 0]).unwrap();
    assert_eq!(vmm_call(&thief, vmm::UNMAP, 0, [va, g, 0]), Err(1));
    assert_eq!(vmm_call(&thief, vmm::SET_ACCESS, 0, [va, g, 0]), Err(1));
    assert_eq!(
        vmm_call(&thief, vmm::ADDRESS_FREE, 0, [va, 4 * g, 0]),
        Err(1)
    );
    // Handle ids are numbered per client: the thief's id `h`, if any, is its own.
    assert_eq!(vmm_call(&thief, vmm::RELEASE, th + 1, [0; 3]), Err(400));
    // The owner's mapping still works; a dead owner's memory is all given back.
    vmm_call(&owner, vmm::SET_ACCESS, 0, [va, g, 0]).unwrap();
    let before = srv.gpu.bytes_allocated();
    assert!(before >= g);
    drop(owner);
    let t = Instant::now();
    while srv.gpu.bytes_allocated() > before - g && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        srv.gpu.bytes_allocated(),
        before - g,
        "the dead owner's mapping is gone"
    );
    thief.ping(0).unwrap();
}

#[test]
fn an_operator_can_terminate_a_client() {
    let srv = TestServer::start("terminate");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    alloc(&c, 1 << 20);
    let me = std::process::id();
    let (ok, text) = srv.ctl("terminate_client 999999999");
    assert!(!ok && text.contains("no client with PID"), "{text}");
    let (ok, text) = srv.ctl(&format!("terminate_client 1 {me}"));
    assert!(!ok && text.contains("not this server's"), "{text}");
    assert!(
        c.check_alive().is_ok(),
        "a refused command terminates nobody"
    );
    let (ok, text) = srv.ctl(&format!("terminate_client {me}"));
    assert!(ok, "{text}");
    assert!(wait_disconnected(&c), "the client was not cut off");
    assert_eq!(
        c.check_alive(),
        Err(810),
        "CUDA_ERROR_MPS_CLIENT_TERMINATED"
    );
    let t = Instant::now();
    while srv.gpu.bytes_allocated() != 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(srv.gpu.bytes_allocated(), 0, "its memory released");
    // The server goes on serving.
    let d = Conn::connect_to(&srv.socket()).unwrap();
    assert!(alloc(&d, 4096) != 0);
}

/// The address and size of global `name` of module `m`, through a bare connection.
fn global(c: &Conn, m: u32, name: &str) -> Result<(u64, u64), i32> {
    let mut ch = c.channel();
    ch.call(0, Op::ModuleGetGlobal, |call| {
        let mut r = bytemuck::bytes_of(&wire::ModuleGetGlobal {
            call,
            module: m,
            name_len: name.len() as u32,
        })
        .to_vec();
        r.extend_from_slice(name.as_bytes());
        r
    })?;
    let g: wire::GlobalReply = ch.reply();
    Ok((g.ptr, g.size))
}

#[test]
fn images_that_lie_about_their_size_are_refused() {
    let srv = TestServer::start("images");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    // An empty image (once a dangling pointer to the driver), PTX text with no NUL (the
    // driver read on past the copy), a fatbin and an ELF whose headers state more bytes
    // than were sent, and a fatbin wrapper (its pointer is the client's).
    let mut fatbin = 0xBA55_ED50u32.to_le_bytes().to_vec();
    fatbin.extend_from_slice(&[1, 0, 16, 0]);
    fatbin.extend_from_slice(&(1u64 << 20).to_le_bytes());
    let mut elf = vec![0u8; 64];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2;
    elf[40..48].copy_from_slice(&4096u64.to_le_bytes()); // section headers past the end
    elf[58] = 64;
    elf[60] = 3;
    let mut wrapper = 0x4662_43B1u32.to_le_bytes().to_vec();
    wrapper.extend_from_slice(&[0; 20]);
    for (what, img) in [
        ("empty", Vec::new()),
        ("PTX with no NUL", b".version 8.0\n.target sm_90".to_vec()),
        (
            "module text with no NUL",
            b"omps-host-module\nfn trap\n".to_vec(),
        ),
        ("fatbin", fatbin),
        ("ELF", elf),
        ("fatbin wrapper", wrapper),
    ] {
        assert_eq!(load_image(&c, &img).map(drop), Err(200), "{what}");
    }
    assert!(alloc(&c, 64) != 0, "the client goes on");
}

#[test]
fn a_module_global_is_the_clients_only_while_its_module_is_loaded() {
    let srv = TestServer::start("globals");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let img = b"omps-host-module\nfn fill_u32 0:8 8:4 12:4\nglobal table 64\n\0";
    let (m, _) = load_image(&c, img).unwrap();
    let (p, n) = global(&c, m, "table").unwrap();
    assert_eq!(n, 64);
    memset(&c, p);
    c.ping(0).unwrap();
    c.push(
        0,
        Op::ModuleUnload,
        &[bytemuck::bytes_of(&wire::Handle { id: m, _pad: 0 })],
    )
    .unwrap();
    // Its range may now be another client's: a memset through it is refused.
    memset(&c, p);
    assert_eq!(c.ping(0), Err(1), "CUDA_ERROR_INVALID_VALUE");
}

#[test]
fn a_client_that_hides_its_printing_code_prints_into_no_one_else() {
    let srv = TestServer::start("printf-hide");
    let img = b"omps-host-module\nextern vprintf\nfn print 0:8 8:4\n\0";
    // The honest client declares its printing code; the other loads the same kind of
    // code and says nothing, hoping its text goes to the only client that declared.
    let honest = Conn::connect_to(&srv.socket()).unwrap();
    honest
        .socket_request(wire::hostmem::PRINTF_USE, 0, wire::printf_use::YES, None)
        .unwrap();
    load_image(&honest, img).unwrap();
    let sly = Conn::connect_to(&srv.socket()).unwrap();
    let (_, funcs) = load_image(&sly, img).unwrap();
    let text = b"hidden!\n";
    let p = alloc(&sly, 64);
    let inline = wire::InlineCopy {
        dev: p,
        len: text.len() as u32,
        ..Default::default()
    };
    sly.push(0, Op::CopyHtoDInline, &[bytemuck::bytes_of(&inline), text])
        .unwrap();
    // Give the control thread a poll to learn what the sly client loaded.
    std::thread::sleep(std::time::Duration::from_millis(200));
    launch_print(&sly, funcs[0].1, p, text.len() as u32);
    sly.ping(0).unwrap();
    let got = honest
        .socket_request(wire::hostmem::PRINTF_FLUSH, 0, 1 << 16, None)
        .unwrap();
    let (out, _) = wire::split_printf_reply(&got).unwrap();
    assert!(
        !out.windows(text.len()).any(|w| w == text),
        "another client's text reached the one that declared printing code"
    );
}

#[test]
fn clients_that_die_in_their_handshake_leave_nothing_registered() {
    use std::io::Write;
    let srv = TestServer::start("die-in-handshake");
    drop(Conn::connect_to(&srv.socket()).unwrap());
    let settle = |want: usize| {
        let t = Instant::now();
        while srv.gpu.registered_ranges() > want && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        srv.gpu.registered_ranges()
    };
    // The spare segments made ahead are registered; nothing else.
    std::thread::sleep(Duration::from_millis(200));
    let baseline = srv.gpu.registered_ranges();
    for _ in 0..20 {
        let mut s = std::os::unix::net::UnixStream::connect(srv.socket()).unwrap();
        let hello = wire::Hello {
            magic: wire::HELLO_MAGIC,
            version: wire::PROTOCOL_VERSION,
            kind: wire::kind::CLIENT,
        };
        s.write_all(bytemuck::bytes_of(&hello)).unwrap();
        s.write_all(bytemuck::bytes_of(&wire::ClientSettings::none()))
            .unwrap();
        // Gone before the server's welcome: the segment made for it must go too.
        drop(s);
    }
    let c = Conn::connect_to(&srv.socket()).expect("a client after them connects");
    assert!(alloc(&c, 64) != 0);
    drop(c);
    assert!(
        settle(baseline) <= baseline,
        "segments of clients that died in their handshake stay registered"
    );
}

#[test]
fn a_request_that_waits_for_the_gpu_holds_no_one_else() {
    let srv = TestServer::start("slow-request");
    let a = Conn::connect_to(&srv.socket()).unwrap();
    // A kernel that runs long: a printf flush waits for it.
    srv.gpu.stick_releases(true);
    let waiting = std::thread::spawn(move || {
        let r = a.socket_request(wire::hostmem::PRINTF_FLUSH, 0, 0, None);
        (r, a)
    });
    std::thread::sleep(Duration::from_millis(100));
    // Meanwhile the control thread takes a new client and answers a command.
    let b = Conn::connect_to(&srv.socket()).expect("a client connects meanwhile");
    assert!(alloc(&b, 64) != 0);
    let (ok, text) = srv.ctl("status");
    assert!(ok, "{text}");
    assert!(!waiting.is_finished(), "the flush did not wait for the GPU");
    srv.gpu.stick_releases(false);
    let (r, _a) = waiting.join().unwrap();
    assert_eq!(r, Ok(wire::printf_reply(b"", b"")));
}

#[test]
fn a_client_that_floods_slow_requests_is_cut_off() {
    let srv = TestServer::start("flood");
    let c = Conn::connect_to(&srv.socket()).unwrap();
    let other = Conn::connect_to(&srv.socket()).unwrap();
    // A kernel that runs long holds the first flush; the second comes before its answer.
    srv.gpu.stick_releases(true);
    let req = wire::HostMemRequest {
        kind: wire::hostmem::PRINTF_FLUSH,
        ..Default::default()
    };
    for _ in 0..2 {
        omps_ring::sock::send_with_fds(c.socket_fd(), bytemuck::bytes_of(&req), &[]).unwrap();
    }
    let cut = wait_disconnected(&c);
    srv.gpu.stick_releases(false);
    assert!(cut, "a client with two slow requests in flight was kept");
    assert!(alloc(&other, 64) != 0, "the others go on");
    let (_, text) = srv.ctl("status");
    assert!(!text.is_empty());
}

/// Found in review: the thread that answers pin and printf requests wrote each answer
/// blocking (2 s at most), so a client that asked and never read its answers held every
/// other client's pins and flushes 2 s at a time, again and again. Now a client that does
/// not take its answer within a moment is cut off.
#[test]
fn a_client_that_never_reads_its_answers_holds_no_one_elses() {
    let srv = TestServer::start("unread-answers");
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let b = Conn::connect_to(&srv.socket()).unwrap();
    let req = wire::HostMemRequest {
        kind: wire::hostmem::PRINTF_FLUSH,
        ..Default::default()
    };
    let unread = |c: &Conn| {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD into a local int, on the client's socket.
        unsafe { libc::ioctl(c.socket_fd(), libc::FIONREAD, &mut n) };
        n
    };
    // One request at a time (a second before its answer is a flood), never reading the
    // answers, until one no longer arrives: the server's side of the socket is full.
    let mut asked = 0;
    loop {
        let before = unread(&a);
        if omps_ring::sock::send_with_fds(a.socket_fd(), bytemuck::bytes_of(&req), &[]).is_err() {
            break;
        }
        asked += 1;
        let t = Instant::now();
        while unread(&a) == before && t.elapsed() < Duration::from_millis(300) {
            std::thread::yield_now();
        }
        if unread(&a) == before || asked > 200_000 {
            break;
        }
    }
    assert!(asked > 1, "{asked} requests");
    let t = Instant::now();
    assert_eq!(
        b.socket_request(wire::hostmem::PRINTF_FLUSH, 0, 0, None),
        Ok(wire::printf_reply(b"", b"")),
    );
    assert!(
        t.elapsed() < Duration::from_millis(1000),
        "another client's flush waited {:?} behind one that does not read",
        t.elapsed()
    );
    assert!(
        wait_disconnected(&a),
        "the client that does not read was kept"
    );
}
