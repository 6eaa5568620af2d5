//! The server's listening sockets and the files it owns in the pipe directory.
//!
//! One server at most owns a pipe directory: it holds an exclusive lock on `omps.lock`
//! there for as long as it lives, through its restarts (the lock's descriptor goes
//! through the exec with the sockets). A second server started beside it fails before it
//! touches anything, and a server removes only the files it made itself (the socket and
//! handoff socket it bound, a PID file that names it), so no server can take away a live
//! one's socket. Once made, the sockets live until the server quits: a restart passes
//! them to the new process ([`Sockets::inherited`]), so the socket file is never gone and
//! never bound again while a faulted server starts itself again.
//!
//! Besides the clients' socket the server listens on the operator's, in `operator/`, a
//! directory of its own (0700) that a container mount of the clients' socket or of a
//! namespace's directory leaves out, and on one socket per namespace
//! (crate::control::namespace); those go through a restart the same way.

use omps_ring::sock;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The lock file of a pipe directory (MPS's control daemon keeps `control_lock`).
pub const LOCK_NAME: &str = "omps.lock";
/// Where a restarting server tells its next image which descriptors it keeps open:
/// "listener,handoff,lock,operator[,namespace...]" (handoff -1 when it has none). The new
/// image removes it.
pub const FDS_VAR: &str = "OMPS_RESTART_FDS";

/// The pipe directory's lock, held: this process may make the sockets there.
#[derive(Debug)]
pub struct Locked {
    dir: PathBuf,
    lock: OwnedFd,
}

/// A server's sockets, its lock, and what it may remove when it ends.
#[derive(Debug)]
pub struct Sockets {
    pub listener: UnixListener,
    /// Connections a control daemon hands over (OMPS_MULTIUSER); None when the pipe
    /// directory's path leaves no room for its name.
    pub handoff: Option<UnixListener>,
    /// The operator's socket: control commands are taken here only.
    pub operator: UnixListener,
    /// Namespaces' sockets a restart kept open (crate::control::namespace takes them); empty at a
    /// first start.
    pub namespaces: Vec<UnixListener>,
    lock: OwnedFd,
    pub files: OwnFiles,
}

/// The files a server made, by identity, so that it removes those and no others.
#[derive(Debug, Clone)]
pub struct OwnFiles {
    dir: PathBuf,
    socket: Option<(u64, u64)>,
    handoff: Option<(u64, u64)>,
    operator: Option<(u64, u64)>,
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

impl OwnFiles {
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join(sock::SOCKET_NAME)
    }

    /// Removes the sockets this server bound, if they are still the ones it bound, and
    /// the PID file if it still names this process.
    pub fn remove(&self) {
        for (path, id) in [
            (self.dir.join(sock::SOCKET_NAME), self.socket),
            (self.dir.join(sock::HANDOFF_NAME), self.handoff),
            (sock::operator_socket_in(&self.dir), self.operator),
        ] {
            if id.is_some() && identity(&path) == id {
                let _ = std::fs::remove_file(path);
            }
        }
        let pid_file = self.dir.join(sock::PID_FILE);
        let ours = std::fs::read_to_string(&pid_file)
            .is_ok_and(|t| t.trim().parse::<u32>().ok() == Some(std::process::id()));
        if ours {
            let _ = std::fs::remove_file(pid_file);
        }
    }
}

/// Creates the pipe directory (0700, ours) and takes its lock. Another server's lock
/// fails at once while that server answers on the socket; a lock held by a server that
/// does not answer (one quitting, or opening its GPUs) is waited for up to 2 s.
pub fn lock(dir: &Path) -> io::Result<Locked> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let md = std::fs::metadata(dir)?;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if md.uid() != uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "pipe directory {} belongs to uid {}, not {uid}",
                dir.display(),
                md.uid()
            ),
        ));
    }
    if md.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join(LOCK_NAME))?;
    let lock = OwnedFd::from(file);
    let socket = dir.join(sock::SOCKET_NAME);
    let t = Instant::now();
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Locked {
                dir: dir.to_path_buf(),
                lock,
            });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(e);
        }
        if UnixStream::connect(&socket).is_ok() || t.elapsed() > Duration::from_secs(2) {
            let pid = std::fs::read_to_string(dir.join(sock::PID_FILE)).unwrap_or_default();
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "an omps server (PID {}) already runs on {}",
                    pid.trim(),
                    dir.display()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Locked {
    /// Binds the socket and the handoff socket. Under the lock no other server owns
    /// either path, so what is there is left from one that died; a socket that answers
    /// anyway belongs to a server that takes no lock (an older omps), and is left alone.
    pub fn bind(self) -> io::Result<Sockets> {
        let path = self.dir.join(sock::SOCKET_NAME);
        if UnixStream::connect(&path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("an omps server already listens on {}", path.display()),
            ));
        }
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let socket = identity(&path);
        let hpath = self.dir.join(sock::HANDOFF_NAME);
        let _ = std::fs::remove_file(&hpath);
        let handoff = UnixListener::bind(&hpath)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .inspect_err(|e| tracing::warn!("no handoff socket: {e}"))
            .ok();
        let handoff_id = handoff.as_ref().and_then(|_| identity(&hpath));
        let opath = sock::operator_socket_in(&self.dir);
        private_dir(&self.dir.join(sock::OPERATOR_DIR))?;
        // The MPS protocol omps-ctl started it with (`-p 3`, issue 26): later omps-ctl
        // invocations read it here and follow it, as MPS's follow their daemon's.
        let protocol = match std::env::var("OMPS_PROTOCOL").as_deref() {
            Ok("3") => "3",
            _ => "2",
        };
        if let Err(e) = std::fs::write(
            self.dir.join(sock::OPERATOR_DIR).join("protocol"),
            format!("{protocol}\n"),
        ) {
            tracing::warn!("cannot record the protocol: {e}");
        }
        let _ = std::fs::remove_file(&opath);
        let operator = UnixListener::bind(&opath).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("the operator's socket {}: {e}", opath.display()),
            )
        })?;
        operator.set_nonblocking(true)?;
        Ok(Sockets {
            listener,
            handoff,
            operator,
            namespaces: Vec::new(),
            lock: self.lock,
            files: OwnFiles {
                dir: self.dir,
                socket,
                handoff: handoff_id,
                operator: identity(&opath),
            },
        })
    }
}

