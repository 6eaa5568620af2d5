//! A faulted GPU whose context the driver will not recreate (the H100 answered
//! cuDevicePrimaryCtxReset with CUDA_ERROR_NOT_PERMITTED after an illegal address): once
//! no client is left, the server ends asking to be started again, which omps-server does
//! by exec under the same PID. It never ends so while a client is connected, even one of
//! another GPU.

mod common;
use common::*;
use omps_server::control::Ending;
use omps_server::gpu::Gpu;
use omps_server::gpu_host::HostGpu;
use omps_server::{Server, ServerConfig};
use omps_shim::conn::{settings_from, Conn};
use std::sync::Arc;
use std::time::Duration;

fn connect_to_gpu(sock: &std::path::Path, gpu: &str) -> Conn {
    let s = settings_from(|k| (k == "CUDA_VISIBLE_DEVICES").then(|| gpu.to_string())).unwrap();
    Conn::connect_with(sock, &s).unwrap()
}

#[test]
fn a_context_that_cannot_be_recreated_ends_the_server_for_a_restart_once_clients_are_gone() {
    let dir = temp_dir("fault-restart");
    let first = HostGpu::new(0, 1 << 28);
    let second = HostGpu::beside(&first, 1, 1 << 28);
    first.fail_resets(true);
    let gpus: Vec<Arc<dyn Gpu>> = vec![Arc::new(first), Arc::new(second)];
    let server =
        Server::new(ServerConfig::minimal(dir.clone()), gpus, 13000).expect("server starts");
    let run = std::thread::spawn(move || server.run_to_end().expect("server runs"));
    let sock = dir.join(omps_ring::sock::SOCKET_NAME);
    // A client of GPU 1 only, which GPU 0's fault does not touch.
    let other_gpu = connect_to_gpu(&sock, "1");
    let culprit = connect_to_gpu(&sock, "0");
    launch_trap(&culprit);
    assert!(sync_default_stream(&culprit).is_err(), "the fault surfaces");
    drop(culprit);
    // GPU 0 has no client left and its resets fail (every 5 ms: well past 20 tries in
    // 400 ms), but a client of the server is connected: it goes on.
    std::thread::sleep(Duration::from_millis(400));
    assert!(!run.is_finished(), "ended while a client was connected");
    other_gpu.ping(0).expect("GPU 1's client still served");
    drop(other_gpu);
    let t = std::time::Instant::now();
    while !run.is_finished() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(run.is_finished(), "the server did not end for a restart");
    let Ending::Restart(sockets) = run.join().unwrap() else {
        panic!("the server quit instead of ending for a restart")
    };
    assert!(sock.exists(), "the socket stays for the new process");
    drop(sockets);
    assert!(
        dir.join(omps_server::control::PID_FILE).exists(),
        "the PID file stays: the restart keeps the PID"
    );
}
