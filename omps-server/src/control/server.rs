//! The control thread (`Server`): its configuration, the socket, the handshake, omps-ctl
//! requests, and client death.

use crate::base::ids::uuid_text;
use crate::client::printf::PrintfRouter;
use crate::client::ClientShared;
use crate::gpu::{code, Gpu};
use crate::worker::{self, ToWorker, WorkerConfig};
use omps_ring::futex::Doorbell;
use omps_ring::segment::{DeviceSnapshot, LayoutParams, SegmentView, SnapshotTable, SEGMENT_MAGIC};
use omps_ring::shm::{self, Mapping};
use omps_ring::sock;
use omps_ring::wire::{self, Welcome};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod commands;
use super::{control_log, lane_queue};
use std::time::{Duration, Instant};

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
        }
    }
}

/// How [`Server::run_to_end`] ended.
#[derive(Debug)]
pub enum Ending {
    /// `quit` (or `shutdown_server`).
    Quit,
    /// A faulted GPU's context could not be recreated: start the server again, on these
    /// sockets ([`crate::control::restart::restart_self`]).
    Restart(crate::control::listen::Sockets),
}

/// The PID file MPS's control daemon keeps in the pipe directory.
pub const PID_FILE: &str = sock::PID_FILE;

/// Worker threads per GPU by default. The driver's launch rate from one context grows to
/// about 4 submitting threads (shared/reference/measured-anchors.md), but the workers share
/// the CPUs with the clients: on the 16-core H100 machine 8 lanes gave 783k launches/s at
/// N = 8 where 4 gave 560k. Never more than half the CPUs.
pub const DEFAULT_LANES: usize = 8;

/// How long a quitting server waits for its lanes to take their last messages.
const QUIT_WAIT: Duration = Duration::from_secs(5);

