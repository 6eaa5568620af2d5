//! `omps-server`: serves CUDA programs preloaded with libomps_shim.so.
//!
//! Environment: OMPS_PIPE_DIRECTORY / CUDA_MPS_PIPE_DIRECTORY (socket), OMPS_LOG_DIRECTORY /
//! CUDA_MPS_LOG_DIRECTORY (server.log, kept under OMPS_LOG_MAX_BYTES), OMPS_SPIN_US (busy-poll window), OMPS_NO_PIN,
//! OMPS_LANES (worker threads per GPU), OMPS_SPARE_SEGMENTS (segments made ahead),
//! OMPS_LAUNCH_RUNS=1 (consecutive launches as graph launches: gpu/cuda/batch.rs),
//! CUDA_VISIBLE_DEVICES (as for any CUDA program), CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
//! CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (clients' defaults), OMPS_METRICS or `--metrics ADDR`
//! (Prometheus metrics over HTTP at ADDR/metrics).

use omps_server::gpu::cuda::{self as gpu_cuda, CudaGpu};
use omps_server::gpu::Gpu;
use omps_server::image::verifier::Work;
use omps_server::session::{jit_verdict, link_verdict};
use omps_server::ServerConfig;
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == "--verify-images") {
        // The image verifier the server starts (omps_server::verifier); `--host` plays the
        // driver with the host GPU, for tests.
        if args.get(2).is_some_and(|a| a == "--host") {
            return omps_server::image::verifier::child_main(|ordinal, bytes, work| {
                let g = omps_server::gpu::host::HostGpu::new(ordinal, 1 << 20);
                match work {
                    Work::Load => g.module_load(bytes).map_or_else(|e| e.0, |_| 0),
                    Work::Link => link_verdict(bytes, |o, i| g.link(o, i).0.map(drop)),
                    Work::Jit => jit_verdict(bytes, |ptx, o| g.module_load_jit(ptx, o).0.map(drop)),
                }
            });
        }
        return omps_server::image::verifier::child_main(|ordinal, bytes, work| match work {
            Work::Load => gpu_cuda::verify_load(ordinal, bytes),
            Work::Link => gpu_cuda::verify_link(ordinal, bytes),
            Work::Jit => gpu_cuda::verify_jit(ordinal, bytes),
        });
    }
    if args.iter().any(|a| a == "-v" || a == "--version") {
        println!("omps-server {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    fixed_mmap_threshold();
    omps_server::base::log_file::init_logging();
    // Panic messages to the server's own stderr: fd 2 becomes the assert pipe, whose text
    // goes to clients.
    std::panic::set_hook(Box::new(|info| omps_server::say!("omps-server: {info}")));
    if std::env::var_os("LD_PRELOAD").is_some_and(|v| v.to_string_lossy().contains("omps_shim")) {
        omps_server::say!("omps-server: refusing to run with libomps_shim.so preloaded (the server needs the real driver)");
        return ExitCode::FAILURE;
    }
    let mut cfg = ServerConfig::from_env();
    if let Some(addr) = args.windows(2).find(|w| w[0] == "--metrics").map(|w| &w[1]) {
        match addr.parse() {
            Ok(a) => cfg.metrics = Some(a),
            Err(e) => {
                omps_server::say!("omps-server: --metrics {addr}: {e} (give an address and port, as 127.0.0.1:9400)");
                return ExitCode::FAILURE;
            }
        }
    }
    omps_server::control::restart::serve(cfg, open_gpus)
}

/// The driver and every GPU it shows, or why not.
fn open_gpus() -> Result<(Vec<Arc<dyn Gpu>>, i32), String> {
    if !gpu_cuda::driver_present() {
        return Err("the CUDA driver library libcuda.so (libcuda.so.1) was not found; install the NVIDIA driver or add its directory to LD_LIBRARY_PATH".into());
    }
    if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        // SAFETY: a first start, still single-threaded (a restarted image inherits the
        // variable, so only there does a doorman thread run); the driver reads it at cuInit.
        unsafe {
            std::env::set_var(
                "CUDA_DEVICE_MAX_CONNECTIONS",
                omps_server::sched::placement::Layout::SERVER
                    .connections
                    .to_string(),
            )
        };
    }
    let (driver_version, count) =
        gpu_cuda::init().map_err(|e| format!("cuInit failed with CUDA error {}", e.0))?;
    // The server is built on the CUDA 13.0 driver API (R580): an older driver lacks entry
    // points it calls while serving (a missing one would end a worker mid-request).
    if driver_version < 13000 {
        return Err(format!(
            "the CUDA driver supports CUDA {}.{}; omps needs 13.0 or newer (driver R580)",
            driver_version / 1000,
            driver_version % 1000 / 10
        ));
    }
    if count == 0 {
        return Err("no CUDA device found".into());
    }
    let count = count.min(omps_ring::segment::MAX_DEVICES);
    let mut gpus: Vec<Arc<dyn Gpu>> = Vec::new();
    for i in 0..count {
        let g = CudaGpu::open(i, omps_server::sched::placement::Layout::SERVER)
            .map_err(|e| format!("opening GPU {i} failed with CUDA error {}", e.0))?;
        gpus.push(Arc::new(g));
    }
    Ok((gpus, driver_version))
}

/// Large buffers (module images, staging copies) come from and go back to the kernel.
///
/// glibc raises its mmap threshold each time a large mmapped block is freed, up to 32 MiB,
/// so after the first PyTorch client the server's image copies were carved out of the
/// arenas instead; freed, they left holes malloc_trim could not give back. The soak showed
/// it (2026-11-27, H200): after 16 PyTorch clients killed the heap in use was back at its
/// baseline (60.1 -> 60.7 MB) while the arenas' free space grew 235 -> 426 MB and resident
/// anonymous memory +99 MB. A fixed threshold turns the dynamic raise off.
fn fixed_mmap_threshold() {
    const THRESHOLD: libc::c_int = 256 << 10;
    // SAFETY: mallopt takes two integers and only changes the allocator's parameters; it
    // runs before the server starts any thread.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD) };
}
