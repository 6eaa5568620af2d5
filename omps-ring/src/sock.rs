//! The server's Unix sockets: where they live, and messages that carry file descriptors.
//!
//! Clients and the operator are different principals (docs/design.md, "Operator and client
//! principals"): `PIPE/omps.sock` takes clients only; control commands go through
//! `PIPE/operator/control`, in a directory of the operator's alone that a container mount
//! of the clients' socket leaves out; and each namespace the operator makes is a client
//! socket of its own, `PIPE/<server>/<namespace>/control`, laid out as MPS v3 lays them.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

pub const SOCKET_NAME: &str = "omps.sock";
/// The operator's directory under the pipe directory (0700) and its socket there.
pub const OPERATOR_DIR: &str = "operator";
pub const OPERATOR_SOCKET: &str = "control";
/// The `<server>` directory of MPS v3's layout, which holds one directory per namespace.
pub const NAMESPACE_SERVER: &str = "omps";
/// A namespace's client socket in its directory (MPS v3 calls each `control`).
pub const NAMESPACE_SOCKET: &str = "control";
/// Where a server takes connections a control daemon accepted for it (SCM_RIGHTS).
pub const HANDOFF_NAME: &str = "omps-handoff.sock";

/// The PID file MPS's control daemon keeps in the pipe directory (the server's PID).
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
pub const DEFAULT_PIPE_DIRECTORY: &str = "/tmp/omps-pipe";
/// Most descriptors one message carries: a segment and a doorbell per GPU.
pub const MAX_FDS: usize = 1 + crate::segment::MAX_DEVICES;

fn env_dir(ours: &str, mps: &str) -> Option<PathBuf> {
    [ours, mps]
        .iter()
        .filter_map(std::env::var_os)
        .find(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `OMPS_PIPE_DIRECTORY`, else `CUDA_MPS_PIPE_DIRECTORY`, else `/tmp/omps-pipe`.
pub fn pipe_directory() -> PathBuf {
    env_dir("OMPS_PIPE_DIRECTORY", "CUDA_MPS_PIPE_DIRECTORY")
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PIPE_DIRECTORY))
}

/// `OMPS_LOG_DIRECTORY`, else `CUDA_MPS_LOG_DIRECTORY`.
pub fn log_directory() -> Option<PathBuf> {
    env_dir("OMPS_LOG_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
}

/// A log's size before it is moved to `NAME.1` (the server's server.log and control.log,
/// the root daemon's control.log): OMPS_LOG_MAX_BYTES (bytes, at least 4096; 0: no cap),
/// 64 MiB if unset.
pub fn log_max_bytes() -> u64 {
    match std::env::var("OMPS_LOG_MAX_BYTES")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        Some(0) => 0,
        Some(n) => n.max(4096),
        None => 64 << 20,
    }
}

/// The client socket a program connects to: the pipe directory's `omps.sock`, or, where
/// the pipe directory is a namespace's (a container that mounts only that directory), its
/// `control` socket.
pub fn socket_path() -> PathBuf {
    client_socket_in(&pipe_directory())
}

/// [`socket_path`] for pipe directory `dir`. An MPS v3 server's directory
/// (`PIPE/<server>`, holding a directory per namespace) routes to that server's `default`
/// namespace, as v3's `<server>/control` does.
pub fn client_socket_in(dir: &std::path::Path) -> PathBuf {
    use std::os::unix::fs::FileTypeExt;
    let main = dir.join(SOCKET_NAME);
    let ns = dir.join(NAMESPACE_SOCKET);
    let server_default = dir.join("default").join(NAMESPACE_SOCKET);
    let is_socket =
        |p: &std::path::Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket());
    if is_socket(&main) {
        main
    } else if is_socket(&ns) {
        ns
    } else if is_socket(&server_default) {
        server_default
    } else {
        main
    }
}

/// The operator's socket of pipe directory `dir` (omps-ctl's).
pub fn operator_socket_in(dir: &std::path::Path) -> PathBuf {
    dir.join(OPERATOR_DIR).join(OPERATOR_SOCKET)
}

