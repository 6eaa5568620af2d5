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
//! of connections holds up no other user (`admit`, a start lock per user), and log files
//! a user prepared are not waited on (the servers open them as `omps_server::log_file`).

mod admit;
mod dirs;

use crate::daemon::{server_binary, Starting};
use admit::Admission;
use dirs::RootDir;
use omps_ring::sock;
use omps_ring::wire::{self, Hello};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// minute): the user's other connections wait for it, no one else's do.
    starting: Mutex<HashMap<u32, Arc<Mutex<()>>>>,
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
    d.server_for(0, 0)?;
    d.accept_loop(&listener);
    Ok(())
}

impl Daemon {
    fn new(pipe: RootDir, log: Option<RootDir>, server: PathBuf) -> Daemon {
        Daemon {
            pipe,
            log,
            servers: Default::default(),
            starting: Default::default(),
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
            let Some(ticket) = self.admission.admit(cred.uid, admit::PER_USER) else {
                refused += 1;
                if refused.is_power_of_two() {
                    self.log(&format!(
                        "uid {} has {} connections in progress: one more closed ({refused}x)",
                        cred.uid,
                        admit::PER_USER
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
        let Some(kind) = peek_kind(&conn) else {
            return;
        };
        if kind == wire::kind::CONTROL && uid == 0 {
            return self.operator(conn);
        }
        // A client starts its user's server; a user's omps-ctl reaches it if it runs.
        let dir = if kind == wire::kind::CONTROL {
            self.running(uid)
        } else {
            match self.server_for(uid, gid) {
                Ok(dir) => Some(dir),
                Err(e) => {
                    self.log(&format!("cannot start a server for uid {uid}: {e}"));
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
                let _ = consume_hello(&conn);
                let msg = format!("\x01no omps server runs for uid {uid}\n");
                let _ = sock::write_frame(&mut &conn, msg.as_bytes());
            }
            None => {
                let _ = consume_hello(&conn);
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

    /// `uid`'s server, started as that user if none runs; its pipe directory.
    fn server_for(&self, uid: u32, gid: u32) -> Result<PathBuf, String> {
        if let Some(dir) = self.running(uid) {
            return Ok(dir);
        }
        let lock = self
            .starting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(uid)
            .or_default()
            .clone();
        let _starting = lock.lock().unwrap_or_else(|e| e.into_inner());
        // Started meanwhile by another connection of the user's.
        if let Some(dir) = self.running(uid) {
            return Ok(dir);
        }
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
                    self.servers
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(
                            uid,
                            UserServer {
                                child,
                                dir: dir.clone(),
                            },
                        );
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

    /// Root's control connection: commands one per frame, answered by the daemon.
    fn operator(&self, conn: UnixStream) {
        if consume_hello(&conn).is_err() {
            return;
        }
        while let Ok(Some(cmd)) = sock::read_frame(&mut &conn, 1 << 16) {
            let cmd = String::from_utf8_lossy(&cmd).trim().to_string();
            self.log(&format!("Cmd:{cmd}"));
            let (ok, text) = self.command(&cmd);
            let mut frame = vec![u8::from(!ok)];
            frame.extend_from_slice(text.as_bytes());
            if sock::write_frame(&mut &conn, &frame).is_err() {
                return;
            }
            if ok && cmd.split_whitespace().next() == Some("quit") {
                self.log("Daemon exited");
                self.pipe.remove(sock::SOCKET_NAME);
                self.pipe.remove(sock::PID_FILE);
                std::process::exit(0);
            }
        }
    }

    fn command(&self, cmd: &str) -> (bool, String) {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        let servers = self.all();
        match words.as_slice() {
            ["get_server_list"] => (
                true,
                servers.iter().map(|r| format!("{}\n", r.pid)).collect(),
            ),
            ["start_server", "-uid", uid] => match uid.parse::<u32>() {
                Ok(u) => match self.server_for(u, primary_gid(u)) {
                    Ok(_) => (true, String::new()),
                    Err(e) => (false, format!("start_server: {e}\n")),
                },
                Err(_) => (false, format!("start_server: '{uid}' is not a uid\n")),
            },
            ["quit", ..] => {
                for r in servers.iter().rev() {
                    let _ = ask(&r.dir, r.uid, cmd);
                }
                let t = Instant::now();
                let limit = match words.as_slice() {
                    ["quit", "-t", s] => s.parse().map_or(10, |s: u64| s.saturating_add(10)),
                    _ => 10,
                };
                while !self.all().is_empty() && t.elapsed() < Duration::from_secs(limit) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                (true, String::new())
            }
            [set, ..] if set.starts_with("set_default_") => {
                {
                    let mut d = self.defaults.lock().unwrap_or_else(|e| e.into_inner());
                    // The last one per setting (and device) holds.
                    let key = |c: &str| {
                        let w: Vec<&str> = c.split_whitespace().collect();
                        w[..w.len().saturating_sub(1)].join(" ")
                    };
                    d.0.retain(|c| key(c) != key(cmd));
                    d.0.push(cmd.to_string());
                    d.1 += 1;
                }
                // Listed after the default is in: a server starting now is not listed
                // yet, and replays it before it is.
                self.each(&self.all(), cmd, false)
            }
            ["ps", ..] => self.each(&servers, cmd, true),
            _ => {
                // A PID the command names: a server's, or a client's of some server.
                let pid = names_a_pid(&words)
                    .then(|| words.iter().skip(1).find_map(|w| w.parse::<u32>().ok()))
                    .flatten();
                match pid {
                    Some(p) => match server_of_pid(&servers, p) {
                        Ok(r) => ask(&r.dir, r.uid, cmd),
                        Err(e) => (false, e),
                    },
                    None => {
                        let mut last = (false, "no omps server runs\n".to_string());
                        for r in &servers {
                            last = ask(&r.dir, r.uid, cmd);
                            if last.0 {
                                break;
                            }
                        }
                        last
                    }
                }
            }
        }
    }

    /// `cmd` sent to every server; their answers together (for `ps`, one header).
    fn each(&self, servers: &[Running], cmd: &str, table: bool) -> (bool, String) {
        let mut ok = servers.is_empty();
        let mut out = String::new();
        let mut last_err = String::new();
        for r in servers {
            match ask(&r.dir, r.uid, cmd) {
                (true, text) => {
                    let skip = usize::from(table && ok && !out.is_empty());
                    for line in text.lines().skip(skip) {
                        out.push_str(line);
                        out.push('\n');
                    }
                    ok = true;
                }
                (false, text) => last_err = text,
            }
        }
        if ok {
            (true, out)
        } else {
            (false, last_err)
        }
    }
}

/// Whether the command's first number is a PID (a server's or a client's), as in MPS's
/// commands that name one; other numbers (a device, a partition's size, a namespace's
/// name) are no one's, and such commands go to every server in turn.
fn names_a_pid(words: &[&str]) -> bool {
    const PID_COMMANDS: &[&str] = &[
        "terminate_client",
        "get_server_status",
        "shutdown_server",
        "get_client_list",
        "get_device_client_list",
        "ps",
        "set_client_qos",
        "get_client_qos",
        "set_active_thread_percentage",
        "get_active_thread_percentage",
        "set_device_pinned_mem_limit",
        "get_device_pinned_mem_limit",
    ];
    words.first().is_some_and(|c| PID_COMMANDS.contains(c))
}

/// The server a command naming `pid` is for: the server with that PID, else the server
/// of the user the process runs as (its effective uid, from /proc: the one its
/// connection's credentials carry, by which the daemon handed it to a server), since a
/// user's clients are served by that user's server alone. Not the first server to answer ok: a user can make
/// their own server say anything, and would take root's commands for others' clients.
fn server_of_pid(servers: &[Running], pid: u32) -> Result<&Running, String> {
    if let Some(r) = servers.iter().find(|r| r.pid == pid) {
        return Ok(r);
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|_| format!("no process {pid}\n"))?;
    // Uid: real, effective, saved, filesystem.
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse::<u32>().ok())
        .ok_or_else(|| format!("cannot read the uid of process {pid}\n"))?;
    servers
        .iter()
        .find(|r| r.uid == uid)
        .ok_or_else(|| format!("process {pid} runs as uid {uid}, which has no omps server\n"))
}

/// One command to `uid`'s server of pipe directory `dir`, as root (its operator).
fn ask(dir: &Path, uid: u32, cmd: &str) -> (bool, String) {
    let asked = dirs::connect_owned(&dir.join(sock::OPERATOR_DIR), sock::OPERATOR_SOCKET, uid)
        .and_then(crate::talk::control_hello)
        .map_err(|e| format!("{}: {e}\n", dir.display()))
        .and_then(|s| crate::talk::ask_on(s, cmd));
    match asked {
        Ok(text) => (true, text),
        Err(text) => (false, text),
    }
}

/// Passes `conn` to `uid`'s server of pipe directory `dir`.
fn hand_over(dir: &Path, uid: u32, conn: &UnixStream) -> std::io::Result<()> {
    let h = dirs::connect_owned(dir, sock::HANDOFF_NAME, uid)?;
    h.set_write_timeout(Some(Duration::from_secs(1)))?;
    sock::send_with_fds(h.as_raw_fd(), b"h", &[conn.as_raw_fd()])
}

/// The kind of connection its hello announces, read without taking it off the socket
/// (the server that gets the connection reads it); None if it does not come in 2 s.
fn peek_kind(s: &UnixStream) -> Option<u32> {
    let mut h = Hello::default();
    let want = std::mem::size_of::<Hello>();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        let mut p = libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 100) };
        // SAFETY: a buffer of `want` bytes; MSG_PEEK leaves them on the socket.
        let n = unsafe {
            libc::recv(
                s.as_raw_fd(),
                bytemuck::bytes_of_mut(&mut h).as_mut_ptr() as *mut libc::c_void,
                want,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n == want as isize {
            return (h.magic == wire::HELLO_MAGIC).then_some(h.kind);
        }
        if n == 0 || p.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            return None;
        }
    }
    None
}

fn consume_hello(s: &UnixStream) -> std::io::Result<()> {
    let mut h = [0u8; std::mem::size_of::<Hello>()];
    (&*s).read_exact(&mut h)
}

/// The primary group of `uid` (its own number where the system does not say).
fn primary_gid(uid: u32) -> u32 {
    // SAFETY: getpwuid returns null or a pointer to a static record, read at once.
    unsafe {
        let pw = libc::getpwuid(uid);
        if pw.is_null() {
            uid
        } else {
            (*pw).pw_gid
        }
    }
}

#[cfg(test)]
mod tests;
