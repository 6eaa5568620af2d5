//! A client sees the GPUs its CUDA_VISIBLE_DEVICES (or its container's
//! NVIDIA_VISIBLE_DEVICES) names, in that order: its device 0 may be the server's GPU 1,
//! and its work, memory and limits land there. Two host GPUs stand in for a machine's.

mod common;
use common::*;
use omps_ring::wire;
use omps_server::gpu::Gpu;
use omps_server::gpu_host::HostGpu;
use omps_server::{Server, ServerConfig};
use omps_shim::conn::{settings_from, Conn};
use std::sync::Arc;

fn two_gpus(
    tag: &str,
) -> (
    std::path::PathBuf,
    Vec<Arc<HostGpu>>,
    std::thread::JoinHandle<()>,
) {
    let dir = temp_dir(tag);
    let first = HostGpu::new(0, 1 << 28);
    let second = HostGpu::beside(&first, 1, 1 << 28);
    let gpus: Vec<Arc<HostGpu>> = vec![Arc::new(first), Arc::new(second)];
    let cfg = ServerConfig {
        default_mem_limit: Some("1=1M".into()),
        ..ServerConfig::minimal(dir.clone())
    };
    let dyn_gpus = gpus.iter().map(|g| g.clone() as Arc<dyn Gpu>).collect();
    let server = Server::new(cfg, dyn_gpus, 13000).expect("server starts");
    let t = std::thread::spawn(move || server.run().expect("server runs"));
    (dir, gpus, t)
}

fn connect(dir: &std::path::Path, env: &[(&str, &str)]) -> Result<Conn, (i32, String)> {
    let s = settings_from(|k| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .expect("settings");
    Conn::connect_with(&dir.join(omps_ring::sock::SOCKET_NAME), &s)
}

#[test]
fn a_client_sees_the_gpus_it_names_in_its_order() {
    let (dir, gpus, server) = two_gpus("visible");
    let all = connect(&dir, &[]).unwrap();
    assert_eq!(all.num_devices(), 2);
    // Its device 0 is the server's GPU 1: snapshot, memory and limit are GPU 1's.
    let second = connect(&dir, &[("CUDA_VISIBLE_DEVICES", "1")]).unwrap();
    assert_eq!(second.num_devices(), 1);
    assert_eq!(second.snapshot.devices[0].uuid, [0x11; 16]);
    let p = alloc(&second, 512 << 10);
    second.ping(0).unwrap();
    assert_eq!(
        gpus[1].bytes_allocated(),
        512 << 10,
        "allocated on the server's GPU 1"
    );
    assert_eq!(gpus[0].bytes_allocated(), 0);
    let total = {
        let mut ch = second.channel();
        ch.call(0, wire::Op::MemGetInfo, |call| {
            bytemuck::bytes_of(&call).to_vec()
        })
        .unwrap();
        ch.reply::<wire::MemInfoReply>().total
    };
    assert_eq!(total, 1 << 20, "GPU 1's limit");
    assert_ne!(p, 0);
    // By UUID, in the order named; a container's NVIDIA_VISIBLE_DEVICES as well.
    let swapped = connect(
        &dir,
        &[(
            "CUDA_VISIBLE_DEVICES",
            "GPU-11111111-1111-1111-1111-111111111111,0",
        )],
    )
    .unwrap();
    assert_eq!(swapped.snapshot.devices[0].uuid, [0x11; 16]);
    assert_eq!(swapped.snapshot.devices[1].uuid, [0x10; 16]);
    let contained = connect(&dir, &[("NVIDIA_VISIBLE_DEVICES", "GPU-10101010")]).unwrap();
    assert_eq!(contained.num_devices(), 1);
    assert_eq!(contained.snapshot.devices[0].uuid, [0x10; 16]);
    // None of the server's GPUs: refused, as a process with no device fails its cuInit.
    for env in [
        ("CUDA_VISIBLE_DEVICES", "5"),
        ("NVIDIA_VISIBLE_DEVICES", "void"),
    ] {
        assert!(connect(&dir, &[env]).is_err(), "{env:?} connected");
    }
    // A client on one GPU only leaves the server whole when it goes.
    drop(second);
    let t = std::time::Instant::now();
    while gpus[1].bytes_allocated() != 0 && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(gpus[1].bytes_allocated(), 0, "its memory freed on GPU 1");
    let (ok, ps) = ctl_at(&omps_ring::sock::operator_socket_in(&dir), "ps");
    assert!(ok && ps.lines().count() >= 2, "{ps}");
    all.ping(1).unwrap();
    assert!(ctl_at(&omps_ring::sock::operator_socket_in(&dir), "quit").0);
    server.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pinned bytes `omps-ctl metrics` shows for client `id`.
fn pinned_bytes(dir: &std::path::Path, id: u32) -> Option<u64> {
    let (_, m) = ctl_at(&omps_ring::sock::operator_socket_in(dir), "metrics");
    let label = format!("client=\"{id}\"");
    m.lines()
        .find(|l| l.starts_with("omps_client_pinned_host_bytes{") && l.contains(&label))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

#[test]
fn an_unpinned_range_waits_for_the_clients_work_on_every_gpu() {
    let (dir, gpus, server) = two_gpus("unpin");
    let c = connect(&dir, &[]).unwrap();
    let len = 64 << 10;
    let (addr, _fd) = pin_somewhere(&c, len);
    c.ping(1).unwrap();
    assert_eq!(pinned_bytes(&dir, c.client_id()), Some(len as u64));
    // The client's work on GPU 1 has not finished (its fences answer "not yet"): a copy
    // there may still read the range, so it stays registered, though GPU 0 is done.
    gpus[1].stick_releases(true);
    c.host_request(wire::hostmem::UNPIN, addr, 0, None)
        .expect("unpin");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(
        pinned_bytes(&dir, c.client_id()),
        Some(len as u64),
        "given back before GPU 1's fence passed"
    );
    gpus[1].stick_releases(false);
    let t = std::time::Instant::now();
    while pinned_bytes(&dir, c.client_id()) != Some(0)
        && t.elapsed() < std::time::Duration::from_secs(5)
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(
        pinned_bytes(&dir, c.client_id()),
        Some(0),
        "never given back"
    );
    drop(c);
    assert!(ctl_at(&omps_ring::sock::operator_socket_in(&dir), "quit").0);
    server.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
