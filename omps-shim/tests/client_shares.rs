//! Client slots are shared out (issue 23): one process may have at most
//! OMPS_MAX_CLIENTS_PER_PROCESS clients, one namespace at most its `max_clients=` (by
//! default all but a quarter of OMPS_MAX_CLIENTS), so that no tenant takes every slot.
//! Beyond, CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, as beyond OMPS_MAX_CLIENTS.

mod common;
use common::namespaces::*;
use common::*;
use omps_shim::conn::{settings_from, Conn};

const PER_PROCESS: usize = 4;

fn small_bounds() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: set before any server in this process reads its bounds.
        unsafe {
            std::env::set_var("OMPS_MAX_CLIENTS", "16");
            std::env::set_var("OMPS_MAX_CLIENTS_PER_PROCESS", PER_PROCESS.to_string());
        }
    });
}

/// Connections until the first refusal: (how many, its code).
fn fill(path: &std::path::Path, held: &mut Vec<Conn>) -> (usize, i32) {
    let plain = settings_from(|_| None).unwrap();
    let mut n = 0;
    loop {
        match Conn::connect_with(path, &plain) {
            Ok(c) => {
                held.push(c);
                n += 1;
                assert!(n <= 16, "no cap held");
            }
            Err((code, _)) => return (n, code),
        }
    }
}

/// The child process of a victim (common::namespaces::victim_child).
const VICTIM: &str = "CLIENT_SHARES_VICTIM";

#[test]
fn client_shares_victim_child() {
    victim_child(VICTIM);
}

#[test]
fn one_process_has_at_most_its_share_of_clients() {
    small_bounds();
    let srv = TestServer::start("shares-process");
    let mut held = Vec::new();
    assert_eq!(fill(&srv.socket(), &mut held), (PER_PROCESS, 808));
    // One gone, one more.
    held.pop();
    let t = std::time::Instant::now();
    let again = loop {
        match Conn::connect_to(&srv.socket()) {
            Ok(c) => break c,
            Err(_) if t.elapsed().as_secs() < 5 => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            Err(e) => panic!("no room after one of the process's clients left: {e:?}"),
        }
    };
    again.ping(0).unwrap();
}

#[test]
fn a_namespace_has_at_most_its_max_clients_and_the_others_go_on() {
    small_bounds();
    let srv = TestServer::start("shares-namespace");
    let small = ns_socket(&srv, "small max_clients=2");
    let other = ns_socket(&srv, "other");
    let (ok, list) = srv.ctl("list_namespaces");
    assert!(ok && list.contains("max_clients=2"), "{list}");
    // The default share: 16 less a quarter.
    assert!(list.contains("max_clients=default:12"), "{list}");
    let mut held = Vec::new();
    assert_eq!(fill(&small, &mut held), (2, 808));
    victim_connects("client_shares_victim_child", VICTIM, &other)
        .expect("another namespace's client");
    assert!(
        srv.ctl("create_namespace bad max_clients=0")
            .1
            .contains("max_clients=0"),
        "max_clients=0 is refused"
    );
}