struct WorkerHandle {
    tx: lane_queue::LaneQueue,
    /// Set by the worker while its GPU is in FAULT.
    faulted: Arc<std::sync::atomic::AtomicBool>,
    bell_fd: OwnedFd,
    bell_map: Arc<Mapping>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WorkerHandle {
    fn bell(&self) -> &Doorbell {
        // SAFETY: the doorbell page is mapped for as long as bell_map lives, page aligned,
        // and Doorbell is two atomics, valid for any bit pattern.
        unsafe { &*(self.bell_map.as_ptr() as *const Doorbell) }
    }

    /// Never waits: a lane stuck in the driver must not hold up the control thread
    /// (what its queue has no room for goes at a later pass, lane_queue.rs).
    fn send(&mut self, msg: ToWorker) {
        self.tx.send(msg);
        self.bell().ring();
    }

    /// Passes on what waits for the lane's queue.
    fn flush(&mut self) {
        if self.tx.stalled() {
            self.tx.flush();
            self.bell().ring();
        }
    }
}

pub struct Server {
    cfg: ServerConfig,
    /// The socket, the handoff socket and the pipe directory's lock (crate::control::listen).
    sockets: crate::control::listen::Sockets,
    /// Since when the server has been ending to start again: it accepts no connection
    /// (they wait for the new process) and finishes the handshakes under way.
    restarting: Option<Instant>,
    gpus: Vec<Arc<dyn Gpu>>,
    snapshots: Vec<DeviceSnapshot>,
    driver_version: i32,
    workers: Vec<WorkerHandle>,
    /// Per GPU, what its lanes share (their counters among it).
    gpu_shared: Vec<Arc<worker::GpuShared>>,
    started: std::time::Instant,
    segments: crate::release::segpool::SegmentPool,
    clients: HashMap<u32, (Arc<ClientShared>, UnixStream)>,
    printf: Arc<PrintfRouter>,
    /// Socket requests that may take long (a printf flush waits for the GPU and the pumps;
    /// a pin registers memory with the driver) run on a thread of their own, which
    /// answers them, so no client's request holds the control thread.
    slow: std::sync::mpsc::Sender<SlowJob>,
    exiting: Vec<Arc<ClientShared>>,
    /// Defaults for clients, and what operators set (QoS, compute limits).
    policy: crate::worker::policy::Policy,
    /// Memory limits for clients (crate::client::memlimit).
    mem_limits: crate::client::memlimit::MemLimits,
    /// The operator's namespaces: client sockets with limits of their own.
    namespaces: crate::control::namespace::Namespaces,
    /// Each client process's account, shared by its connections (crate::client::account).
    accounts: crate::client::account::Accounts,
    /// What `omps-ctl metrics` and the HTTP endpoint read (crate::control::metrics).
    board: Arc<crate::control::metrics::Board>,
    /// Operators' commands and their answers (control.log).
    control_log: control_log::ControlLog,
    /// `shutdown_server` or `quit -t`: no new clients, and quit once the connected ones
    /// are gone (or, given a deadline, once it passes).
    draining: Option<Option<Instant>>,
    next_id: u32,
    uid: u32,
    quit: bool,
    /// Handshakes in progress and control connections (crate::control::peers).
    peers: Vec<crate::control::peers::Peer>,
    /// Connections to the handoff socket whose message has not come yet (crate::control::listen).
    handoffs: crate::control::listen::Handoffs,
    /// Peers dropped for going over their deadline (logged the first few times).
    slow_peers: u64,
}

/// A client's socket request that may take long, for the slow-request thread, which
/// answers on the client's socket.
enum SlowJob {
    /// The printf output of GPU `gpu` for client `id` so far.
    Flush {
        gpu: Arc<dyn Gpu>,
        client: Arc<ClientShared>,
        sock: UnixStream,
    },
    /// Page-locked memory: the client's memfd, to map at `addr` and register.
    Pin {
        client: Arc<ClientShared>,
        fd: OwnedFd,
        addr: u64,
        len: u64,
        sock: UnixStream,
    },
}

/// The thread that runs slow requests one after another. A pin that must wait for a
/// range the client gave back (pin_once) waits aside, tried again every millisecond
/// between the other requests, so that it holds up no one else's (issue 23 review).
fn start_slow_requests(printf: Arc<PrintfRouter>) -> io::Result<std::sync::mpsc::Sender<SlowJob>> {
    use std::sync::mpsc::RecvTimeoutError;
    let (tx, rx) = std::sync::mpsc::channel::<SlowJob>();
    std::thread::Builder::new()
        .name("omps-requests".into())
        .spawn(move || {
            // Pins waiting for an unpin, with when they came (one per client at most: a
            // client has one slow request at a time).
            let mut waiting: Vec<(SlowJob, Instant)> = Vec::new();
            loop {
                let next = if waiting.is_empty() {
                    rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
                } else {
                    rx.recv_timeout(Duration::from_millis(1))
                };
                match next {
                    Ok(job) => run_slow(&printf, job, Instant::now(), &mut waiting),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
                for (job, since) in std::mem::take(&mut waiting) {
                    run_slow(&printf, job, since, &mut waiting);
                }
            }
        })?;
    Ok(tx)
}

/// Runs one slow request that came at `since`, answering it, or puts it in `waiting`.
fn run_slow(
    printf: &PrintfRouter,
    job: SlowJob,
    since: Instant,
    waiting: &mut Vec<(SlowJob, Instant)>,
) {
    match job {
        SlowJob::Flush { gpu, client, sock } => {
            let got = printf.flush(&*gpu, client.id, wire::PRINTF_REPLY_MAX - 4);
            answer_slow(&client, &sock, 0, &wire::printf_reply(&got.out, &got.err));
        }
        SlowJob::Pin {
            ref client,
            ref fd,
            addr,
            len,
            ref sock,
        } => {
            // A client gone meanwhile gets nothing mapped for it.
            let status = if client.gone.load(Ordering::Acquire) {
                Some(code::MPS_CLIENT_TERMINATED)
            } else {
                pin_once(client, fd.as_fd(), addr, len, since)
            };
            match status {
                Some(status) => answer_slow(client, sock, status, &[]),
                None => waiting.push((job, since)),
            }
        }
    }
}

/// How long the slow-request thread waits for a client to take any more of its answer:
/// the shim reads it at once; a client that takes none of it this long is cut off, so
/// that it cannot hold every other client's pins and printf flushes behind it (issue 23,
/// review). A large answer read in pieces, however slowly, goes on.
const SLOW_ANSWER_TIME: Duration = Duration::from_millis(200);

/// Answers a slow request, the client taking some of it every [`SLOW_ANSWER_TIME`], or
/// cuts the client off; only then
/// may the client ask again (one slow request at a time each).
fn answer_slow(client: &ClientShared, sock: &UnixStream, status: i32, text: &[u8]) {
    let head = wire::HostMemReply {
        status,
        text_len: text.len() as u32,
    };
    let mut bytes = bytemuck::bytes_of(&head).to_vec();
    bytes.extend_from_slice(text);
    if !send_within(sock, &bytes, SLOW_ANSWER_TIME) {
        client.disconnect(
            code::MPS_CLIENT_TERMINATED,
            "it did not take the answer to its request",
        );
    }
    client.slow_pending.store(false, Ordering::Release);
}

/// Sends all of `bytes`, never waiting `limit` for the peer to take any (ZERO: never
/// waiting at all): whether they went.
fn send_within(sock: &UnixStream, bytes: &[u8], limit: Duration) -> bool {
    let mut deadline = Instant::now() + limit;
    let mut sent = 0;
    while sent < bytes.len() {
        let rest = &bytes[sent..];
        // SAFETY: sending from a live buffer of rest.len() bytes on a socket we hold.
        let n = unsafe {
            libc::send(
                sock.as_raw_fd(),
                rest.as_ptr() as *const libc::c_void,
                rest.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n > 0 {
            sent += n as usize;
            deadline = Instant::now() + limit;
            continue;
        }
        let e = io::Error::last_os_error();
        if n == 0
            || !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            )
        {
            return false;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack, for the call.
        unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as i32) };
    }
    true
}

/// Pins a client's range; one it gave back a moment ago may still be mapped at the same
/// address until its fences pass on every GPU (cudaHostUnregister returns before then), and
/// a range pinned there again waits for it (2 s after `since`, when it was asked, at
/// most), as natively the first is gone by the time the call returns. The status to
/// answer, or None: to be tried again in a moment.
fn pin_once(
    client: &ClientShared,
    fd: std::os::fd::BorrowedFd,
    addr: u64,
    len: u64,
    since: Instant,
) -> Option<i32> {
    match client.pin(fd, addr, len) {
        Err(code::NOT_SUPPORTED)
            if client.unpinning_ranges() > 0 && since.elapsed() < Duration::from_secs(2) =>
        {
            None
        }
        r => Some(r.err().unwrap_or(0)),
    }
}

impl Server {
    /// A server on the pipe directory of `cfg`, which it locks and binds its sockets in.
    pub fn new(
        cfg: ServerConfig,
        gpus: Vec<Arc<dyn Gpu>>,
        driver_version: i32,
    ) -> io::Result<Server> {
        let sockets = crate::control::listen::lock(&cfg.pipe_dir)?.bind()?;
        Self::with_sockets(cfg, gpus, driver_version, sockets)
    }

    /// A server on sockets already made (or kept through a restart).
    pub fn with_sockets(
        mut cfg: ServerConfig,
        gpus: Vec<Arc<dyn Gpu>>,
        driver_version: i32,
        mut sockets: crate::control::listen::Sockets,
    ) -> io::Result<Server> {
        // Where MPS's control daemon leaves its PID, which tools read (the server is the
        // daemon here).
        std::fs::write(
            cfg.pipe_dir.join(PID_FILE),
            format!("{}\n", std::process::id()),
        )?;
        let printf = Arc::new(PrintfRouter::new(cfg.capture_printf)?);
        let slow = start_slow_requests(printf.clone())?;
        for g in &gpus {
            g.set_printf_output(
                printf.write_fd(crate::client::printf::Stream::Out),
                printf.write_fd(crate::client::printf::Stream::Err),
            );
        }
        let mut snapshots: Vec<DeviceSnapshot> = gpus.iter().map(|g| g.snapshot()).collect();
        // Which GPUs can reach each other directly; access is enabled when a client asks.
        for (a, g) in gpus.iter().enumerate() {
            for (b, peer) in gpus.iter().enumerate() {
                let pair = peer.ordinal();
                if let Some(slot) = snapshots[a].p2p.get_mut(b).filter(|_| a != b) {
                    *slot = g.peer_attributes(pair);
                }
            }
        }
        let policy = make_policy(&cfg, &gpus, &snapshots)?;
        let namespaces = crate::control::namespace::Namespaces::start(
            &cfg.pipe_dir,
            std::mem::take(&mut sockets.namespaces),
            &policy,
            &snapshots,
        );
        for (g, snap) in snapshots.iter().enumerate() {
            crate::gpu::features::Features::of(snap, policy.confines(g)).log(gpus[g].ordinal());
        }
        let mut control_log = control_log::ControlLog::open(sock::log_directory().as_deref());
        control_log.line(&format!(
            "Starting omps server {} using socket {}",
            env!("CARGO_PKG_VERSION"),
            cfg.pipe_dir.join(sock::SOCKET_NAME).display()
        ));
        control_log.line(&format!(
            "To connect CUDA applications to this server, set env CUDA_MPS_PIPE_DIRECTORY={}",
            cfg.pipe_dir.display()
        ));
        control_log.line(&format!(
            "Control commands are taken on {} only",
            sock::operator_socket_in(&cfg.pipe_dir).display()
        ));
        let mem_limits =
            crate::client::memlimit::MemLimits::new(cfg.default_mem_limit.as_deref(), &snapshots)
                .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        let presized = presizes(&cfg)?;
        crate::image::verifier::install(
            cfg.verifier
                .clone()
                .map(|spec| crate::image::verifier::Verifier::new(spec).for_driver(driver_version)),
        );
        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut workers = Vec::new();
        let mut gpu_shared = Vec::new();
        cfg.lanes = cfg.lanes.max(1);
        let lanes = cfg.lanes;
        let vmm_ipc: Arc<std::sync::Mutex<crate::client::ipc::Registry>> = Default::default();
        for (i, gpu) in gpus.iter().enumerate() {
            let faulted = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let shared = worker::GpuShared::new(gpu, lanes, faulted.clone(), vmm_ipc.clone());
            shared.set_queue_share(cfg.client_queues);
            presize(&**gpu, &shared, &presized)?;
            gpu_shared.push(shared.clone());
            for lane in 0..lanes {
                let bell_fd = shm::create_segment("omps-doorbell", wire::DOORBELL_PAGE)?;
                let bell_map = Arc::new(Mapping::map(bell_fd.as_fd(), wire::DOORBELL_PAGE)?);
                let (tx, rx) = rtrb::RingBuffer::new(1024);
                let tx = lane_queue::LaneQueue::new(tx);
                let n = i * lanes + lane;
                let wcfg = WorkerConfig {
                    spin: cfg.spin,
                    // Core 0 takes interrupts and the control thread; workers the next ones.
                    cpu: (cfg.pin_workers && ncpu > 2).then_some(1 + n % (ncpu - 1)),
                };
                let (g, m, sh) = (gpu.clone(), bell_map.clone(), shared.clone());
                let thread = std::thread::Builder::new()
                    .name(format!("omps-gpu{i}.{lane}"))
                    .spawn(move || {
                        // SAFETY: the mapping is page aligned and lives as long as `m`.
                        let bell = unsafe { &*(m.as_ptr() as *const Doorbell) };
                        worker::run(g, rx, bell, wcfg, sh, lane)
                    })?;
                workers.push(WorkerHandle {
                    tx,
                    faulted: faulted.clone(),
                    bell_fd,
                    bell_map,
                    thread: Some(thread),
                });
            }
        }
        let board = Arc::new(crate::control::metrics::Board::new(
            gpus.iter()
                .zip(&snapshots)
                .zip(&gpu_shared)
                .map(|((g, s), sh)| (g.clone(), *s, sh.clone()))
                .collect(),
        ));
        if let Some(addr) = cfg.metrics {
            crate::control::metrics::serve(addr, board.clone())?;
        }
        let segments = crate::release::segpool::SegmentPool::start(
            LayoutParams::for_devices(gpus.len())
                .validate()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
            gpus.first().cloned(),
            cfg.spare_segments,
            crate::release::segpool::ContextState {
                generation: gpu_shared
                    .first()
                    .map(|g| g.generation())
                    .unwrap_or_default(),
                faulted: workers
                    .first()
                    .map(|w| w.faulted.clone())
                    .unwrap_or_default(),
            },
        );
        tracing::info!(pipe_dir = %cfg.pipe_dir.display(), gpus = gpus.len(), "omps server listening");
        Ok(Server {
            cfg,
            sockets,
            restarting: None,
            gpus,
            snapshots,
            driver_version,
            workers,
            gpu_shared,
            started: std::time::Instant::now(),
            segments,
            clients: HashMap::new(),
            printf,
            slow,
            exiting: Vec::new(),
            policy,
            mem_limits,
            namespaces,
            accounts: Default::default(),
            control_log,
            board,
            draining: None,
            next_id: 1,
            // SAFETY: getuid has no preconditions.
            uid: unsafe { libc::getuid() },
            quit: false,
            peers: Vec::new(),
            handoffs: Default::default(),
            slow_peers: 0,
        })
    }

    /// Serves until `quit`; an error if a faulted GPU's context could not be recreated
    /// ([`Server::run_to_end`] says so instead).
    pub fn run(self) -> io::Result<()> {
        match self.run_to_end()? {
            Ending::Quit => Ok(()),
            Ending::Restart(_) => Err(io::Error::other(
                "a faulted GPU's context could not be recreated; start the server again",
            )),
        }
    }

    /// Serves until `quit`, or until a faulted GPU's context cannot be recreated and no
    /// client is left: then the server should start again on the sockets it returns
    /// ([`crate::control::restart::restart_self`]).
    pub fn run_to_end(mut self) -> io::Result<Ending> {
        let mut restart = false;
        while !self.quit {
            self.poll_once()?;
            // An operator's quit or shutdown stands: the server then ends, not restarts.
            if self.quit || self.draining.is_some() {
                continue;
            }
            match self.restarting {
                None if self.stuck_in_fault() => {
                    tracing::error!(
                        "a faulted GPU's context cannot be recreated; the server stops to start again"
                    );
                    self.control_log
                        .line("Server restarting: a faulted GPU's context could not be recreated");
                    self.restarting = Some(Instant::now());
                }
                // Connections in their handshake are answered (refused: the GPU is in
                // FAULT) before the process goes; new ones wait for the next.
                Some(since)
                    if (self.peers.is_empty() && self.handoffs.is_empty())
                        || since.elapsed() > crate::control::peers::HANDSHAKE_TIME =>
                {
                    restart = true;
                    self.quit = true;
                }
                _ => {}
            }
        }
        for w in &mut self.workers {
            w.send(ToWorker::Quit);
        }
        // A lane stuck in the driver may never take its quit: it is left behind, as the
        // process ends, rather than waited for.
        let t = Instant::now();
        while self.workers.iter().any(|w| w.tx.stalled()) && t.elapsed() < QUIT_WAIT {
            for w in &mut self.workers {
                w.flush();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        for w in &mut self.workers {
            if w.tx.stalled() {
                tracing::warn!("a worker lane took no messages; not waiting for it");
                continue;
            }
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
        if restart {
            // The sockets, the lock and the PID file (a restart keeps the PID) stay: the
            // new process serves on them.
            self.sockets.namespaces = self.namespaces.listeners();
            return Ok(Ending::Restart(self.sockets));
        }
        self.namespaces.remove_all();
        self.sockets.release();
        self.control_log.line("Server exited");
        tracing::info!("omps server stopped");
        Ok(Ending::Quit)
    }

    /// Connections the restarted server's doorman had not finished with
    /// (crate::control::restart): their handshakes go on here.
    pub fn adopt(&mut self, peers: Vec<crate::control::peers::Peer>) {
        self.peers.extend(peers);
    }

    /// A faulted GPU whose context the driver will not recreate, with no client of the
    /// server left to lose: the server is better started again.
    fn stuck_in_fault(&self) -> bool {
        self.clients.is_empty()
            && self
                .gpu_shared
                .iter()
                .any(|g| g.reset_failures.load(Ordering::SeqCst) >= worker::RESETS_BEFORE_RESTART)
    }

    fn poll_once(&mut self) -> io::Result<()> {
        for w in &mut self.workers {
            w.flush();
        }
        let ids: Vec<u32> = self.clients.keys().copied().collect();
        let mut fds = Vec::with_capacity(ids.len() + 1);
        // Restarting, new connections wait in the backlog for the new process.
        let accepting = self.restarting.is_none();
        fds.push(listening(
            accepting.then(|| self.sockets.listener.as_raw_fd()),
        ));
        for id in &ids {
            let fd = self.clients[id].1.as_raw_fd();
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            });
        }
        for p in &self.peers {
            fds.push(libc::pollfd {
                fd: p.stream.as_raw_fd(),
                events: p.events(),
                revents: 0,
            });
        }
        let npeers = self.peers.len();
        fds.extend(self.handoffs.pollfds());
        // The other listening sockets come last: the handoff socket, the operator's, and
        // the namespaces'.
        let listeners = fds.len();
        fds.push(listening(
            self.sockets
                .handoff
                .as_ref()
                .filter(|_| accepting)
                .map(|h| h.as_raw_fd()),
        ));
        fds.push(listening(
            accepting.then(|| self.sockets.operator.as_raw_fd()),
        ));
        fds.extend(self.namespaces.pollfds().map(|mut p| {
            if !accepting {
                p.fd = -1;
            }
            p
        }));
        // SAFETY: fds is a valid array of pollfd of the given length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        for (pfd, id) in fds[1..].iter().zip(&ids) {
            if pfd.revents != 0 && self.client_message(*id) {
                self.retire_client(*id);
            }
        }
        let readable: Vec<bool> = fds
            .drain(listeners..)
            .map(|p| p.revents & libc::POLLIN != 0)
            .collect();
        let handed = readable[0];
        let ready: Vec<bool> = fds[1 + ids.len()..]
            .iter()
            .map(|p| p.revents != 0)
            .collect();
        let (peers_ready, handoffs_ready) = ready.split_at(npeers);
        self.serve_peers(peers_ready);
        use crate::control::peers::Origin;
        for stream in self.handoffs.serve(handoffs_ready) {
            if let Err(e) = self.accept(stream, Origin::Handoff) {
                tracing::warn!("handed-over connection refused: {e}");
            }
        }
        if handed {
            self.take_handoff();
        }
        if fds[0].revents & libc::POLLIN != 0 {
            match self.sockets.listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = self.accept(stream, Origin::Clients) {
                        tracing::warn!("connection refused: {e}");
                    }
                }
                Err(e) => self.accept_failed(e),
            }
        }
        if readable[1] {
            match self.sockets.operator.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = self.accept(stream, Origin::Operator) {
                        tracing::warn!("operator connection refused: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => self.accept_failed(e),
            }
        }
        for (i, _) in readable[2..].iter().enumerate().filter(|(_, &r)| r) {
            match self.namespaces.accept(i) {
                Some(Ok((stream, ns))) => {
                    if let Err(e) = self.accept(stream, Origin::Namespace(ns)) {
                        tracing::warn!("connection refused: {e}");
                    }
                }
                Some(Err(e)) => self.accept_failed(e),
                None => {}
            }
        }
        self.reap_exiting();
        if let Some(deadline) = self.draining {
            if self.clients.is_empty() && self.exiting.is_empty() {
                self.quit = true;
            } else if deadline.is_some_and(|d| Instant::now() > d) {
                self.terminate_all("the server was shut down (its quit -t timeout passed)");
                self.draining = Some(None);
            }
        }
        Ok(())
    }

    /// A control daemon connects to pass a connection it accepted: one message, one
    /// descriptor, read once it comes (crate::control::listen::Handoffs). Only root's daemon
    /// (OMPS_MULTIUSER) may pass one; the connection itself is then checked like
    /// any other (its peer must be this server's user, or root).
    fn take_handoff(&mut self) {
        let Some(handoff) = &self.sockets.handoff else {
            return;
        };
        let room =
            self.peers.len() + self.handoffs.len() < crate::client::bounds::bounds().handshakes;
        if let Err(e) = self.handoffs.accept(handoff, self.uid, room) {
            self.accept_failed(e);
        }
    }

    /// accept() failed. Out of descriptors, the listener stays readable and poll would
    /// spin: the server pauses a moment instead, and says so once in a while.
    fn accept_failed(&mut self, e: io::Error) {
        static LOGGED: AtomicU64 = AtomicU64::new(0);
        if LOGGED.fetch_add(1, Ordering::Relaxed).is_multiple_of(1000) {
            tracing::warn!("accepting a connection failed: {e}");
        }
        if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Moves the handshakes and control connections on whose sockets something happened
    /// (`ready`, by position), and drops those past their deadline.
    fn serve_peers(&mut self, ready: &[bool]) {
        use crate::control::peers::Progress;
        let now = Instant::now();
        let mut i = 0;
        let mut k = 0;
        while i < self.peers.len() {
            let was_ready = ready.get(k).copied().unwrap_or(false);
            k += 1;
            if self.peers[i].deadline < now {
                let p = self.peers.remove(i);
                self.slow_peers += 1;
                if self.slow_peers <= 8 || self.slow_peers.is_multiple_of(1000) {
                    tracing::warn!(
                        pid = p.pid,
                        dropped = self.slow_peers,
                        "a connection that did not finish its handshake or command in time was dropped"
                    );
                }
                continue;
            }
            if !was_ready {
                i += 1;
                continue;
            }
            match self.peers[i].progress() {
                Progress::Waiting => i += 1,
                Progress::Client(_) if self.peers[i].operator_only => {
                    let p = self.peers.remove(i);
                    tracing::warn!(
                        pid = p.pid,
                        "connection refused: root may control, not run, a user's server"
                    );
                }
                Progress::Client(_) if !self.peers[i].origin.takes_clients() => {
                    let p = self.peers.remove(i);
                    let _ =
                        crate::control::peers::send_status(&p.stream, code::MPS_CONNECTION_FAILED);
                    tracing::warn!(
                        pid = p.pid,
                        "a client refused on the operator's socket: clients connect to {}",
                        sock::SOCKET_NAME
                    );
                }
                Progress::Client(settings) => {
                    let p = self.peers.remove(i);
                    let pid = p.pid;
                    let ns = match &p.origin {
                        crate::control::peers::Origin::Namespace(ns) => Some(ns.clone()),
                        _ => None,
                    };
                    let r = p
                        .into_stream()
                        .and_then(|s| self.accept_client(s, pid, &settings, ns.as_deref()));
                    match r {
                        // Killed while it connected (the soak does this a thousand times):
                        // nothing to warn of.
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::BrokenPipe
                                    | std::io::ErrorKind::ConnectionReset
                            ) =>
                        {
                            tracing::info!(pid, "client went away while connecting: {e}")
                        }
                        Err(e) => tracing::warn!(pid, "connection refused: {e}"),
                        Ok(()) => {}
                    }
                }
                Progress::Command(line) if !self.peers[i].origin.takes_commands() => {
                    let why = format!(
                        "control commands are refused on the clients' socket; the operator sends them through {}\n",
                        sock::operator_socket_in(&self.cfg.pipe_dir).display()
                    );
                    tracing::warn!(
                        pid = self.peers[i].pid,
                        "a control command on a clients' socket refused: {}",
                        line.split_whitespace().next().unwrap_or("")
                    );
                    // One refusal, then the connection goes: it holds no slot of the
                    // handshakes clients and namespaces share.
                    let _ = self.peers[i].answer(false, &why);
                    self.peers.remove(i);
                }
                Progress::Command(line) => {
                    let (ok, text) = self.control_command(&line);
                    if self.peers[i].answer(ok, &text).is_err() {
                        self.peers.remove(i);
                    } else {
                        i += 1;
                    }
                }
                Progress::Refused(why) => {
                    let p = self.peers.remove(i);
                    let _ =
                        crate::control::peers::send_status(&p.stream, code::MPS_CONNECTION_FAILED);
                    tracing::warn!(pid = p.pid, "connection refused: {why}");
                }
                Progress::Gone(why) => {
                    let p = self.peers.remove(i);
                    tracing::debug!(pid = p.pid, "connection dropped: {why}");
                }
            }
        }
    }

    /// Handles what a client sent on its socket: a pinned-memory request, or the end of
    /// the stream (the client is gone). Anything else gets the client disconnected.
    /// Returns whether the client is gone.
    fn client_message(&mut self, id: u32) -> bool {
        let (c, s) = &self.clients[&id];
        let mut buf = [0u8; std::mem::size_of::<wire::HostMemRequest>()];
        let fd = s.as_raw_fd();
        // SAFETY: a zero-timeout poll of one descriptor tells whether recv would block.
        let ready = unsafe {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            libc::poll(&mut p, 1, 0) > 0 && p.revents & libc::POLLIN != 0
        };
        if !ready {
            return true; // hang-up or error without data
        }
        let (n, fds) = match sock::recv_with_fds(fd, &mut buf) {
            Ok(r) => r,
            Err(_) => return true,
        };
        if n == 0 {
            return true;
        }
        let Some(req) = wire::get::<wire::HostMemRequest>(&buf[..n]).filter(|_| n == buf.len())
        else {
            c.disconnect(code::MPS_CLIENT_TERMINATED, "malformed socket request");
            return true;
        };
        let slow = matches!(
            (req.kind, fds.len()),
            (wire::hostmem::PIN, 1) | (wire::hostmem::PRINTF_FLUSH, 0)
        );
        // One slow request at a time per client: the shim waits for each answer, so a
        // second one is a client flooding the slow-request thread.
        if slow && c.slow_pending.swap(true, Ordering::AcqRel) {
            c.disconnect(
                code::MPS_CLIENT_TERMINATED,
                "a second request before the first was answered",
            );
            return true;
        }
        if req.kind == wire::hostmem::PIN && fds.len() == 1 {
            // Mapped and registered on the slow-request thread, which answers.
            let fd = fds.into_iter().next().expect("one descriptor");
            let (addr, len) = (req.addr, req.len);
            return self.send_slow(c, s, |client, sock| SlowJob::Pin {
                client,
                fd,
                addr,
                len,
                sock,
            });
        }
        let status = match (req.kind, fds.as_slice()) {
            (wire::hostmem::UNPIN, []) => {
                let removed = c
                    .pinned
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&req.addr);
                match removed {
                    Some(len) => {
                        // Every GPU's worker fences the client's work there (a copy in
                        // flight on any GPU may use it); the last one unregisters it.
                        let n = self.gpus.len();
                        {
                            let mut u = c.unpinning.lock().unwrap_or_else(|e| e.into_inner());
                            u.0 += len;
                            u.1 += 1;
                        }
                        let left = Arc::new(std::sync::atomic::AtomicUsize::new(n));
                        for g in 0..n {
                            let p = crate::session::PinnedRelease {
                                addr: req.addr,
                                len,
                                left: left.clone(),
                                client: c.clone(),
                            };
                            let w = self.lane_of(g, id);
                            self.workers[w].send(ToWorker::Unpin(id, p));
                        }
                        0
                    }
                    None => code::INVALID_VALUE,
                }
            }
            // Answered, never taken: the level is what the server read from the client's
            // images. A declaration of its own would make it a second printing client and
            // send everyone's text to the log (crate::client::printf).
            (wire::hostmem::PRINTF_USE, []) if req.len <= wire::printf_use::YES => 0,
            (wire::hostmem::PRINTF_FLUSH, []) => {
                let seen = usize::try_from(req.addr)
                    .ok()
                    .and_then(|k| c.visible.get(k));
                let Some(gpu) = seen.and_then(|&g| self.gpus.get(g)) else {
                    c.slow_pending.store(false, Ordering::Release);
                    return Self::reply_now(s, code::INVALID_DEVICE);
                };
                // Answered by the slow-request thread (the client waits for this one answer).
                let gpu = gpu.clone();
                return self.send_slow(c, s, |client, sock| SlowJob::Flush { gpu, client, sock });
            }
            _ => {
                c.disconnect(code::MPS_CLIENT_TERMINATED, "malformed socket request");
                return true;
            }
        };
        Self::reply_now(s, status)
    }

