//! The server's configuration (from the environment, or minimal for tests) and what is
//! set up from it before any client runs: the scheduling policy with its fixed
//! confinements, and the context limits presized.

use crate::base::ids::uuid_text;
use crate::gpu::Gpu;
use crate::worker::{self};
use omps_ring::segment::DeviceSnapshot;
use omps_ring::sock;
use omps_ring::wire::{self};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub pipe_dir: PathBuf,
    pub spin: Duration,
    pub pin_workers: bool,
    /// Worker threads per GPU, each serving a share of the clients (OMPS_LANES).
    pub lanes: usize,
    /// Client segments kept ready ahead of connections (OMPS_SPARE_SEGMENTS).
    pub spare_segments: usize,
    /// Point this process's fd 1 at the printf router (see [`crate::client::printf`]); only a
    /// server process does this, never a test that runs the server in its own process.
    pub capture_printf: bool,
    /// SMs kept for latency-critical clients while one is connected (OMPS_LC_RESERVE_SMS,
    /// rounded up to whole chunks; 0 turns the reserve off).
    pub lc_reserve_sms: u32,
    /// The clients' default thread percentage (the server's
    /// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), as given; checked at start.
    pub default_thread_pct: Option<String>,
    /// The clients' memory limits (the server's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), as
    /// given; checked at start.
    pub default_mem_limit: Option<String>,
    /// Where to serve Prometheus metrics over HTTP (`--metrics ADDR`, OMPS_METRICS);
    /// None: only `omps-ctl metrics` shows them.
    pub metrics: Option<std::net::SocketAddr>,
    /// The shared context's device malloc heap, set at start (OMPS_MALLOC_HEAP_SIZE, a
    /// size such as 256M; "0": the driver's default), as given; checked at start.
    pub malloc_heap: Option<String>,
    /// The process that loads each new module image first ([`crate::image::verifier`]); None:
    /// images go straight to the driver (OMPS_VERIFY_IMAGES=0, and in-process tests).
    pub verifier: Option<crate::image::verifier::Spec>,
    /// Hardware queues one client may hold work streams on (OMPS_CLIENT_QUEUES; None:
    /// half of them, crate::sched::placement::queue_share).
    pub client_queues: Option<usize>,
    /// Clients connected beyond which waiting clients are asked to sleep soon rather than
    /// spin (`SegmentHeader::wait_active_us`, server/clients.rs): the CPUs this process
    /// may use, which the clients share with the lanes; `usize::MAX`: never.
    pub crowd_cpus: usize,
}

/// The heap every client's device malloc shares unless OMPS_MALLOC_HEAP_SIZE says
/// otherwise: natively each process has 8 MiB of its own; this is 32 such heaps, and what
/// a program sets before its first malloc up to it succeeds (crate::client::limits). The driver
/// allocates it only when code that calls malloc is first loaded.
pub const DEFAULT_MALLOC_HEAP: &str = "256M";

impl ServerConfig {
    /// A server on `pipe_dir` with nothing else set: one lane, no spare segments, no
    /// reserve, no limits, workers not pinned, printf not captured (tests and tools that
    /// run a server inside their own process).
    pub fn minimal(pipe_dir: PathBuf) -> Self {
        ServerConfig {
            pipe_dir,
            spin: Duration::from_micros(200),
            pin_workers: false,
            lanes: 1,
            spare_segments: 0,
            capture_printf: false,
            lc_reserve_sms: 0,
            default_thread_pct: None,
            default_mem_limit: None,
            metrics: None,
            malloc_heap: None,
            verifier: None,
            client_queues: None,
            crowd_cpus: usize::MAX,
        }
    }

