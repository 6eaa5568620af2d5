//! The kill soak on the host-memory GPU: a server in this process, clients (this program
//! again, as `host_soak victim`) that load a module, allocate, copy and launch in a loop
//! until they are killed with SIGKILL at a random moment. Prints the server process's
//! resident memory and descriptors every `step` kills, so growth the server's own code
//! leaves per client shows without a GPU (the GPU soak, scripts/soak, adds the driver's).
//!
//! `cargo run --release --example host_soak -- [kills] [step]`

use omps_shim::api::{ctx::*, device::*, exec::*, mem::*, module::*};
use std::ffi::c_void;
use std::time::Duration;

const MODULE: &str = "omps-host-module\nfn fill_u32 0:8 8:4 12:4\nglobal counter 16\n\0";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("victim") {
        victim();
        return;
    }
    let kills: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let step: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(100);
    let dir = std::env::temp_dir().join(format!("omps-host-soak-{}", std::process::id()));
    let gpu = std::sync::Arc::new(omps_server::gpu_host::HostGpu::new(0, 1 << 30));
    let cfg = omps_server::ServerConfig {
        lanes: 2,
        spare_segments: 2,
        ..omps_server::ServerConfig::minimal(dir.clone())
    };
    let server = omps_server::Server::new(cfg, vec![gpu.clone()], 13000).expect("server starts");
    std::thread::spawn(move || server.run().expect("server runs"));
    std::thread::sleep(Duration::from_millis(200));
    let exe = std::env::current_exe().expect("own path");
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    for i in 1..=kills {
        let mut child = std::process::Command::new(&exe)
            .arg("victim")
            .env("OMPS_PIPE_DIRECTORY", &dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("victim starts");
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(5 + seed % 60));
        let _ = child.kill();
        let _ = child.wait();
        if i % step == 0 || i == 1 {
            // Give the server a moment to see the hang-up and retire the client.
            std::thread::sleep(Duration::from_millis(300));
            println!(
                "kills {i:5}  server rss {:7} KiB  fds {:3}  device bytes {}",
                status_kib("VmRSS"),
                std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()),
                gpu.bytes_allocated()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn status_kib(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn check(what: &str, r: omps_shim::cuda::CUresult) {
    if r != 0 {
        eprintln!("victim: {what} failed: {r}");
        std::process::exit(1);
    }
}

/// Loads, allocates, copies and launches until killed.
fn victim() {
    let (mut ctx, mut m, mut f, mut d) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        0u64,
    );
    let host = vec![3u32; 1 << 16];
    // SAFETY: valid out-pointers and buffers of the sizes passed; the image is
    // NUL-terminated text.
    unsafe {
        check("cuInit", cuInit(0));
        check("context", cuDevicePrimaryCtxRetain(&mut ctx, 0));
        check("cuCtxSetCurrent", cuCtxSetCurrent(ctx));
        check(
            "cuModuleLoadData",
            cuModuleLoadData(&mut m, MODULE.as_ptr() as *const c_void),
        );
        check(
            "cuModuleGetFunction",
            cuModuleGetFunction(&mut f, m, c"fill_u32".as_ptr()),
        );
        loop {
            check("cuMemAlloc", cuMemAlloc_v2(&mut d, host.len() * 4));
            check(
                "cuMemcpyHtoD",
                cuMemcpyHtoD_v2(d, host.as_ptr() as *const c_void, host.len() * 4),
            );
            let (mut p, mut v, mut n) = (d, 7u32, host.len() as u32);
            let mut params = [
                &mut p as *mut u64 as *mut c_void,
                &mut v as *mut u32 as *mut c_void,
                &mut n as *mut u32 as *mut c_void,
            ];
            check(
                "cuLaunchKernel",
                cuLaunchKernel(
                    f,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
            );
            check("cuCtxSynchronize", cuCtxSynchronize());
            check("cuMemFree", cuMemFree_v2(d));
        }
    }
}
