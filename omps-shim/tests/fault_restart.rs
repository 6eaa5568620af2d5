//! A faulted GPU whose context the driver will not recreate (the H100 answered
//! cuDevicePrimaryCtxReset with CUDA_ERROR_NOT_PERMITTED after an illegal address): once
//! no client is left, the server ends asking to be started again, which omps-server does
//! by exec under the same PID. It never ends so while a client is connected.

mod common;
use common::*;
use omps_server::control::Ending;
use omps_server::gpu::Gpu;
use omps_server::gpu_host::HostGpu;
use omps_server::{Server, ServerConfig};
use omps_shim::conn::Conn;
use std::sync::Arc;
use std::time::Duration;

#[test]
fn a_context_that_cannot_be_recreated_ends_the_server_for_a_restart_once_clients_are_gone() {
    let dir = temp_dir("fault-restart");
    let gpu = Arc::new(HostGpu::new(0, 1 << 28));
    gpu.fail_resets(true);
    let server = Server::new(
        ServerConfig::minimal(dir.clone()),
        vec![gpu.clone() as Arc<dyn Gpu>],
        13000,
    )
    .expect("server starts");
    let run = std::thread::spawn(move || server.run_to_end().expect("server runs"));
    let sock = dir.join(omps_ring::sock::SOCKET_NAME);
    let bystander = Conn::connect_to(&sock).unwrap();
    let culprit = Conn::connect_to(&sock).unwrap();
    launch_trap(&culprit);
    // The fault surfaces at the culprit's next synchronization, and every client is told.
    assert!(sync_default_stream(&culprit).is_err());
    let t = std::time::Instant::now();
    while bystander.check_alive().is_ok() && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(bystander.check_alive().is_err(), "the bystander is told");
    drop(culprit);
    // One client still connected: the server goes on, refusing new ones meanwhile.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!run.is_finished(), "ended while a client was connected");
    drop(bystander);
    let t = std::time::Instant::now();
    while !run.is_finished() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(run.is_finished(), "the server did not end for a restart");
    assert_eq!(run.join().unwrap(), Ending::Restart);
    assert!(!sock.exists(), "the socket is gone for the new server");
}
