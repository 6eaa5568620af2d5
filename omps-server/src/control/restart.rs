//! A server process from start to end, and its restart after a GPU fault the driver will
//! not recover from (exec of its own binary: same PID, arguments and environment).
//!
//! The socket survives the restart. The faulted server stops accepting, answers the
//! handshakes under way (refused: CUDA_ERROR_MPS_SERVER_NOT_READY), and execs with its
//! listening sockets and the pipe directory's lock left open ([`crate::control::listen`]); a
//! client that connects meanwhile waits in the socket's backlog. The new process's
//! doorman answers every connection with CUDA_ERROR_MPS_SERVER_NOT_READY while the GPUs
//! open (about a second on the H100), as the faulted server did, and hands what it has
//! not finished to the server once that is up; from then on clients are served. At no
//! moment is the socket file missing, so no client sees "No such file or directory".

use crate::control::listen::Sockets;
use crate::control::peers::{Origin, Peer, Progress};
use crate::gpu::{code, Gpu};
use crate::{say, Server, ServerConfig};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What the doorman tells an operator's command.
const STARTING: &str =
    "the omps server is starting again after a GPU fault; try again in a moment\n";

/// Runs a server process: opens its GPUs with `open` (which says why it could not),
/// listens (on the sockets a restart left, or new ones), serves, and on
/// [`crate::control::Ending::Restart`] starts again by exec. Returns the process's exit
/// status (a restart returns only if the exec failed).
pub fn serve(
    cfg: ServerConfig,
    open: impl FnOnce() -> Result<(Vec<Arc<dyn Gpu>>, i32), String>,
) -> ExitCode {
    let inherited = match Sockets::inherited(&cfg.pipe_dir) {
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => {
            say!("omps-server: the sockets of the restart are unusable ({e}); binding anew");
            None
        }
        None => None,
    };
    let doorman = inherited.as_ref().and_then(|s| {
        Doorman::start(s)
            .inspect_err(|e| say!("omps-server: no doorman during the start: {e}"))
            .ok()
    });
    // A first start takes the lock before the GPUs (a second server beside a live one
    // fails at once) and binds after them: the socket appears once the server serves.
    let locked = match inherited {
        Some(s) => Ok(s),
        None => match crate::control::listen::lock(&cfg.pipe_dir) {
            Ok(l) => Err(l),
            Err(e) => {
                say!(
                    "omps-server: cannot listen in {}: {e}",
                    cfg.pipe_dir.display()
                );
                return ExitCode::FAILURE;
            }
        },
    };
    let (gpus, driver_version) = match open() {
        Ok(v) => v,
        Err(why) => {
            say!("omps-server: {why}");
            if let Ok(s) = locked {
                s.release();
            }
            return ExitCode::FAILURE;
        }
    };
    let sockets = match locked.or_else(|l| l.bind()) {
        Ok(s) => s,
        Err(e) => {
            say!(
                "omps-server: cannot listen in {}: {e}",
                cfg.pipe_dir.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let files = sockets.files.clone();
    let count = gpus.len();
    let mut server = match Server::with_sockets(cfg, gpus, driver_version, sockets) {
        Ok(s) => s,
        Err(e) => {
            say!("omps-server: {e}");
            files.remove();
            return ExitCode::FAILURE;
        }
    };
    if let Some(d) = doorman {
        server.adopt(d.stop());
    }
    say!(
        "omps-server: serving {count} GPU(s) on {}",
        files.socket_path().display()
    );
    match server.run_to_end() {
        Ok(crate::control::Ending::Quit) => ExitCode::SUCCESS,
        Ok(crate::control::Ending::Restart(sockets)) => {
            let e = restart_self(sockets);
            say!("omps-server: starting again failed: {e}");
            files.remove();
            ExitCode::FAILURE
        }
        Err(e) => {
            say!("omps-server: {e}");
            files.remove();
            ExitCode::FAILURE
        }
    }
}

/// Replaces this process by a new run of the same server (same PID, arguments and
/// environment) that serves on `sockets`; returns only if that fails.
pub fn restart_self(sockets: Sockets) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    // The new process writes where this one started writing (fds 1 and 2 may be the
    // printf router's pipes, whose readers end with this image).
    crate::base::stdio::restore();
    // Nothing else of this process may reach the new one: the driver's device files most
    // of all, which would keep the broken context's memory. close_range (Linux 5.11) marks
    // them all at once; older kernels get the scan of /proc/self/fd.
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets close-on-exec flags.
    let marked = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
        )
    } == 0;
    if let (false, Ok(dir)) = (marked, std::fs::read_dir("/proc/self/fd")) {
        let fds: Vec<i32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|&fd| fd > 2)
            .collect();
        for fd in fds {
            // SAFETY: F_SETFD on a descriptor number changes only its close-on-exec flag;
            // one that closed meanwhile just fails.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
    // Except the sockets and the lock, which the new process takes over.
    let kept = sockets.keep_across_exec();
    let mut args = std::env::args_os();
    // Its own path and name (not /proc/self/exe, whose name is "exe"), so that ps, pgrep
    // and pidof still find it.
    let exe = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
    let mut cmd = std::process::Command::new(exe);
    if let Some(name) = args.next() {
        cmd.arg0(name);
    }
    let e = cmd
        .args(args)
        .env(crate::control::listen::FDS_VAR, kept)
        .exec();
    // `sockets` is dropped only now (the exec failed): the caller removes the files.
    drop(sockets);
    e
}

/// Answers connections while a restarted server opens its GPUs: clients are refused with
/// CUDA_ERROR_MPS_SERVER_NOT_READY, operators' commands told to wait.
pub struct Doorman {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Peer>>,
}

impl Doorman {
    pub fn start(s: &Sockets) -> std::io::Result<Doorman> {
        let listener = s.listener.try_clone()?;
        let handoff = s.handoff.as_ref().map(|h| h.try_clone()).transpose()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("omps-doorman".into())
            .spawn(move || answer_until(&listener, handoff.as_ref(), &flag))?;
        Ok(Doorman { stop, thread })
    }

    /// Stops answering; returns the connections still in their handshake, for the
    /// server (a client among them is then served).
    pub fn stop(self) -> Vec<Peer> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or_default()
    }
}

