//! Talking to a running server: one control connection, commands one per frame.

use omps_ring::sock;
use omps_ring::wire::{self, Hello};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

pub fn connect() -> Result<UnixStream, String> {
    let dir = sock::pipe_directory();
    connect_at(&dir).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            // Something listens there but may not be talked to: "no server" would mislead.
            format!("pipe directory {}: {e}", dir.display())
        } else {
            format!(
                "no omps server is running for pipe directory {} ({e}); start one with `omps-ctl -d`",
                dir.display()
            )
        }
    })
}

/// A control connection to the server of pipe directory `dir`, through the operator's
/// socket (a server's clients' socket refuses control commands). A pipe directory with
/// no operator directory is the multi-user daemon's: it takes every user's commands on
/// its one socket and sorts them by the peer's uid (root's to root's server, a user's to
/// that user's), so that socket is the way in there. A server neither of this user nor
/// root is refused (PermissionDenied) before any command reaches it; root, whom every
/// server takes as an operator, may talk to any.
pub fn connect_at(dir: &std::path::Path) -> std::io::Result<UnixStream> {
    // SAFETY: geteuid has no preconditions.
    connect_as(dir, unsafe { libc::geteuid() } == 0)
}

/// [`connect_at`] for a caller that is root or not.
fn connect_as(dir: &std::path::Path, root: bool) -> std::io::Result<UnixStream> {
    let connect = |path: &std::path::Path| {
        if root {
            UnixStream::connect(path)
        } else {
            sock::connect_checked(path)
        }
    };
    match connect(&sock::operator_socket_in(dir)) {
        Ok(s) => control_hello(s),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && !dir.join(sock::OPERATOR_DIR).exists() =>
        {
            control_hello(connect(&dir.join(sock::SOCKET_NAME))?)
        }
        Err(e) => Err(e),
    }
}

/// `s`, a connection to a server, made a control connection.
pub fn control_hello(s: UnixStream) -> std::io::Result<UnixStream> {
    let hello = Hello {
        magic: wire::HELLO_MAGIC,
        version: wire::PROTOCOL_VERSION,
        kind: wire::kind::CONTROL,
    };
    (&s).write_all(bytemuck::bytes_of(&hello))?;
    Ok(s)
}

/// Whether a server answers on the pipe directory's socket, or its PID file names a live
/// omps-server (one that has not bound its socket yet; a restart after a GPU fault keeps
/// the socket, and the server beside which a second one would fail on its lock anyway).
pub fn server_running() -> bool {
    connect().is_ok() || restarting()
}

fn restarting() -> bool {
    let pid_file = sock::pipe_directory().join(sock::PID_FILE);
    let Some(pid) = std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
    else {
        return false;
    };
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .is_ok_and(|exe| exe.file_name().is_some_and(|n| n == "omps-server"))
}

/// Sends each command in turn; prints replies. Fails if any command failed. After a
/// `quit`, waits for the server to be gone (a script that quits and starts again finds
/// the socket free).
pub fn send(commands: &[String]) -> Result<bool, String> {
    let s = connect()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut all_ok = true;
    let mut quit_wait = None;
    for c in commands.iter().filter(|c| !c.trim().is_empty()) {
        sock::write_frame(&mut &s, c.as_bytes()).map_err(|e| format!("sending '{c}': {e}"))?;
        let reply = sock::read_frame(&mut &s, 16 << 20)
            .map_err(|e| format!("reading the reply to '{c}': {e}"))?
            .ok_or_else(|| format!("the server closed the connection after '{c}'"))?;
        let (status, text) = reply.split_first().ok_or("empty reply")?;
        let text = String::from_utf8_lossy(text);
        if *status == 0 {
            print!("{text}");
            quit_wait = quit_wait.or(quit_patience(c));
        } else {
            eprint!("omps-ctl: {text}");
            all_ok = false;
        }
    }
    drop(s);
    if let Some(p) = quit_wait {
        let t = Instant::now();
        while server_running() && t.elapsed() < p {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(all_ok)
}

/// One command's answer (its text), or why it failed.
pub fn ask(cmd: &str) -> Result<String, String> {
    ask_on(connect()?, cmd)
}

pub fn ask_on(s: UnixStream, cmd: &str) -> Result<String, String> {
    ask_within(s, cmd, Duration::from_secs(10))
}

/// Reads from a socket until one deadline for the whole exchange: a server that answers a
/// byte at a time cannot hold the asker past it (root's daemon asks users' servers).
struct Until<'a> {
    s: &'a UnixStream,
    end: Instant,
}

impl std::io::Read for Until<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.s.set_read_timeout(Some(left))?;
        (&mut &*self.s).read(buf)
    }
}