/// The directory of namespace `name` of pipe directory `dir`: `omps/NAME` for a name of
/// one component (the namespaces of omps's own server), `SERVER/NAMESPACE` for an MPS v3
/// name (`PIPE/<server>/<namespace>/control`, issue 26). The server checks names before
/// any reaches here (crate::control::namespace in omps-server).
pub fn namespace_dir_in(dir: &std::path::Path, name: &str) -> PathBuf {
    // Plain components only, whatever a caller passes: never above or outside `dir`.
    let parts: Vec<&str> = name
        .split('/')
        .filter(|c| !c.is_empty() && *c != "." && *c != "..")
        .collect();
    match parts.as_slice() {
        [one] => dir.join(NAMESPACE_SERVER).join(one),
        more => more.iter().fold(dir.to_path_buf(), |p, c| p.join(c)),
    }
}

/// Who is at the other end of a Unix socket, as it connected (SO_PEERCRED).
pub fn peer_cred(sock: RawFd) -> io::Result<libc::ucred> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `c`, a valid ucred.
    let r = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut c as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(c)
}

/// Whether a client or operator of uid `mine` may talk to a server listening as uid
/// `peer`: its own user's server, or root's multi-user daemon. Anyone else there is an
/// impostor (another user can make the default pipe directory in world-writable /tmp
/// before the server does), who would get the client's segment traffic and pinned memory,
/// or the operator's commands.
pub fn server_uid_acceptable(peer: u32, mine: u32) -> bool {
    peer == mine || peer == 0
}

/// Refuses `s`, a connection to the server socket `path`, unless whoever listens there is
/// [`server_uid_acceptable`] (SO_PEERCRED names the listener's uid as it listened).
pub fn check_server_peer(s: &UnixStream, path: &Path) -> io::Result<()> {
    let peer = peer_cred(s.as_raw_fd())?.uid;
    // SAFETY: geteuid has no preconditions.
    let mine = unsafe { libc::geteuid() };
    if server_uid_acceptable(peer, mine) {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "the server at {} runs as uid {peer}, expected uid {mine} (this user) or 0 (root); \
             refusing to talk to it",
            path.display()
        ),
    ))
}

/// A connection to the server socket `path`, checked with [`check_server_peer`].
pub fn connect_checked(path: &Path) -> io::Result<UnixStream> {
    let s = UnixStream::connect(path)?;
    check_server_peer(&s, path)?;
    Ok(s)
}

/// For tests run as root: a listener at `path` that connections see as uid `uid`'s
/// (another user's server). `uid` must be able to create `path`.
#[doc(hidden)]
pub fn listen_as_uid(path: &Path, uid: u32) -> io::Result<UnixListener> {
    let path = path.to_owned();
    std::thread::spawn(move || {
        // The raw syscall changes this thread's credentials alone (glibc's setresuid
        // would change every thread's, the test harness's included); the thread ends
        // right after listening, and SO_PEERCRED keeps the uid it listened as.
        // SAFETY: setresuid takes three integers; -1 leaves the real and saved uids.
        let r = unsafe {
            libc::syscall(
                libc::SYS_setresuid,
                -1 as libc::c_long,
                uid as libc::c_long,
                -1 as libc::c_long,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        UnixListener::bind(&path)
    })
    .join()
    .map_err(|_| io::Error::other("the listening thread panicked"))?
}

/// Sends `bytes` in one message with `fds` attached (SCM_RIGHTS).
pub fn send_with_fds(sock: RawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS);
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut _,
        iov_len: bytes.len(),
    };
    let fd_bytes = std::mem::size_of_val(fds);
    let mut cbuf = [0u64; 16];
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        // SAFETY: CMSG_SPACE only computes a size.
        let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
        assert!(space <= std::mem::size_of_val(&cbuf));
        msg.msg_control = cbuf.as_mut_ptr() as *mut _;
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `space` bytes, enough for one header and the fds.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr() as *const u8, libc::CMSG_DATA(c), fd_bytes);
        }
    }
    // SAFETY: msg is fully initialised above.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != bytes.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
    }
    Ok(())
}

