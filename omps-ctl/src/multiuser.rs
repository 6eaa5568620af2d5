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

use crate::daemon::{server_binary, Starting};
use omps_ring::sock;
use omps_ring::wire::{self, Hello};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
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

/// A user's server.
struct UserServer {
    child: Child,
    dir: PathBuf,
}

struct Daemon {
    pipe: PathBuf,
    log: Option<PathBuf>,
    servers: Mutex<HashMap<u32, UserServer>>,
    /// `set_default_*` commands so far, replayed to each server started later.
    defaults: Mutex<Vec<String>>,
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
    let pipe = sock::pipe_directory();
    std::fs::create_dir_all(&pipe).map_err(|e| format!("{}: {e}", pipe.display()))?;
    // Others may reach the socket, not list or change the directory.
    std::fs::set_permissions(&pipe, std::fs::Permissions::from_mode(0o711))
        .map_err(|e| format!("{}: {e}", pipe.display()))?;
    let path = pipe.join(sock::SOCKET_NAME);
    if UnixStream::connect(&path).is_ok() {
        return Err(format!(
            "an omps server already listens on {}",
            path.display()
        ));
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let _ = std::fs::write(
        pipe.join(sock::PID_FILE),
        format!("{}\n", std::process::id()),
    );
    let d = Arc::new(Daemon {
        pipe,
        log: sock::log_directory(),
        servers: Default::default(),
        defaults: Default::default(),
    });
    d.log("Starting omps control daemon (one server per user)");
    // Root's server comes with the daemon: the operator's commands go to it.
    d.server_for(0, 0)?;
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let d = d.clone();
        std::thread::spawn(move || d.serve_connection(conn));
    }
    Ok(())
}

impl Daemon {
    fn log(&self, line: &str) {
        let Some(dir) = &self.log else { return };
        let _ = std::fs::create_dir_all(dir);
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("control.log"))
        {
            let _ = writeln!(f, "[omps-ctl daemon {}] {line}", std::process::id());
        }
    }

    fn serve_connection(&self, conn: UnixStream) {
        let Ok(libc::ucred { uid, gid, .. }) = sock::peer_cred(conn.as_raw_fd()) else {
            return;
        };
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
                if let Err(e) = hand_over(&dir, &conn) {
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

    /// The pipe directory of `uid`'s server, if it runs.
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
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = servers.get(&uid) {
            return Ok(s.dir.clone());
        }
        let dir = self.pipe.join(format!("u{uid}"));
        private_dir(&dir, uid, gid)?;
        let mut cmd = Command::new(server_binary());
        cmd.env("OMPS_PIPE_DIRECTORY", &dir)
            .env_remove("CUDA_MPS_PIPE_DIRECTORY")
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(log) = &self.log {
            let own = log.join(format!("u{uid}"));
            private_dir(&own, uid, gid)?;
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
        let socket = dir.join(sock::SOCKET_NAME);
        let what = format!("omps-server for uid {uid}");
        let child = Starting {
            what: &what,
            program: &server_binary(),
            hint: "",
            limit: Duration::from_secs(60),
            kill_late: true,
        }
        .run(cmd, || UnixStream::connect(&socket).is_ok())?;
        self.log(&format!("Server {} started for uid {uid}", child.id()));
        for c in self
            .defaults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = ask(&dir, c);
        }
        servers.insert(
            uid,
            UserServer {
                child,
                dir: dir.clone(),
            },
        );
        Ok(dir)
    }

    /// (server PID, pipe directory) of every running server, root's first.
    fn all(&self) -> Vec<(u32, PathBuf)> {
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        servers.retain(|_, s| matches!(s.child.try_wait(), Ok(None)));
        let mut v: Vec<(u32, u32, PathBuf)> = servers
            .iter()
            .map(|(&uid, s)| (uid, s.child.id(), s.dir.clone()))
            .collect();
        v.sort();
        v.into_iter().map(|(_, pid, dir)| (pid, dir)).collect()
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
                let _ = std::fs::remove_file(self.pipe.join(sock::SOCKET_NAME));
                let _ = std::fs::remove_file(self.pipe.join(sock::PID_FILE));
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
                servers.iter().map(|(pid, _)| format!("{pid}\n")).collect(),
            ),
            ["start_server", "-uid", uid] => match uid.parse::<u32>() {
                Ok(u) => match self.server_for(u, primary_gid(u)) {
                    Ok(_) => (true, String::new()),
                    Err(e) => (false, format!("start_server: {e}\n")),
                },
                Err(_) => (false, format!("start_server: '{uid}' is not a uid\n")),
            },
            ["quit", ..] => {
                for (_, dir) in servers.iter().rev() {
                    let _ = ask(dir, cmd);
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
                    d.retain(|c| key(c) != key(cmd));
                    d.push(cmd.to_string());
                }
                self.each(&servers, cmd, false)
            }
            ["ps", ..] => self.each(&servers, cmd, true),
            _ => {
                // A PID the command names: a server's, or a client's of some server.
                let pid = words.iter().skip(1).find_map(|w| w.parse::<u32>().ok());
                if let Some((_, dir)) = pid.and_then(|p| servers.iter().find(|(s, _)| *s == p)) {
                    return ask(dir, cmd);
                }
                let mut last = (false, "no omps server runs\n".to_string());
                for (_, dir) in &servers {
                    last = ask(dir, cmd);
                    if last.0 {
                        break;
                    }
                }
                last
            }
        }
    }

    /// `cmd` sent to every server; their answers together (for `ps`, one header).
    fn each(&self, servers: &[(u32, PathBuf)], cmd: &str, table: bool) -> (bool, String) {
        let mut ok = servers.is_empty();
        let mut out = String::new();
        let mut last_err = String::new();
        for (_, dir) in servers {
            match ask(dir, cmd) {
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

/// One command to the server of pipe directory `dir`, as root (its operator).
fn ask(dir: &Path, cmd: &str) -> (bool, String) {
    match crate::talk::ask_at(dir, cmd) {
        Ok(text) => (true, text),
        Err(text) => (false, text),
    }
}

/// Passes `conn` to the server of pipe directory `dir`.
fn hand_over(dir: &Path, conn: &UnixStream) -> std::io::Result<()> {
    let h = UnixStream::connect(dir.join(sock::HANDOFF_NAME))?;
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

/// A directory only `uid` may open.
fn private_dir(dir: &Path, uid: u32, gid: u32) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| format!("{}: {e}", dir.display()))
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
