//! Review 4 (fix-compile): failing proofs.

mod common;
use common::*;
use omps_ring::wire::{self, ChunkCopy, ModuleLoad, Op};
use omps_shim::conn::Conn;
use std::time::{Duration, Instant};

const SLOW_IMAGE: &[u8] = b"omps-host-module\nfn omps-host-slow-load 0:8\nglobal g 4096\n\0";

/// Pushes a ModuleLoad of `img` and never waits for its answer.
fn push_load(a: &Conn, img: &[u8]) {
    let mut ch = a.channel();
    ch.wait_chunk(0).unwrap();
    let (ptr, cap) = ch.chunk_ptr(0);
    assert!(img.len() <= cap);
    // SAFETY: the chunk is ours and larger than the image.
    unsafe { std::ptr::copy_nonoverlapping(img.as_ptr(), ptr, img.len()) };
    let seq = ch.claim_chunk(0);
    let rec = ChunkCopy {
        channel: ch.idx,
        chunk: 0,
        len: img.len() as u32,
        seq,
        ..Default::default()
    };
    a.push(0, Op::BlobAppend, &[bytemuck::bytes_of(&rec)]).unwrap();
    ch.wait_chunk(0).unwrap();
    let call = ch.next_call();
    let load = ModuleLoad {
        call,
        blob_len: img.len() as u64,
    };
    a.push(0, Op::ModuleLoad, &[bytemuck::bytes_of(&load)]).unwrap();
    let _ = wire::CallHdr::default();
}

/// One process, never more than ONE connection open at a time (well under every
/// per-process cap), connects, pushes a slow load, and leaves; 24 times. A client gone
/// leaves its job queued/running on the GPU's compile threads (Pending::drop only marks
/// the slot), so the GPU's 8 threads and an unbounded queue fill with dead clients' work.
/// Another client's ordinary module load then waits ~ 24/8 x 2 s.
#[test]
fn dead_clients_compile_jobs_stall_every_other_load() {
    let srv = TestServer::start("r4-dead-jobs");
    srv.gpu.slow_loads(Duration::from_secs(2));
    for k in 0..24 {
        let a = loop {
            match Conn::connect_to(&srv.socket()) {
                Ok(a) => break a,
                Err(e) => {
                    eprintln!("cycle {k}: refused {e:?}; retrying");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        };
        push_load(&a, SLOW_IMAGE);
        // Let the lane take the record before we go.
        std::thread::sleep(Duration::from_millis(30));
        drop(a);
    }
    let v = Conn::connect_to(&srv.socket()).unwrap();
    let t = Instant::now();
    let (_, funcs) = load_image(&v, b"omps-host-module\nfn k 0:8\nglobal h 64\n\0").unwrap();
    let took = t.elapsed();
    assert_eq!(funcs.len(), 1);
    assert!(
        took < Duration::from_millis(1000),
        "a victim's plain module load waited {took:?} behind dead clients' compile jobs"
    );
}

/// One process with 8 live connections (cap is 64 per process) holds all 8 compile
/// threads; another client's load waits for the whole slow compile.
#[test]
fn one_process_holds_every_compile_thread() {
    let srv = TestServer::start("r4-eight");
    srv.gpu.slow_loads(Duration::from_secs(3));
    let mut held = Vec::new();
    for _ in 0..8 {
        let a = Conn::connect_to(&srv.socket()).unwrap();
        push_load(&a, SLOW_IMAGE);
        held.push(a);
    }
    std::thread::sleep(Duration::from_millis(200));
    let v = Conn::connect_to(&srv.socket()).unwrap();
    let t = Instant::now();
    let (_, funcs) = load_image(&v, b"omps-host-module\nfn k 0:8\nglobal h 64\n\0").unwrap();
    let took = t.elapsed();
    assert_eq!(funcs.len(), 1);
    assert!(
        took < Duration::from_millis(1000),
        "a victim's plain module load waited {took:?} behind one process's 8 slow loads"
    );
}
