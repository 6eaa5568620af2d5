//! The control thread (`Server`): its configuration, the socket, the handshake, omps-ctl
//! requests, and client death. This file holds the server's state, its start and its
//! poll loop; its children hold the rest by family: config.rs (configuration and what is
//! set up from it), accept.rs (new connections and clients), requests.rs (what comes on
//! the sockets after), slow.rs (the slow-request thread), clients.rs (the client set and
//! client death) and commands.rs (the control commands).

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
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod accept;
mod clients;
mod commands;
mod config;
mod requests;
mod slow;

use super::{control_log, lane_queue};
use config::{make_policy, presize, presizes};
pub use config::{ServerConfig, DEFAULT_LANES, DEFAULT_MALLOC_HEAP};
use slow::{start_slow_requests, SlowJob};
use std::time::{Duration, Instant};

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
    /// What waiting clients are asked for now (`SegmentHeader::wait_active_us`).
    wait_active_us: u32,
    uid: u32,
    quit: bool,
    /// Handshakes in progress and control connections (crate::control::peers).
    peers: Vec<crate::control::peers::Peer>,
    /// Connections to the handoff socket whose message has not come yet (crate::control::listen).
    handoffs: crate::control::listen::Handoffs,
    /// Peers dropped for going over their deadline (logged the first few times).
    slow_peers: u64,
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
            wait_active_us: 0,
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

    /// Whether a GPU is in FAULT: its clients have been told, new clients are refused
    /// until they are gone and its worker has recreated the context.
    fn any_fault(&self) -> bool {
        self.workers
            .iter()
            .any(|w| w.faulted.load(Ordering::SeqCst))
    }
}

/// A listening socket's poll entry: watched for connections, or left out (-1).
fn listening(fd: Option<std::os::fd::RawFd>) -> libc::pollfd {
    libc::pollfd {
        fd: fd.unwrap_or(-1),
        events: libc::POLLIN,
        revents: 0,
    }
}
