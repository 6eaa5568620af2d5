//! What one namespace's pod could do to another's, found by the third review of issue 23
//! (control plane): take every client slot from one process, or every handshake slot
//! from eight. Each test failed on the reviewed code (01c2493).

mod common;
use common::namespaces::*;
use common::*;
use omps_ring::wire::{self, Hello};
use omps_shim::conn::{settings_from, Conn};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// The bounds every test of this binary runs under (read once per process).
fn small_bounds() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: set before any server in this process reads its bounds.
        unsafe { std::env::set_var("OMPS_MAX_CLIENTS", "16") };
    });
}

/// A pod of namespace `team-a`, from one process, opens OMPS_MAX_CLIENTS client
/// connections (nothing bounds a process's or a namespace's connections): every client of
/// every other namespace is then refused with CUDA_ERROR_MPS_MAX_CLIENTS_REACHED.
#[test]
fn one_process_of_one_namespace_takes_every_client_slot() {
    small_bounds();
    let srv = TestServer::start("review-ctl-slots");
    let a = ns_socket(&srv, "team-a");
    let b = ns_socket(&srv, "team-b");
    let plain = settings_from(|_| None).unwrap();
    let mut held = Vec::new();
    let refused = loop {
        match Conn::connect_with(&a, &plain) {
            Ok(c) => held.push(c),
            Err(e) => break Some(e),
        }
        if held.len() > 64 {
            break None;
        }
    };
    // Fixed: team-a's share stops it short of every slot, with the clients' refusal.
    assert!(
        !held.is_empty() && held.len() < 16,
        "the attacker got {} connections",
        held.len()
    );
    assert_eq!(
        refused.map(|e| e.0),
        Some(808),
        "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"
    );
    let victim = victim_connects("review_ctl_victim_child", VICTIM, &b);
    assert!(
        victim.is_ok(),
        "a client of team-b was refused while one process of team-a holds {} connections: {:?}",
        held.len(),
        victim.err()
    );
}

/// The child process of a victim (common::namespaces::victim_child).
const VICTIM: &str = "REVIEW_CTL_VICTIM";

#[test]
fn review_ctl_victim_child() {
    victim_child(VICTIM);
}

/// The child processes of the handshake test: each opens 8 connections to the socket in
/// REVIEW_CTL_HOLD and stays silent for 4 s.
const HOLD: &str = "REVIEW_CTL_HOLD";

#[test]
fn review_ctl_holder_child() {
    let Some(path) = std::env::var_os(HOLD) else {
        return;
    };
    let held: Vec<UnixStream> = (0..8)
        .filter_map(|_| UnixStream::connect(Path::new(&path)).ok())
        .collect();
    // A client hello and nothing more: the settings never come.
    let hello = Hello {
        magic: wire::HELLO_MAGIC,
        version: wire::PROTOCOL_VERSION,
        kind: wire::kind::CLIENT,
    };
    for s in &held {
        let _ = (&*s).write_all(bytemuck::bytes_of(&hello));
    }
    println!("HELD {}", held.len());
    std::thread::sleep(Duration::from_secs(4));
}

/// A pod of namespace `team-a` with 8 processes (the server sees pods' PIDs: hostPID),
/// each holding 8 silent handshakes, takes all OMPS_MAX_HANDSHAKES (64): a client of
/// team-b connecting meanwhile is closed at once (CUDA_ERROR_MPS_CONNECTION_FAILED), and
/// the pod renews its connections every 2 s.
#[test]
fn eight_processes_of_one_namespace_lock_every_other_namespace_out_of_handshakes() {
    small_bounds();
    let srv = TestServer::start("review-ctl-hs");
    let a = ns_socket(&srv, "team-a");
    let b = ns_socket(&srv, "team-b");
    let kids: Vec<std::process::Child> = (0..8)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "review_ctl_holder_child", "--nocapture"])
                .env(HOLD, &a)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Wait for every child to have connected.
    let mut kids_out = Vec::new();
    for mut k in kids {
        use std::io::BufRead;
        let out = k.stdout.take().unwrap();
        let mut r = std::io::BufReader::new(out);
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap() == 0 || line.starts_with("HELD") {
                break;
            }
        }
        kids_out.push((k, r));
    }
    std::thread::sleep(Duration::from_millis(200));
    let plain = settings_from(|_| None).unwrap();
    let t = std::time::Instant::now();
    let victim = Conn::connect_with(&b, &plain);
    // At once, not after team-a's handshakes timed out (2 s) and the shim tried again.
    let took = t.elapsed();
    for (mut k, _) in kids_out {
        let _ = k.wait();
    }
    assert!(
        victim.is_ok(),
        "a client of team-b was refused while team-a's pod held the handshakes: {:?}",
        victim.err()
    );
    assert!(
        took < Duration::from_secs(1),
        "team-b's client got in only after {took:?}"
    );
}
