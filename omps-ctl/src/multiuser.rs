//! One server per user, started on the user's first connection, as MPS's control daemon
//! does (OMPS_MULTIUSER=1 with `omps-ctl -d` or `-f`, as root).
//!
//! The daemon listens on the pipe directory's socket, which every user may connect to.
//! Each connection is the connecting user's (SO_PEERCRED): the daemon starts that user's
//! server if none runs (as that user, in `PIPE/u<UID>`, a directory only that user can
//! open) and passes the connection to it through the server's handoff socket, so clients
//! and a user's omps-ctl talk to their own server as if it listened there. Users' servers
//! run side by side (MPS lets one user's server run at a time and makes the others wait).
//! Root's own control commands are the daemon's: the server list, `start_server -uid`,
//! `quit` for all; defaults (`set_default_*`) reach every server, also those started
//! later; a command naming a PID goes to the server it names or that holds that client;
//! the rest go to root's server, which the daemon starts with it.
//!
//! Users do not trust each other or root's daemon: the daemon's directories are root's
//! alone and nothing a user placed is followed (`dirs`), one user's server start or flood
//! of connections holds up no other user (`admit`, a start lock per user), a connection's
//! hello is waited for without spinning (`hello`), only uids with a passwd entry get a
//! server and only so many users' servers run (`admit`), and log files a user prepared
//! are not waited on (the servers open them as `omps_server::log_file`).

mod admit;
mod dirs;
mod hello;
mod operator;

use crate::daemon::{server_binary, Starting};
use admit::Admission;
use dirs::RootDir;
use omps_ring::sock;
use omps_ring::wire;
use std::collections::HashMap;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Whether `-d` / `-f` start the daemon of several users rather than one server.
pub fn wanted() -> bool {
    std::env::var("OMPS_MULTIUSER").is_ok_and(|v| v == "1")
}

/// `-d`: the daemon in the background (this program again, in the foreground, in its own
/// session); returns once it listens.
pub fn start_background() -> Result<(), String> {
    if crate::talk::server_running() {
        return Err(format!(
            "An instance of this daemon is already running (pipe directory {})",
            sock::pipe_directory().display()
        ));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find omps-ctl: {e}"))?;
    let mut cmd = Command::new(&exe);
    cmd.arg("-f")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe; the daemon outlives this program.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    Starting {
        what: "the daemon",
        program: &exe,
        hint: "; run `OMPS_MULTIUSER=1 omps-ctl -f` to see why",
        limit: Duration::from_secs(60),
        kill_late: false,
    }
    .run(cmd, crate::talk::server_running)
    .map(drop)
}

/// A running server, as the operator's commands see it.
struct Running {
    uid: u32,
    pid: u32,
    dir: PathBuf,
}

/// A user's server.
struct UserServer {
    child: Child,
    dir: PathBuf,
}

struct Daemon {
    pipe: RootDir,
    log: Option<RootDir>,
    /// Running servers. Held only for a look or an insert, never while one starts.
    servers: Mutex<HashMap<u32, UserServer>>,
    /// One lock per user, held while that user's server starts (which may take a
    /// minute): the user's other connections wait for it, no one else's do. Removed when
    /// a start ends with no one waiting, so uids that come and go leave nothing here.
    starting: Mutex<HashMap<u32, Arc<Mutex<()>>>>,
    /// Users' servers starting now (root's not counted). Taken with `servers` locked, as
    /// the running ones are counted, and given back in the same look that lists a started
    /// one, so running and starting ones together stay within `max_servers`.
    launching: AtomicUsize,
    /// Users' servers running or starting at once (OMPS_MAX_USER_SERVERS).
    max_servers: usize,
    /// The primary group of a uid the system knows (a field so that tests can name
    /// users: their uids are no one's).
    passwd: fn(u32) -> Option<u32>,
    /// Whether a uid has a passwd entry, as looked up lately (admit::KNOWN_FOR), for the
    /// accepting thread: passwd-less uids share one bucket of connections.
    known: Mutex<HashMap<u32, (bool, std::time::Instant)>>,
    /// `set_default_*` commands so far, replayed to each server started later, and how
    /// many were ever set (a start replays until it has seen them all).
    defaults: Mutex<(Vec<String>, u64)>,
    admission: Arc<Admission>,
    /// The program each user's server runs, and how long it has to start listening.
    server: PathBuf,
    start_limit: Duration,
    /// control.log's size before it moves to control.log.1 (OMPS_LOG_MAX_BYTES; 0: none).
    log_max: u64,
    /// Held while a line is written: two threads at the cap would both rotate, the second
    /// moving the first's fresh log over the full one it just kept.
    log_lock: Mutex<()>,
}

/// `-f`: runs the daemon until `quit`.
pub fn run_foreground() -> String {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return "OMPS_MULTIUSER=1: the daemon starts servers as their users and must run as root"
            .into();
    }
    match serve() {
        Ok(()) => String::new(),
        Err(e) => e,
    }
}