    /// Hands a client's slow request to the slow-request thread, which answers it on a
    /// copy of the client's socket. Returns whether the client is gone.
    fn send_slow(
        &self,
        c: &Arc<ClientShared>,
        s: &UnixStream,
        job: impl FnOnce(Arc<ClientShared>, UnixStream) -> SlowJob,
    ) -> bool {
        match s.try_clone() {
            Ok(sock) => self.slow.send(job(c.clone(), sock)).is_err(),
            Err(_) => {
                c.slow_pending.store(false, Ordering::Release);
                Self::reply_now(s, code::OUT_OF_MEMORY)
            }
        }
    }

    /// Answers a socket request: the status, then `text`. Returns whether the client is gone.
    /// A status-only answer from the control thread, which never waits on a peer: a client
    /// whose socket cannot take eight bytes now has stopped reading its answers, and is
    /// cut off (returns true: gone).
    fn reply_now(s: &UnixStream, status: i32) -> bool {
        let reply = wire::HostMemReply {
            status,
            text_len: 0,
        };
        !send_within(s, bytemuck::bytes_of(&reply), Duration::ZERO)
    }

    fn retire_client(&mut self, id: u32) {
        if let Some((c, _)) = self.clients.remove(&id) {
            c.gone.store(true, Ordering::SeqCst);
            self.printf.forget(id);
            tracing::info!(
                client = id,
                pid = c.pid,
                "client gone; releasing its resources"
            );
            for g in 0..self.gpus.len() {
                let w = self.lane_of(g, id);
                self.workers[w].send(ToWorker::Remove(id));
            }
            self.exiting.push(c);
            self.publish_placements();
        }
    }