/// Makes `dir` a directory of this user's alone (0700), or checks that it is one: not a
/// link, not another user's. The operator's directory and namespaces' are made so.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let md = std::fs::symlink_metadata(dir)?;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if !md.is_dir() || md.uid() != uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a directory of uid {uid}", dir.display()),
        ));
    }
    if md.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Whether `fd` is an open listening Unix socket bound to `path`.
fn listens_on(fd: RawFd, path: &Path) -> bool {
    bound_path(fd).is_some_and(|p| p == path)
}

/// The path an open listening Unix socket is bound to.
pub fn bound_path(fd: RawFd) -> Option<PathBuf> {
    // SAFETY: sockaddr_un is plain data; getsockname writes at most `len` bytes into it.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: as above; a closed or foreign descriptor just fails.
    let named =
        unsafe { libc::getsockname(fd, &mut addr as *mut _ as *mut libc::sockaddr, &mut len) };
    let mut on = 0i32;
    let mut olen = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: SO_ACCEPTCONN writes one int into `on`.
    let got = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            &mut on as *mut i32 as *mut libc::c_void,
            &mut olen,
        )
    };
    if named != 0 || got != 0 || on == 0 || addr.sun_family != libc::AF_UNIX as libc::sa_family_t {
        return None;
    }
    let bytes: Vec<u8> = addr
        .sun_path
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    use std::os::unix::ffi::OsStringExt;
    Some(PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

/// Whether `fd` is open on the lock file of `dir`.
fn is_lock_of(fd: RawFd, dir: &Path) -> bool {
    // SAFETY: stat is plain data; fstat writes it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return false;
    }
    identity(&dir.join(LOCK_NAME)) == Some((st.st_dev, st.st_ino))
}