/// As [`ask_on`], the whole exchange within `limit`.
pub fn ask_within(s: UnixStream, cmd: &str, limit: Duration) -> Result<String, String> {
    ask_capped(s, cmd, limit, 16 << 20)
}

/// As [`ask_within`], an answer longer than `max` bytes failing.
pub fn ask_capped(s: UnixStream, cmd: &str, limit: Duration, max: usize) -> Result<String, String> {
    let end = Instant::now() + limit;
    s.set_write_timeout(Some(limit)).ok();
    sock::write_frame(&mut &s, cmd.as_bytes()).map_err(|e| format!("sending '{cmd}': {e}"))?;
    let reply = sock::read_frame(&mut Until { s: &s, end }, max)
        .map_err(|e| format!("reading the reply to '{cmd}': {e}"))?
        .ok_or_else(|| format!("the server closed the connection after '{cmd}'"))?;
    let (status, text) = reply.split_first().ok_or("empty reply")?;
    let text = String::from_utf8_lossy(text).into_owned();
    match status {
        0 => Ok(text),
        _ => Err(text),
    }
}

/// How long to wait for the server to go after command `c` (None: it stays).
fn quit_patience(c: &str) -> Option<Duration> {
    match c.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["quit"] => Some(Duration::from_secs(10)),
        ["quit", "-t", t] => t
            .parse::<u64>()
            .ok()
            .map(|t| Duration::from_secs(t.saturating_add(10).min(3600))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn listening_dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("omps-talk-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn first_byte_kind(l: &std::os::unix::net::UnixListener) -> u32 {
        let (c, _) = l.accept().unwrap();
        let mut h = [0u8; std::mem::size_of::<Hello>()];
        (&c).read_exact(&mut h).unwrap();
        bytemuck::pod_read_unaligned::<Hello>(&h).kind
    }

    #[test]
    fn the_multi_user_daemons_socket_takes_commands_where_no_operator_directory_is() {
        // Found on the GPU: `omps-ctl -d` with OMPS_MULTIUSER=1 waited 60 s for a daemon
        // that listened all along, on the one socket it has.
        let d = listening_dir("daemon");
        let l = std::os::unix::net::UnixListener::bind(d.join(sock::SOCKET_NAME)).unwrap();
        let s = connect_at(&d).expect("the daemon's socket is the way in");
        assert_eq!(first_byte_kind(&l), wire::kind::CONTROL);
        drop(s);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_servers_clients_socket_is_never_taken_for_its_operators() {
        // A server has an operator directory: its operator socket missing (gone, or not
        // yet bound) is an error, never a control connection on the clients' socket.
        let d = listening_dir("server");
        std::fs::create_dir(d.join(sock::OPERATOR_DIR)).unwrap();
        let _clients = std::os::unix::net::UnixListener::bind(d.join(sock::SOCKET_NAME)).unwrap();
        let e = connect_at(&d).expect_err("no operator socket");
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        let op = std::os::unix::net::UnixListener::bind(sock::operator_socket_in(&d)).unwrap();
        let s = connect_at(&d).expect("the operator socket");
        assert_eq!(first_byte_kind(&op), wire::kind::CONTROL);
        drop(s);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_socket_of_another_uid_gets_no_command() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: only root can listen as another uid");
            return;
        }
        // Another user made the pipe directory first (no operator directory: it passes
        // for the multi-user daemon's) and listens in it.
        let d = listening_dir("impostor");
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let path = d.join(sock::SOCKET_NAME);
        let _l = match sock::listen_as_uid(&path, 65534) {
            Ok(l) => l,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                eprintln!("skipped: cannot take another uid here ({e})");
                return;
            }
            Err(e) => panic!("listening as uid 65534: {e}"),
        };
        let e = connect_as(&d, false).expect_err("another user's socket");
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        let why = e.to_string();
        assert!(why.contains(&path.display().to_string()), "{why}");
        assert!(why.contains("uid 65534"), "{why}");
        // Root operates every user's server.
        assert!(connect_as(&d, true).is_ok(), "root refused");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_server_that_answers_a_byte_at_a_time_holds_no_one_past_the_deadline() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let trickle = std::thread::spawn(move || {
            let mut cmd = [0u8; 64];
            let _ = (&theirs).read(&mut cmd);
            // A frame claiming 1 MiB, then a byte every 100 ms.
            let _ = (&theirs).write_all(&(1u32 << 20).to_le_bytes());
            for _ in 0..40 {
                if (&theirs).write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let t = Instant::now();
        let r = ask_within(ours, "ps", Duration::from_millis(500));
        assert!(r.is_err(), "no whole answer came");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "held {:?} by a trickling server",
            t.elapsed()
        );
        trickle.join().unwrap();
    }
}