fn serve() -> Result<(), String> {
    // Others may reach the socket, not list or change the directory.
    let pipe = RootDir::open(&sock::pipe_directory(), 0o711)?;
    // Users' servers reach their own directories in it.
    let log = match sock::log_directory() {
        Some(l) => Some(RootDir::open(&l, 0o711)?),
        None => None,
    };
    let path = pipe.path().join(sock::SOCKET_NAME);
    if UnixStream::connect(&path).is_ok() {
        return Err(format!(
            "an omps server already listens on {}",
            path.display()
        ));
    }
    // The directory is root's alone (checked above), so these paths stay the daemon's.
    pipe.remove(sock::SOCKET_NAME);
    let listener = UnixListener::bind(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    pipe.file(sock::PID_FILE, false)
        .and_then(|mut f| writeln!(f, "{}", std::process::id()))
        .map_err(|e| format!("{}: {e}", pipe.path().join(sock::PID_FILE).display()))?;
    let d = Arc::new(Daemon::new(pipe, log, server_binary()));
    d.log("Starting omps control daemon (one server per user)");
    // Root's server comes with the daemon: the operator's commands go to it.
    d.server_for(0, Some(0))?;
    d.accept_loop(&listener);
    Ok(())
}

impl Daemon {
    /// Whose share of the connections one of `uid` takes: its own, or, for a uid with no
    /// passwd entry (a user namespace's subordinate uid: there may be 65,536 of them per
    /// user), the one all such uids share (admit::UNKNOWN_USERS), so that they cannot
    /// take the total between them (issue 23 review, finding 4). Looked up once in
    /// admit::KNOWN_FOR per uid.
    fn bucket(&self, uid: u32) -> u32 {
        if uid == 0 {
            return 0;
        }
        let now = std::time::Instant::now();
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = known
            .get(&uid)
            .filter(|(_, at)| now.duration_since(*at) < admit::KNOWN_FOR)
            .map(|&(k, _)| k);
        let k = fresh.unwrap_or_else(|| {
            if known.len() >= admit::KNOWN_KEPT {
                known.retain(|_, (_, at)| now.duration_since(*at) < admit::KNOWN_FOR);
                if known.len() >= admit::KNOWN_KEPT {
                    known.clear();
                }
            }
            let k = (self.passwd)(uid).is_some();
            known.insert(uid, (k, now));
            k
        });
        if k {
            uid
        } else {
            admit::UNKNOWN_USERS
        }
    }

    fn new(pipe: RootDir, log: Option<RootDir>, server: PathBuf) -> Daemon {
        Daemon {
            pipe,
            log,
            servers: Default::default(),
            starting: Default::default(),
            launching: AtomicUsize::new(0),
            max_servers: admit::max_user_servers(),
            passwd: admit::passwd_gid,
            known: Default::default(),
            defaults: Default::default(),
            admission: Default::default(),
            server,
            start_limit: Duration::from_secs(60),
            log_max: omps_ring::sock::log_max_bytes(),
            log_lock: Mutex::new(()),
        }
    }

    /// Takes connections, each to a thread of its own within the bounds of `admit`.
    /// accept() failing (out of descriptors, say) leaves the socket readable: the loop
    /// pauses, longer each time, rather than spin.
    fn accept_loop(self: &Arc<Self>, listener: &UnixListener) {
        let mut pause = Duration::ZERO;
        let (mut failures, mut refused) = (0u64, 0u64);
        loop {
            self.admission.wait_room(admit::TOTAL);
            let conn = match listener.accept() {
                Ok((c, _)) => c,
                Err(e) => {
                    failures += 1;
                    if failures.is_power_of_two() {
                        self.log(&format!("accepting a connection failed ({failures}x): {e}"));
                    }
                    pause = (pause * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                    std::thread::sleep(pause);
                    continue;
                }
            };
            pause = Duration::ZERO;
            let Ok(cred) = sock::peer_cred(conn.as_raw_fd()) else {
                continue;
            };
            let bucket = self.bucket(cred.uid);
            let Some(ticket) = self.admission.admit(bucket, admit::PER_USER) else {
                refused += 1;
                if refused.is_power_of_two() {
                    self.log(&format!(
                        "uid {} has {} connections in progress{}: one more closed ({refused}x)",
                        cred.uid,
                        admit::PER_USER,
                        if bucket == cred.uid {
                            ""
                        } else {
                            " (with every uid that has no passwd entry)"
                        }
                    ));
                }
                continue;
            };
            let d = self.clone();
            let spawned = std::thread::Builder::new()
                .name("omps-daemon-conn".into())
                .stack_size(256 << 10)
                .spawn(move || {
                    let _ticket = ticket;
                    d.serve_connection(conn, cred.uid, cred.gid);
                });
            if let Err(e) = spawned {
                self.log(&format!("no thread for a connection: {e}"));
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn log(&self, line: &str) {
        let Some(dir) = &self.log else { return };
        let line = format!("[omps-ctl daemon {}] {line}\n", std::process::id());
        let _one = self.log_lock.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(mut f) = dir.file("control.log", true) else {
            return;
        };
        // Users' connections can make lines here (a refused or failed start each): kept
        // under OMPS_LOG_MAX_BYTES as the servers' logs are, the full one moved to
        // control.log.1 (issue 23, finding 14).
        let max = self.log_max;
        let len = f.metadata().map_or(0, |m| m.len());
        if max != 0 && len > 0 && len.saturating_add(line.len() as u64) > max {
            drop(f);
            if dir.rename("control.log", "control.log.1").is_err() {
                return;
            }
            let Ok(again) = dir.file("control.log", true) else {
                return;
            };
            f = again;
        }
        let _ = f.write_all(line.as_bytes());
    }

    fn serve_connection(&self, conn: UnixStream, uid: u32, gid: u32) {
        let Some(kind) = hello::peek_kind(&conn, hello::WAIT) else {
            return;
        };
        if kind == wire::kind::CONTROL && uid == 0 {
            return self.operator(conn);
        }
        // A client starts its user's server; a user's omps-ctl reaches it if it runs.
        let dir = if kind == wire::kind::CONTROL {
            self.running(uid)
        } else {
            match self.server_for(uid, Some(gid)) {
                Ok(dir) => Some(dir),
                Err(e) => {
                    self.log(&format!("no server for a client of uid {uid}: {e}"));
                    None
                }
            }
        };
        match dir {
            Some(dir) => {
                if let Err(e) = hand_over(&dir, uid, &conn) {
                    self.log(&format!("handing a connection of uid {uid} over: {e}"));
                }
            }
            None if kind == wire::kind::CONTROL => {
                let _ = hello::consume(&conn);
                let msg = format!("\x01no omps server runs for uid {uid}\n");
                let _ = sock::write_frame(&mut &conn, msg.as_bytes());
            }
            None => {
                let _ = hello::consume(&conn);
                let w = wire::Welcome {
                    magic: wire::HELLO_MAGIC,
                    version: wire::PROTOCOL_VERSION,
                    status: 805, // CUDA_ERROR_MPS_CONNECTION_FAILED
                    ..bytemuck::Zeroable::zeroed()
                };
                let _ = (&conn).write_all(bytemuck::bytes_of(&w));
            }
        }
    }

    /// The pipe directory of `uid`'s server, if it runs (one starting does not).
    fn running(&self, uid: u32) -> Option<PathBuf> {
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        let alive = servers
            .get_mut(&uid)
            .is_some_and(|s| matches!(s.child.try_wait(), Ok(None)));
        if !alive {
            servers.remove(&uid);
        }
        servers.get(&uid).map(|s| s.dir.clone())
    }

    /// `uid`'s server, started as that user if none runs; its pipe directory. It runs as
    /// group `gid` (a connection's), else as the user's primary group.
    fn server_for(&self, uid: u32, gid: Option<u32>) -> Result<PathBuf, String> {
        if let Some(dir) = self.running(uid) {
            return Ok(dir);
        }
        let primary = if uid == 0 {
            Some(0)
        } else {
            (self.passwd)(uid)
        };
        let Some(primary) = primary else {
            return Err(format!(
                "uid {uid} has no passwd entry (a user namespace's subordinate uid?): \
                 servers are started for the system's users only"
            ));
        };
        let gid = gid.unwrap_or(primary);
        let lock = self
            .starting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(uid)
            .or_default()
            .clone();
        let _starting = lock.lock().unwrap_or_else(|e| e.into_inner());
        let started = self.start(uid, gid);
        let mut starting = self.starting.lock().unwrap_or_else(|e| e.into_inner());
        // No one else holds it (and no one can take it while the map is locked): a
        // later start makes a new one.
        if Arc::strong_count(&lock) == 2 {
            starting.remove(&uid);
        }
        started
    }

    /// A place among the users' servers for one of `uid`'s to start in, unless
    /// `max_servers` run or start already; root's server needs none.
    fn slot(&self, uid: u32) -> Result<Slot<'_>, String> {
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        if uid == 0 {
            return Ok(Slot(&self.launching, false));
        }
        servers.retain(|_, s| matches!(s.child.try_wait(), Ok(None)));
        let users = servers.keys().filter(|&&u| u != 0).count();
        let n = users + self.launching.load(Ordering::SeqCst);
        if n >= self.max_servers {
            return Err(format!(
                "{n} users' servers run or start already (OMPS_MAX_USER_SERVERS={})",
                self.max_servers
            ));
        }
        self.launching.fetch_add(1, Ordering::SeqCst);
        Ok(Slot(&self.launching, true))
    }

    /// `server_for` with `uid`'s start lock held.
    fn start(&self, uid: u32, gid: u32) -> Result<PathBuf, String> {
        // Started meanwhile by another connection of the user's.
        if let Some(dir) = self.running(uid) {
            return Ok(dir);
        }
        let mut slot = self.slot(uid)?;
        let dir = self.pipe.private_child(&format!("u{uid}"), uid, gid)?;
        let mut cmd = Command::new(&self.server);
        cmd.env("OMPS_PIPE_DIRECTORY", &dir)
            .env_remove("CUDA_MPS_PIPE_DIRECTORY")
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(log) = &self.log {
            let own = log.private_child(&format!("u{uid}"), uid, gid)?;
            cmd.env("OMPS_LOG_DIRECTORY", own)
                .env_remove("CUDA_MPS_LOG_DIRECTORY");
        }
        if uid != 0 {
            // std drops root's supplementary groups when it changes the uid.
            cmd.uid(uid).gid(gid);
        }
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let what = format!("omps-server for uid {uid}");
        let child = Starting {
            what: &what,
            program: &self.server,
            hint: "",
            limit: self.start_limit,
            kill_late: true,
        }
        .run(cmd, || {
            dirs::connect_owned(&dir, sock::SOCKET_NAME, uid).is_ok()
        })?;
        self.log(&format!("Server {} started for uid {uid}", child.id()));
        // The defaults reach it before any client does. One set meanwhile is replayed
        // too: the server is listed (and so reached by later ones) only once it has
        // seen every default set so far.
        let mut seen = 0;
        loop {
            let (todo, count) = {
                let d = self.defaults.lock().unwrap_or_else(|e| e.into_inner());
                if d.1 == seen {
                    let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
                    servers.insert(
                        uid,
                        UserServer {
                            child,
                            dir: dir.clone(),
                        },
                    );
                    // Counted as running from now on, in the same look.
                    slot.release();
                    return Ok(dir);
                }
                (d.0.clone(), d.1)
            };
            for c in &todo {
                let _ = ask(&dir, uid, c);
            }
            seen = count;
        }
    }

    /// (server PID, pipe directory) of every running server, root's first.
    fn all(&self) -> Vec<Running> {
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        servers.retain(|_, s| matches!(s.child.try_wait(), Ok(None)));
        let mut v: Vec<Running> = servers
            .iter()
            .map(|(&uid, s)| Running {
                uid,
                pid: s.child.id(),
                dir: s.dir.clone(),
            })
            .collect();
        v.sort_by_key(|r| r.uid);
        v
    }
}

/// The longest answer root takes from a user's server (its lists of clients run to some
/// hundred bytes a client).
const USER_ANSWER_MAX: usize = 1 << 20;

/// One command to `uid`'s server of pipe directory `dir`, as root (its operator). The
/// server is the user's, who may have changed it: its answer is held to
/// [`USER_ANSWER_MAX`] and stripped of control characters (an escape sequence would
/// reach root's terminal).
fn ask(dir: &Path, uid: u32, cmd: &str) -> (bool, String) {
    let asked = dirs::connect_owned(&dir.join(sock::OPERATOR_DIR), sock::OPERATOR_SOCKET, uid)
        .and_then(crate::talk::control_hello)
        .map_err(|e| format!("{}: {e}\n", dir.display()))
        .and_then(|s| crate::talk::ask_capped(s, cmd, Duration::from_secs(10), USER_ANSWER_MAX));
    match asked {
        Ok(text) => (true, plain_text(&text)),
        Err(text) => (false, plain_text(&text)),
    }
}

/// `text` with every control character but newline and tab made '?'.
fn plain_text(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '?'
            } else {
                c
            }
        })
        .collect()
}

/// Passes `conn` to `uid`'s server of pipe directory `dir`.
fn hand_over(dir: &Path, uid: u32, conn: &UnixStream) -> std::io::Result<()> {
    let h = dirs::connect_owned(dir, sock::HANDOFF_NAME, uid)?;
    h.set_write_timeout(Some(Duration::from_secs(1)))?;
    sock::send_with_fds(h.as_raw_fd(), b"h", &[conn.as_raw_fd()])
}

/// A place taken among the users' servers while one starts; given back when the start
/// fails, or when the server is listed as running.
struct Slot<'a>(&'a AtomicUsize, bool);

impl Slot<'_> {
    fn release(&mut self) {
        if std::mem::take(&mut self.1) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
use operator::{names_a_pid, server_of_pid};

#[cfg(test)]
mod tests;