impl Sockets {
    /// The sockets and lock a restarting server left open for this process (FDS_VAR),
    /// checked to be what they say; None at a first start. The variable is removed, so
    /// that nothing this process starts sees it.
    pub fn inherited(dir: &Path) -> Option<io::Result<Sockets>> {
        let text = std::env::var(FDS_VAR).ok()?;
        std::env::remove_var(FDS_VAR);
        let fds: Vec<RawFd> = text.split(',').filter_map(|f| f.parse().ok()).collect();
        let [l, h, k, o, ref ns @ ..] = fds[..] else {
            return Some(Err(io::Error::other(format!(
                "{FDS_VAR}={text}: not four numbers or more"
            ))));
        };
        let path = dir.join(sock::SOCKET_NAME);
        let hpath = dir.join(sock::HANDOFF_NAME);
        let opath = sock::operator_socket_in(dir);
        if l < 3
            || k < 3
            || o < 3
            || !listens_on(l, &path)
            || !is_lock_of(k, dir)
            || !listens_on(o, &opath)
        {
            return Some(Err(io::Error::other(format!(
                "{FDS_VAR}={text}: not the sockets and lock of {}",
                dir.display()
            ))));
        }
        let h = (h >= 3 && listens_on(h, &hpath)).then_some(h);
        let mut all = fds.clone();
        all.sort_unstable();
        all.retain(|&fd| fd >= 0);
        if all.windows(2).any(|w| w[0] == w[1]) {
            return Some(Err(io::Error::other(format!(
                "{FDS_VAR}={text}: a descriptor listed twice"
            ))));
        }
        // A namespace's socket is `PIPE/<server>/<namespace>/control` (`omps` the server of
        // namespaces made by name alone); which namespace it is, crate::control::namespace
        // reads from its path.
        let ns: Vec<RawFd> = ns
            .iter()
            .copied()
            .filter(|&fd| {
                fd >= 3
                    && bound_path(fd).is_some_and(|p| {
                        let server = p.parent().and_then(Path::parent);
                        server.and_then(Path::parent) == Some(dir)
                            && server.and_then(Path::file_name) != Some(sock::OPERATOR_DIR.as_ref())
                    })
            })
            .collect();
        for fd in [Some(l), h, Some(k), Some(o)]
            .into_iter()
            .flatten()
            .chain(ns.iter().copied())
        {
            // SAFETY: F_SETFD sets the close-on-exec flag of a descriptor checked above.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
        // SAFETY: the previous image of this process left these descriptors open for this
        // one alone (checked above to be its sockets and lock, each listed once by it);
        // nothing else in this process holds them.
        let (listener, handoff, lock, operator, namespaces) = unsafe {
            (
                UnixListener::from_raw_fd(l),
                h.map(|h| UnixListener::from_raw_fd(h)),
                OwnedFd::from_raw_fd(k),
                UnixListener::from_raw_fd(o),
                ns.iter().map(|&fd| UnixListener::from_raw_fd(fd)).collect(),
            )
        };
        let handoff_id = handoff.as_ref().and_then(|_| identity(&hpath));
        Some(Ok(Sockets {
            listener,
            handoff,
            operator,
            namespaces,
            lock,
            files: OwnFiles {
                dir: dir.to_path_buf(),
                socket: identity(&path),
                handoff: handoff_id,
                operator: identity(&opath),
            },
        }))
    }

    /// The descriptors to keep open across an exec, as FDS_VAR says them; clears their
    /// close-on-exec flags.
    pub fn keep_across_exec(&self) -> String {
        let h = self.handoff.as_ref().map_or(-1, |h| h.as_raw_fd());
        let mut fds = vec![
            self.listener.as_raw_fd(),
            h,
            self.lock.as_raw_fd(),
            self.operator.as_raw_fd(),
        ];
        fds.extend(self.namespaces.iter().map(|n| n.as_raw_fd()));
        for &fd in fds.iter().filter(|&&fd| fd >= 0) {
            // SAFETY: F_SETFD on a descriptor this struct owns changes only its flag.
            unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
        }
        fds.iter()
            .map(|fd| fd.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Ends this server's ownership: its files go, then its lock.
    pub fn release(self) {
        self.files.remove();
        drop(self);
    }
}

/// How long a control daemon has, once connected to the handoff socket, to pass its
/// connection (it writes its one message right after connecting).
pub const HANDOFF_TIME: Duration = Duration::from_millis(200);

/// A connection to the handoff socket whose message has not come yet. Its socket is
/// non-blocking and polled with the others: a daemon (or anyone of the server's user)
/// that connects and stays silent costs the control thread nothing, and is dropped at
/// its deadline.
struct Handoff {
    conn: UnixStream,
    pid: i32,
    deadline: Instant,
}

/// What a handoff connection's message amounted to.
enum Passed {
    NotYet,
    Connection(UnixStream),
    Refused,
}

impl Handoff {
    /// The daemon's message, if it has come: one byte and one descriptor.
    fn read(&self) -> Passed {
        let mut byte = [0u8; 1];
        match sock::recv_with_fds(self.conn.as_raw_fd(), &mut byte) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Passed::NotYet,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Passed::NotYet,
            Ok((1, fds)) if fds.len() == 1 => {
                let fd = fds.into_iter().next().expect("one descriptor");
                let stream = UnixStream::from(fd);
                match stream.set_nonblocking(false) {
                    Ok(()) => Passed::Connection(stream),
                    Err(e) => {
                        tracing::warn!(daemon = self.pid, "handed-over connection refused: {e}");
                        Passed::Refused
                    }
                }
            }
            Ok((0, _)) => Passed::Refused,
            Ok(_) => {
                tracing::warn!(daemon = self.pid, "a handoff without one connection");
                Passed::Refused
            }
            Err(e) => {
                tracing::warn!(daemon = self.pid, "handoff: {e}");
                Passed::Refused
            }
        }
    }
}

/// Connections to the handoff socket waiting for their message, for a poll loop: the
/// control thread's, and the restart doorman's (crate::control::restart).
#[derive(Default)]
pub struct Handoffs(Vec<Handoff>);

impl Handoffs {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// One pollfd per waiting connection, in order ([`Handoffs::serve`] takes their
    /// results in the same order).
    pub fn pollfds(&self) -> impl Iterator<Item = libc::pollfd> + '_ {
        self.0.iter().map(|h| libc::pollfd {
            fd: h.conn.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        })
    }

    /// Accepts a connection on the handoff socket, without waiting for its message. Only
    /// root's daemon (OMPS_MULTIUSER) may pass one: a connection passed is an operator's
    /// (crate::control::peers::Origin::Handoff), and a process of the server's user `uid` that
    /// reaches this socket need not reach the operator's; `room`: whether the caller takes
    /// another connection in progress now (else it is closed at once).
    pub fn accept(&mut self, handoff: &UnixListener, uid: u32, room: bool) -> io::Result<()> {
        let conn = match handoff.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        };
        let from = match sock::peer_cred(conn.as_raw_fd()) {
            Ok(c) if c.uid == 0 => c,
            Ok(c) => {
                tracing::warn!(
                    uid = c.uid,
                    server_uid = uid,
                    "a handoff not from root's daemon refused"
                );
                return Ok(());
            }
            Err(e) => {
                tracing::warn!("handoff: {e}");
                return Ok(());
            }
        };
        if !room {
            tracing::warn!(
                daemon = from.pid,
                "a handoff refused: too many connections in progress (OMPS_MAX_HANDSHAKES)"
            );
            return Ok(());
        }
        conn.set_nonblocking(true)?;
        self.0.push(Handoff {
            conn,
            pid: from.pid,
            deadline: Instant::now() + HANDOFF_TIME,
        });
        Ok(())
    }

