//! Compile threads are shared fairly (issue 23, fourth review): one process (its account)
//! has one module load, JIT compile or link at a time on the compile threads, over all its
//! connections, also after it left;
//! a job whose client left is not run. The victim is another process (a child of this
//! test binary): loads of one process are meant to wait for each other.

mod common;
use common::*;
use omps_shim::conn::Conn;
use std::time::{Duration, Instant};

const SLOW_IMAGE: &[u8] = b"omps-host-module\nfn omps-host-slow-load 0:8\nglobal g 4096\n\0";

/// One process, never more than ONE connection open at a time (well under every
/// per-process cap), connects, pushes a slow load, and leaves; 24 times. A client gone
/// leaves its job queued/running on the GPU's compile threads (Pending::drop only marks
/// the slot), so the GPU's 8 threads and an unbounded queue fill with dead clients' work.
/// Another client's ordinary module load then waits ~ 24/8 x 2 s.
const VICTIM: &str = "OMPS_R4_VICTIM";

/// The victim's side, in a child process: a plain load is answered at once.
fn victim_loads_at_once(what: &str) {
    let v = Conn::connect().expect("connects");
    let t = Instant::now();
    let (_, funcs) = load_image(&v, b"omps-host-module\nfn k 0:8\nglobal h 64\n\0").unwrap();
    let took = t.elapsed();
    assert_eq!(funcs.len(), 1);
    assert!(
        took < Duration::from_millis(1000),
        "a victim's plain module load waited {took:?} behind {what}"
    );
}

#[test]
fn dead_clients_compile_jobs_stall_every_other_load() {
    if std::env::var_os(VICTIM).is_some() {
        return victim_loads_at_once("dead clients' compile jobs");
    }
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
    run_client_child(
        &srv,
        "dead_clients_compile_jobs_stall_every_other_load",
        VICTIM,
    );
    // Of the 24 loads, the first ran (its client gone meanwhile); the rest waited for
    // the process's turn in their sessions and went with them: the process's own next
    // load waits for the one job still in the driver at most.
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let t = Instant::now();
    load_image(&a, b"omps-host-module\nfn k 0:8\nglobal h 64\n\0").unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "the process's load waited {:?}: its dead connections' jobs ran",
        t.elapsed()
    );
}

/// One process with 8 live connections (cap is 64 per process) holds all 8 compile
/// threads; another client's load waits for the whole slow compile.
#[test]
fn one_process_holds_every_compile_thread() {
    if std::env::var_os(VICTIM).is_some() {
        return victim_loads_at_once("one process's 8 slow loads");
    }
    let srv = TestServer::start("r4-eight");
    srv.gpu.slow_loads(Duration::from_secs(3));
    let mut held = Vec::new();
    for _ in 0..8 {
        let a = Conn::connect_to(&srv.socket()).unwrap();
        push_load(&a, SLOW_IMAGE);
        held.push(a);
    }
    std::thread::sleep(Duration::from_millis(200));
    run_client_child(&srv, "one_process_holds_every_compile_thread", VICTIM);
    drop(held);
}

/// An honest process's loads, one after another on one connection and at once on several,
/// all load, and one after another cost no more than before.
#[test]
fn one_process_loads_one_after_another_and_on_several_connections() {
    let srv = TestServer::start("r4-honest");
    let a = Conn::connect_to(&srv.socket()).unwrap();
    let t = Instant::now();
    for k in 0..50 {
        let img = format!("omps-host-module\nfn k{k} 0:8\nglobal h 64\n\0");
        let (_, funcs) = load_image(&a, img.as_bytes()).unwrap();
        assert_eq!(funcs.len(), 1);
    }
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "50 loads took {:?}",
        t.elapsed()
    );
    let conns: Vec<Conn> = (0..6)
        .map(|_| Conn::connect_to(&srv.socket()).unwrap())
        .collect();
    std::thread::scope(|s| {
        for (i, c) in conns.iter().enumerate() {
            s.spawn(move || {
                for k in 0..5 {
                    let img = format!("omps-host-module\nfn c{i}k{k} 0:8\nglobal h 64\n\0");
                    assert_eq!(load_image(c, img.as_bytes()).unwrap().1.len(), 1);
                }
            });
        }
    });
}