/// Receives one message into `buf`; returns its length and the descriptors it carried.
pub fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut _,
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: a zeroed msghdr is valid; the buffers set below outlive recvmsg.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut _;
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: msg describes valid buffers.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into cbuf, within controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let count =
                    ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned((data as *const RawFd).add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "descriptors truncated",
        ));
    }
    Ok((n as usize, fds))
}

/// Control-channel framing: a little-endian u32 length, then that many bytes.
pub fn write_frame(w: &mut impl io::Write, bytes: &[u8]) -> io::Result<()> {
    w.write_all(&(bytes.len() as u32).to_le_bytes())?;
    w.write_all(bytes)
}

/// Reads one frame of at most `max` bytes; Ok(None) at a clean end of stream.
pub fn read_frame(r: &mut impl io::Read, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "frame too long"));
    }
    let mut v = vec![0; len];
    r.read_exact(&mut v)?;
    Ok(Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh directory any user may create sockets in (an impostor's listener too).
    fn open_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("omps-peer-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        d
    }

    /// The pipe directory's own socket, a namespace's `control`, an MPS v3 server's
    /// directory routing to its `default` namespace, in that order.
    #[test]
    fn which_socket_a_pipe_directory_means() {
        let d = open_dir("route");
        assert_eq!(
            client_socket_in(&d),
            d.join(SOCKET_NAME),
            "nothing: the main socket (it fails naming it)"
        );
        std::fs::create_dir_all(d.join("default")).unwrap();
        let _def = UnixListener::bind(d.join("default").join(NAMESPACE_SOCKET)).unwrap();
        assert_eq!(
            client_socket_in(&d),
            d.join("default").join(NAMESPACE_SOCKET)
        );
        let _ns = UnixListener::bind(d.join(NAMESPACE_SOCKET)).unwrap();
        assert_eq!(client_socket_in(&d), d.join(NAMESPACE_SOCKET));
        let _main = UnixListener::bind(d.join(SOCKET_NAME)).unwrap();
        assert_eq!(client_socket_in(&d), d.join(SOCKET_NAME));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn namespace_directories_stay_inside_the_pipe_directory() {
        let d = std::path::Path::new("/p");
        assert_eq!(namespace_dir_in(d, "team"), PathBuf::from("/p/omps/team"));
        assert_eq!(
            namespace_dir_in(d, "training/hp"),
            PathBuf::from("/p/training/hp")
        );
        assert_eq!(namespace_dir_in(d, "/etc/x"), PathBuf::from("/p/etc/x"));
        assert_eq!(
            namespace_dir_in(d, "../../etc/x"),
            PathBuf::from("/p/etc/x")
        );
    }

    #[test]
    fn only_the_callers_own_uid_or_root_may_be_the_server() {
        assert!(server_uid_acceptable(1000, 1000));
        assert!(server_uid_acceptable(0, 1000));
        assert!(server_uid_acceptable(0, 0));
        assert!(!server_uid_acceptable(1001, 1000));
        assert!(!server_uid_acceptable(1000, 0));
        assert!(!server_uid_acceptable(65534, 1000));
    }

    #[test]
    fn a_server_of_our_own_uid_is_accepted() {
        let d = open_dir("ours");
        let path = d.join(SOCKET_NAME);
        let _l = UnixListener::bind(&path).unwrap();
        let s = connect_checked(&path).expect("our own listener");
        check_server_peer(&s, &path).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_server_of_another_uid_is_refused() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: only root can listen as another uid");
            return;
        }
        let d = open_dir("theirs");
        let path = d.join(SOCKET_NAME);
        let _l = match listen_as_uid(&path, 65534) {
            Ok(l) => l,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                eprintln!("skipped: cannot take another uid here ({e})");
                return;
            }
            Err(e) => panic!("listening as uid 65534: {e}"),
        };
        assert_eq!(
            peer_cred(UnixStream::connect(&path).unwrap().as_raw_fd())
                .unwrap()
                .uid,
            65534
        );
        let e = connect_checked(&path).expect_err("an impostor's socket");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        let why = e.to_string();
        assert!(why.contains(&path.display().to_string()), "{why}");
        assert!(why.contains("uid 65534") && why.contains("uid 0"), "{why}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