    /// The connections passed by those that were `ready` (by position, as
    /// [`Handoffs::pollfds`] listed them); drops the ones done, refused or past their
    /// deadline.
    pub fn serve(&mut self, ready: &[bool]) -> Vec<UnixStream> {
        let now = Instant::now();
        let mut passed = Vec::new();
        let mut ready = ready.iter();
        self.0.retain(|h| {
            if !ready.next().copied().unwrap_or(false) {
                if h.deadline < now {
                    tracing::warn!(
                        daemon = h.pid,
                        "a handoff that passed nothing in time dropped"
                    );
                    return false;
                }
                return true;
            }
            match h.read() {
                Passed::NotYet => h.deadline >= now,
                Passed::Connection(s) => {
                    passed.push(s);
                    false
                }
                Passed::Refused => false,
            }
        });
        passed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_server_takes_nothing_and_a_server_removes_only_its_own_files() {
        let dir = std::env::temp_dir().join(format!("omps-listen-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join(sock::SOCKET_NAME);
        let first = lock(&dir).unwrap().bind().unwrap();
        let pid_file = dir.join(sock::PID_FILE);
        std::fs::write(&pid_file, format!("{}\n", std::process::id())).unwrap();
        let before = identity(&path);
        let e = lock(&dir).expect_err("a second server beside a live one");
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        assert_eq!(identity(&path), before, "the live socket was touched");
        assert!(pid_file.exists());
        // Someone else's socket now stands at the path: the first server leaves it.
        std::fs::remove_file(&path).unwrap();
        let other = UnixListener::bind(&path).unwrap();
        first.release();
        assert!(
            path.exists(),
            "a socket the server did not bind was removed"
        );
        assert!(!pid_file.exists(), "its own PID file stayed");
        assert!(
            !dir.join(sock::HANDOFF_NAME).exists(),
            "its handoff socket stayed"
        );
        drop(other);
        // Its lock went with it: the next server starts (and replaces the dead socket).
        let next = lock(&dir).unwrap().bind().unwrap();
        assert!(UnixStream::connect(&path).is_ok());
        next.release();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