    fn client_list(&self) -> Vec<Arc<ClientShared>> {
        self.clients.values().map(|(c, _)| c.clone()).collect()
    }

    /// Tells the workers where each client's work runs, and the metrics who is connected
    /// (both change as clients come and go).
    fn publish_placements(&self) {
        let clients = self.client_list();
        self.policy.publish(&clients);
        self.board.set_clients(clients);
    }

    /// The worker (lane) of GPU `gpu` that serves client `id`.
    fn lane_of(&self, gpu: usize, id: u32) -> usize {
        gpu * self.cfg.lanes + id as usize % self.cfg.lanes
    }

    fn reap_exiting(&mut self) {
        // One worker per GPU it sees holds the client's session and says so when it is
        // released.
        self.exiting
            .retain(|c| (c.released.load(Ordering::SeqCst) as usize) < c.visible.len());
    }

    /// A new connection: checked to be of the server's user (or root, which may only
    /// control it, as an operator), then read as its bytes come (`serve_peers`). Control
    /// commands (quit, terminate_client, limits) belong to those who may open the pipe
    /// directory: the server's user and root, as with MPS's control pipe.
    fn accept(
        &mut self,
        stream: UnixStream,
        origin: crate::control::peers::Origin,
    ) -> io::Result<()> {
        let peer = crate::control::peers::Peer::admit(stream, self.uid, &self.peers, origin)?;
        self.peers.push(peer);
        Ok(())
    }