fn answer_until(
    listener: &UnixListener,
    handoff: Option<&UnixListener>,
    stop: &AtomicBool,
) -> Vec<Peer> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let mut peers: Vec<Peer> = Vec::new();
    let mut handoffs = crate::control::listen::Handoffs::default();
    let mut refused = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let mut fds = vec![
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: handoff.map_or(-1, |h| h.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        fds.extend(peers.iter().map(|p| libc::pollfd {
            fd: p.stream.as_raw_fd(),
            events: p.events(),
            revents: 0,
        }));
        fds.extend(handoffs.pollfds());
        // SAFETY: fds is a valid array of pollfd of the given length.
        if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 20) } < 0 {
            continue;
        }
        let now = Instant::now();
        let npeers = peers.len();
        let mut ready = fds[2..2 + npeers].iter().map(|p| p.revents != 0);
        peers.retain_mut(|p| {
            if !ready.next().unwrap_or(false) {
                return p.deadline >= now;
            }
            match p.progress() {
                Progress::Waiting => p.deadline >= now,
                Progress::Client(_) => {
                    refused += 1;
                    if let Ok(s) = p.stream.try_clone().and_then(|s| {
                        s.set_nonblocking(false)?;
                        Ok(s)
                    }) {
                        refuse(&s, code::MPS_SERVER_NOT_READY);
                    }
                    false
                }
                Progress::Command(_) => p.answer(false, STARTING).is_ok(),
                Progress::Refused(_) => {
                    refuse(&p.stream, code::MPS_CONNECTION_FAILED);
                    false
                }
                Progress::Gone(_) => false,
            }
        });
        let mut admit = |stream, origin| match Peer::admit(stream, uid, &peers, origin) {
            Ok(p) => peers.push(p),
            Err(e) => tracing::warn!("connection refused: {e}"),
        };
        if fds[0].revents & libc::POLLIN != 0 {
            match listener.accept() {
                Ok((s, _)) => admit(s, Origin::Clients),
                Err(e) => {
                    tracing::warn!("accepting a connection failed: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        }
        let handoffs_ready: Vec<bool> = fds[2 + npeers..].iter().map(|p| p.revents != 0).collect();
        for s in handoffs.serve(&handoffs_ready) {
            admit(s, Origin::Handoff);
        }
        if let Some(h) = handoff.filter(|_| fds[1].revents & libc::POLLIN != 0) {
            let room = peers.len() + handoffs.len() < crate::client::bounds::bounds().handshakes;
            if let Err(e) = handoffs.accept(h, uid, room) {
                tracing::warn!("accepting a handoff failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
    if refused > 0 {
        tracing::info!(refused, "clients refused while the server started again");
    }
    peers
}

/// A handshake's answer with `status` and nothing else.
fn refuse(s: &std::os::unix::net::UnixStream, status: i32) {
    let _ = s.set_write_timeout(Some(std::time::Duration::from_millis(500)));
    let _ = crate::control::peers::send_status(s, status);
}