    pub fn from_env() -> Self {
        let spin_us = std::env::var("OMPS_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2000);
        ServerConfig {
            pipe_dir: sock::pipe_directory(),
            spin: Duration::from_micros(spin_us),
            pin_workers: std::env::var_os("OMPS_NO_PIN").is_none(),
            lanes: std::env::var("OMPS_LANES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| {
                    let ncpu = std::thread::available_parallelism().map_or(2, |n| n.get());
                    DEFAULT_LANES.min(ncpu / 2).max(1)
                }),
            spare_segments: std::env::var("OMPS_SPARE_SEGMENTS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(4),
            capture_printf: true,
            lc_reserve_sms: std::env::var("OMPS_LC_RESERVE_SMS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(16),
            default_thread_pct: std::env::var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").ok(),
            default_mem_limit: std::env::var("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").ok(),
            metrics: std::env::var("OMPS_METRICS")
                .ok()
                .and_then(|a| a.parse().ok()),
            malloc_heap: Some(
                std::env::var("OMPS_MALLOC_HEAP_SIZE")
                    .unwrap_or_else(|_| DEFAULT_MALLOC_HEAP.into()),
            ),
            verifier: if std::env::var("OMPS_VERIFY_IMAGES").is_ok_and(|v| v == "0") {
                None
            } else {
                crate::image::verifier::Spec::this_binary(sock::log_directory())
            },
            client_queues: std::env::var("OMPS_CLIENT_QUEUES")
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            crowd_cpus: std::thread::available_parallelism().map_or(usize::MAX, |n| n.get()),
        }
    }
}

/// Worker threads per GPU by default. The driver's launch rate from one context grows to
/// about 4 submitting threads (shared/reference/measured-anchors.md), but the workers share
/// the CPUs with the clients: on the 16-core H100 machine 8 lanes gave 783k launches/s at
/// N = 8 where 4 gave 560k. Never more than half the CPUs.
pub const DEFAULT_LANES: usize = 8;

/// The scheduling policy, with every GPU's fixed confinements made (before any client
/// runs, since making one waits for running work).
pub(super) fn make_policy(
    cfg: &ServerConfig,
    gpus: &[Arc<dyn Gpu>],
    snapshots: &[DeviceSnapshot],
) -> io::Result<crate::worker::policy::Policy> {
    let pct = match &cfg.default_thread_pct {
        None => 100_000,
        Some(v) => wire::parse_percentage(v).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={v}: must be a percentage in (0, 100]"),
            )
        })?,
    };
    let chunk0 = gpus.first().map_or(8, |g| g.sm_chunks().chunk.max(1));
    let reserve = cfg.lc_reserve_sms.div_ceil(chunk0);
    let mut per_gpu = Vec::new();
    for (g, snap) in gpus.iter().zip(snapshots) {
        let mut chunks = g.sm_chunks();
        let sets = chunks.fixed_sets(reserve);
        if chunks.chunks > 0 && sets.len() < g.layout().confined {
            for (slot, set) in sets.iter().enumerate() {
                if let Err(e) = g.confine(slot, set) {
                    tracing::warn!(
                        gpu = g.ordinal(),
                        "SM confinement {slot}: CUDA error {}; no thread limits or QoS reserve on this GPU",
                        e.0
                    );
                    chunks.chunks = 0;
                    break;
                }
            }
        } else {
            chunks.chunks = 0;
        }
        per_gpu.push((chunks, uuid_text(&snap.uuid)));
    }
    Ok(crate::worker::policy::Policy::new(per_gpu, reserve, pct))
}

/// Raising a context limit waits for every running kernel and holds up every client's
/// launches meanwhile; the context's stack only grows (crate::client::limits), so each new largest
/// stack a client asks for costs one such stall. OMPS_STACK_SIZE (bytes per thread) sets
/// it at start, before any client runs, for operators who know what their clients need
/// (it costs that much device memory per resident thread). The malloc heap is set at
/// start too ([`ServerConfig::malloc_heap`]): once code that calls malloc is loaded its
/// size is fixed. (limit, value, what the operator wrote) for each.
pub(super) fn presizes(cfg: &ServerConfig) -> io::Result<Vec<(i32, u64, String)>> {
    const STACK_SIZE: i32 = 0;
    const MALLOC_HEAP_SIZE: i32 = 2;
    let mut out = Vec::new();
    if let Ok(v) = std::env::var("OMPS_STACK_SIZE") {
        let bytes: u64 = v.trim().parse().ok().filter(|&b| b > 0).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("OMPS_STACK_SIZE={v}: must be a stack size in bytes"),
            )
        })?;
        out.push((STACK_SIZE, bytes, format!("OMPS_STACK_SIZE={v}")));
    }
    if let Some(v) = &cfg.malloc_heap {
        let bytes = match v.trim() {
            "0" => 0,
            t => omps_ring::memlimit::parse_size(t).map_err(|why| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("OMPS_MALLOC_HEAP_SIZE={v}: {why}"),
                )
            })?,
        };
        if bytes > 0 {
            out.push((
                MALLOC_HEAP_SIZE,
                bytes,
                format!("OMPS_MALLOC_HEAP_SIZE={v}"),
            ));
        }
    }
    Ok(out)
}

/// Sets the [`presizes`] on one GPU's context, through its limits so that clients still
/// read the driver's defaults and no client's departure lowers them.
pub(super) fn presize(
    g: &dyn Gpu,
    shared: &worker::GpuShared,
    presized: &[(i32, u64, String)],
) -> io::Result<()> {
    let mut limits = shared.limits.lock().unwrap_or_else(|e| e.into_inner());
    for (limit, bytes, given) in presized {
        limits.presize(g, *limit, *bytes).map_err(|e| {
            io::Error::other(format!(
                "{given} on GPU {}: CUDA error {}",
                g.ordinal(),
                e.0
            ))
        })?;
    }
    Ok(())
}