    fn accept_client(
        &mut self,
        stream: UnixStream,
        pid: i32,
        settings: &wire::ClientSettings,
        ns: Option<&crate::control::namespace::Limits>,
    ) -> io::Result<()> {
        let refuse = |status: i32| crate::control::peers::send_status(&stream, status);
        if self.draining.is_some() {
            tracing::warn!(pid, "refusing a client: the server is shutting down");
            return refuse(code::MPS_SERVER_NOT_READY);
        }
        if self.clients.len() >= crate::client::bounds::bounds().clients {
            tracing::warn!(
                pid,
                "refusing a client: OMPS_MAX_CLIENTS clients are connected"
            );
            return refuse(code::MPS_MAX_CLIENTS_REACHED);
        }
        if let Some(why) = self.over_share(pid, ns) {
            tracing::warn!(pid, "refusing a client: {why}");
            return refuse(code::MPS_MAX_CLIENTS_REACHED);
        }
        let lc_present = crate::worker::policy::Policy::lc_present(&self.client_list());
        let mut settled = match self.policy.settle(settings) {
            Ok(s) => s,
            Err((status, why)) => {
                tracing::warn!(pid, "refusing a client: {why}");
                return refuse(status);
            }
        };
        // The GPUs it sees (its device k is the server's visible[k]), as natively; in a
        // namespace, within the namespace's.
        let named = settings
            .visible_text()
            .map(|t| crate::client::visible::resolve(Some(t), &self.snapshots));
        let visible = match ns {
            Some(ns) => {
                match crate::control::namespace::visible_in(ns, named, self.snapshots.len()) {
                    Ok(v) => v,
                    Err(why) => {
                        tracing::warn!(pid, namespace = ns.name, "refusing a client: {why}");
                        return refuse(code::NO_DEVICE);
                    }
                }
            }
            None => named.unwrap_or_else(|| crate::client::visible::resolve(None, &self.snapshots)),
        };
        if visible.is_empty() {
            tracing::warn!(
                pid,
                "refusing a client: its CUDA_VISIBLE_DEVICES names no GPU of this server"
            );
            return refuse(code::NO_DEVICE);
        }
        let seen: Vec<DeviceSnapshot> = visible.iter().map(|&g| self.snapshots[g]).collect();
        // Its own limits name its devices: moved to the server's numbering.
        let mut own_limits =
            match crate::client::memlimit::MemLimits::own(settings.mem_limit_text(), &seen) {
                Ok(mine) => {
                    let mut l = [crate::client::NO_LIMIT; omps_ring::segment::MAX_DEVICES];
                    for (k, &g) in visible.iter().enumerate() {
                        l[g] = mine[k];
                    }
                    l
                }
                Err(why) => {
                    tracing::warn!(pid, "refusing a client: {why}");
                    return refuse(code::INVALID_DEVICE);
                }
            };
        if let Some(ns) = ns {
            if let Err(why) =
                crate::control::namespace::hold_to(ns, settings, &mut settled, &mut own_limits)
            {
                tracing::warn!(pid, namespace = ns.name, "refusing a client: {why}");
                return refuse(code::INVALID_VALUE);
            }
        }
        // A lane that has not taken its messages (it sits in the driver) would hold the
        // client too: the next id whose lanes answer is taken (ids are never reused, so
        // one skipped is lost), and only when no lane answers is the client refused.
        let stalled = |this: &Self, id: u32| {
            visible
                .iter()
                .any(|&g| this.workers[this.lane_of(g, id)].tx.stalled())
        };
        let mut skipped = 0;
        while stalled(self, self.next_id) {
            skipped += 1;
            let next = self.next_id.checked_add(1);
            match next {
                Some(n) if skipped < self.cfg.lanes => self.next_id = n,
                _ => {
                    tracing::warn!(pid, "refusing a client: no worker lane is answering");
                    return refuse(code::MPS_SERVER_NOT_READY);
                }
            }
        }
        if self.any_fault() {
            return refuse(code::MPS_SERVER_NOT_READY);
        }
        let id = self.next_id;
        // Client ids are never reused: after 4 billion connections the server takes no more.
        self.next_id = id
            .checked_add(1)
            .ok_or_else(|| io::Error::other("client ids exhausted"))?;
        let crowded = self.clients.len() >= LayoutParams::CROWD;
        let params = if crowded {
            LayoutParams::for_crowd(self.gpus.len())
        } else {
            LayoutParams::for_devices(self.gpus.len())
        };
        let layout = params
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // Fallible steps that need no segment come first: once the segment is handed over,
        // only the ClientShared made from it unregisters it (a mapping dropped while still
        // registered left the driver a registration that refused every later segment at
        // that address: error 712).
        // Its streams and events, out of the server-wide totals: N clients may not hold N
        // times the per-client bounds (issue 23, finding 14).
        // Clients that left but whose work is still being released hold their grants
        // until then: counted, or a connect-and-leave loop behind endless work would eat
        // what the clients still to come are kept.
        let others = crate::client::bounds::bounds()
            .clients
            .saturating_sub(self.clients.len() + self.exiting.len() + 1);
        let Some(grant) = self
            .accounts
            .totals()
            .grant(visible.len(), self.gpus.len(), others)
        else {
            tracing::warn!(
                pid,
                "refusing a client: the server-wide totals of streams and events (OMPS_MAX_STREAMS_TOTAL, OMPS_MAX_EVENTS_TOTAL) are granted"
            );
            return refuse(code::MPS_MAX_CLIENTS_REACHED);
        };
        let ours = stream.try_clone()?;
        let spare = if crowded { None } else { self.segments.take() };
        let prepared = match spare {
            Some(p) => p,
            None => crate::release::segpool::Prepared::make(&layout, self.gpus.first())?,
        };
        let (fd, map, registered_on) = prepared.hand_over();
        // SAFETY: the mapping is total_len bytes, page aligned, and moves into ClientShared
        // together with the view.
        let seg = unsafe { SegmentView::new(map.as_ptr(), layout) };
        {
            // SAFETY: nobody else sees this segment yet.
            let snap: &mut SnapshotTable = unsafe { seg.snapshot_mut() };
            snap.driver_version = self.driver_version;
            snap.device_count = visible.len() as u32;
            for (d, &g) in snap.devices.iter_mut().zip(&visible) {
                *d = self.snapshots[g];
                // Numbered as the client numbers its devices.
                d.p2p = Default::default();
                for (slot, &h) in d.p2p.iter_mut().zip(&visible) {
                    *slot = self.snapshots[g].p2p.get(h).copied().unwrap_or_default();
                }
                // Its compute limit's share, before it can ask (as under MPS).
                if let Some(sms) = self.policy.visible_sms_settled(&settled, g, lc_present) {
                    d.attributes[crate::worker::policy::MULTIPROCESSOR_COUNT] = sms as i32;
                }
            }
            // SAFETY: as above; the header is plain fields and atomics at offset 0.
            let h = unsafe { &mut *(seg.base() as *mut omps_ring::segment::SegmentHeader) };
            h.magic = SEGMENT_MAGIC;
            h.params = params;
            h.client_id = id;
        }
        let welcome = Welcome {
            magic: wire::HELLO_MAGIC,
            version: wire::PROTOCOL_VERSION,
            status: 0,
            client_id: id,
            num_devices: visible.len() as u32,
            layout: params,
            segment_len: layout.total_len as u64,
            max_streams: grant.streams,
            max_events: grant.events,
        };
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| crate::client::one_word(s.trim(), 64))
            .unwrap_or_default();
        let mut c = ClientShared::new(id, pid, name, map, seg, OwnedFd::from(ours), registered_on);
        c.identity = crate::client::Identity::of(pid, settings.ns_pid);
        let (account, first) = self.accounts.of(pid);
        // A namespace's memory limit holds for its clients together: the process joins
        // the namespace it came through, and another connection of its must come the
        // same way (or its memory would be counted in one place and used in another).
        if !account.join(ns.map(|n| &n.held)) {
            tracing::warn!(
                pid,
                "refusing a client: another connection of this process came through {}",
                if ns.is_some() {
                    "another namespace or the server's own socket"
                } else {
                    "a namespace"
                }
            );
            return refuse(code::INVALID_VALUE);
        }
        c.account = account;
        c.visible = visible.clone();
        c.printf = Some(self.printf.clone());
        c.grant = Some(grant);
        let c = Arc::new(c);
        crate::client::read_command_later(&c);
        let mut fds = vec![fd.as_raw_fd()];
        fds.extend(
            visible
                .iter()
                .map(|&g| self.workers[self.lane_of(g, id)].bell_fd.as_raw_fd()),
        );
        // A client that died meanwhile: `c` goes, and its segment with it, unregistered.
        sock::send_with_fds(stream.as_raw_fd(), bytemuck::bytes_of(&welcome), &fds)?;
        // Its placement (and everyone's, if it is latency-critical) before any worker
        // sees it, so its first work already runs where it belongs.
        settled.apply(&c);
        self.mem_limits.apply(&c, &own_limits, first);
        tracing::info!(
            client = id,
            pid,
            qos = settled.qos.name(),
            "client connected"
        );
        self.clients.insert(id, (c.clone(), stream));
        self.publish_placements();
        for &g in &c.visible {
            // Open before any worker starts its session: a free on one GPU then always
            // waits for the client's work on the others (crate::release::peer_fence).
            crate::release::peer_fence::open(&c, g);
        }
        for &g in &c.visible {
            let w = self.lane_of(g, id);
            self.workers[w].send(ToWorker::Add(c.clone()));
        }
        Ok(())
    }

    /// Why one more client of process `pid`, through namespace `ns` (None: the server's
    /// own socket), would take more than its share of the client slots: its process's
    /// (OMPS_MAX_CLIENTS_PER_PROCESS; PID 0, a process the server cannot see, has none)
    /// or its namespace's (`max_clients=`, else all but a quarter of OMPS_MAX_CLIENTS;
    /// the server's own socket is held to that only while namespaces exist), so that one
    /// tenant cannot lock the others out (issue 23).
    fn over_share(
        &self,
        pid: i32,
        ns: Option<&crate::control::namespace::Limits>,
    ) -> Option<String> {
        let b = crate::client::bounds::bounds();
        let group = ns.map(|n| &n.held);
        let (mut mine, mut ours) = (0, 0);
        for (c, _) in self.clients.values() {
            mine += usize::from(pid != 0 && c.pid == pid);
            ours += usize::from(c.account.joined(group));
        }
        if mine >= b.clients_per_process {
            return Some(format!(
                "process {pid} has {mine} clients (OMPS_MAX_CLIENTS_PER_PROCESS)"
            ));
        }
        let cap = match ns {
            Some(n) => n.max_clients.unwrap_or_else(|| b.namespace_clients()),
            None if self.namespaces.is_empty() => return None,
            None => b.namespace_clients(),
        };
        (ours >= cap).then(|| match ns {
            Some(n) if n.max_clients.is_some() => format!(
                "namespace '{}' has {ours} clients (its max_clients={cap})",
                n.name
            ),
            Some(n) => format!(
                "namespace '{}' has {ours} clients, its share (OMPS_MAX_CLIENTS less a quarter; the operator may set max_clients=)",
                n.name
            ),
            None => format!(
                "the server's own socket has {ours} clients, its share while namespaces exist (OMPS_MAX_CLIENTS less a quarter)"
            ),
        })
    }

    /// Whether a GPU is in FAULT: its clients have been told, new clients are refused
    /// until they are gone and its worker has recreated the context.
    fn any_fault(&self) -> bool {
        self.workers
            .iter()
            .any(|w| w.faulted.load(Ordering::SeqCst))
    }
}

/// The scheduling policy, with every GPU's fixed confinements made (before any client
/// runs, since making one waits for running work).
fn make_policy(
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
fn presizes(cfg: &ServerConfig) -> io::Result<Vec<(i32, u64, String)>> {
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
fn presize(
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

/// A listening socket's poll entry: watched for connections, or left out (-1).
fn listening(fd: Option<std::os::fd::RawFd>) -> libc::pollfd {
    libc::pollfd {
        fd: fd.unwrap_or(-1),
        events: libc::POLLIN,
        revents: 0,
    }
}
