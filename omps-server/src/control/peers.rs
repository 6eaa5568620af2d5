//! Connections the control thread has not handed on yet: handshakes in progress and
//! operators' control connections. Their sockets are non-blocking and polled with the
//! clients', and each has a deadline, so a peer that stays silent, sends a byte at a time
//! or holds a control connection open costs the control thread nothing: it goes on
//! accepting clients, answering pin and printf requests and seeing hang-ups. Answers are
//! written the same way: what the peer's socket does not take at once waits in the
//! peer's buffer, sent as the socket drains, and the peer's next command is not read
//! before; one that does not take its answer by its deadline is dropped.

use omps_ring::wire::{self, Hello};
use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// The whole handshake (hello and client settings) must arrive within this.
pub const HANDSHAKE_TIME: Duration = Duration::from_secs(2);
/// A control connection may wait this long between commands.
pub const CONTROL_IDLE: Duration = Duration::from_secs(10);
/// The longest control command line.
const MAX_COMMAND: usize = 4096;
/// Connections in progress the operator's socket has of its own: clients filling every
/// other slot never lock the operator (or a liveness probe) out.
pub const OPERATOR_HANDSHAKES: usize = 8;
/// Connections in progress one process may have on the sockets clients reach.
pub const HANDSHAKES_PER_PID: usize = 8;
/// Of OMPS_MAX_HANDSHAKES, the part (1/8: 8 of the default 64) each socket clients reach
/// (the clients' socket, each namespace's, the handoffs) keeps of its own: while it has
/// fewer in progress it takes one more even when the others fill the shared slots, so
/// one namespace's pods cannot lock another's out of their handshakes (issue 23).
pub const SOCKET_RESERVE_DIVISOR: usize = 8;

/// What a peer has sent so far.
pub enum Stage {
    /// Its hello.
    Hello,
    /// A client's settings, after its hello.
    Settings,
    /// A control connection: a command frame (length, then text).
    Control,
}

/// Which socket a connection came through, which decides what it may do: clients
/// connect through the clients' socket or a namespace's, control commands come through
/// the operator's (docs/design.md, "Operator and client principals").
#[derive(Clone)]
pub enum Origin {
    /// `omps.sock`: clients, with the server's defaults.
    Clients,
    /// A namespace's socket: clients, held to the namespace's limits.
    Namespace(std::sync::Arc<crate::control::namespace::Limits>),
    /// The operator's socket: control commands only.
    Operator,
    /// Passed by the root daemon (OMPS_MULTIUSER) for the server's own user, who is its
    /// operator there: both.
    Handoff,
}

impl Origin {
    pub fn takes_commands(&self) -> bool {
        matches!(self, Origin::Operator | Origin::Handoff)
    }

    pub fn takes_clients(&self) -> bool {
        !matches!(self, Origin::Operator)
    }

    /// Whether two connections came through the same socket.
    fn same_socket(&self, other: &Origin) -> bool {
        match (self, other) {
            (Origin::Namespace(a), Origin::Namespace(b)) => std::sync::Arc::ptr_eq(a, b),
            (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
        }
    }
}

/// Whether a socket whose connections in progress are `its` of `all` on the sockets
/// clients reach may take no more, `most` (OMPS_MAX_HANDSHAKES) being their shared
/// slots: only when those are full and it has its reserve in use too.
fn socket_full(all: usize, its: usize, most: usize) -> bool {
    all >= most && its >= most / SOCKET_RESERVE_DIVISOR
}

/// Whether process `pid`, with `its` connections in handshake, may have no more.
fn process_full(its: usize) -> bool {
    its >= HANDSHAKES_PER_PID
}

/// Whether peer `p` counts as the same process as a new connection of `pid` through
/// `origin` (`operator_only`: of root). A peer of another PID namespace shows as pid 0:
/// those count together per socket and user (review 4, finding 7: uncounted, they had no
/// cap), never across sockets, so that one namespace's pods cannot lock another's out.
fn same_process(p: &Peer, pid: i32, origin: &Origin, operator_only: bool) -> bool {
    p.pid == pid && (pid != 0 || (p.origin.same_socket(origin) && p.operator_only == operator_only))
}

/// A connection in progress.
pub struct Peer {
    pub stream: UnixStream,
    pub pid: i32,
    pub origin: Origin,
    /// Of another user (root): it may open a control connection, not be a client.
    pub operator_only: bool,
    pub stage: Stage,
    buf: Vec<u8>,
    /// An answer not yet taken by the peer, and how much of it has been sent.
    out: Vec<u8>,
    sent: usize,
    pub deadline: Instant,
}

/// What a peer's bytes amounted to.
pub enum Progress {
    /// Not a whole message yet.
    Waiting,
    /// A client's hello and settings.
    Client(Box<wire::ClientSettings>),
    /// A control connection's command line.
    Command(String),
    /// A hello of another protocol: answer that, then drop it (the reason).
    Refused(String),
    /// The peer closed, sent something malformed, or failed: drop it (the reason).
    Gone(String),
}

impl Peer {
    /// A new connection, of the server's user `uid` (or root, which may only control it,
    /// as an operator); `in_progress` connections are already in their handshake.
    /// The operator's socket counts its connections apart (at most
    /// [`OPERATOR_HANDSHAKES`]); the others share OMPS_MAX_HANDSHAKES, at most
    /// [`HANDSHAKES_PER_PID`] of them one process's, and each socket has a reserve of
    /// its own beyond them ([`SOCKET_RESERVE_DIVISOR`]).
    pub fn admit(
        stream: UnixStream,
        uid: u32,
        others: &[Peer],
        origin: Origin,
    ) -> io::Result<Peer> {
        let cred = omps_ring::sock::peer_cred(std::os::fd::AsRawFd::as_raw_fd(&stream))?;
        if cred.uid != uid && cred.uid != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("peer uid {} is not the server's uid {uid}", cred.uid),
            ));
        }
        let operator = matches!(origin, Origin::Operator);
        let alike = others
            .iter()
            .filter(|p| matches!(p.origin, Origin::Operator) == operator);
        // Dropping it closes it: the peer sees the connection fail.
        if operator {
            if alike.count() >= OPERATOR_HANDSHAKES {
                return Err(io::Error::other(
                    "too many connections in progress on the operator's socket",
                ));
            }
        } else {
            let (mut all, mut its, mut socket) = (0, 0, 0);
            for p in alike {
                all += 1;
                its += usize::from(same_process(p, cred.pid, &origin, cred.uid != uid));
                socket += usize::from(p.origin.same_socket(&origin));
            }
            if socket_full(all, socket, crate::client::bounds::bounds().handshakes) {
                return Err(io::Error::other(
                    "too many connections in handshake (OMPS_MAX_HANDSHAKES), and this socket's reserve of them in use",
                ));
            }
            if process_full(its) {
                return Err(io::Error::other(format!(
                    "process {} has {HANDSHAKES_PER_PID} connections in handshake",
                    cred.pid
                )));
            }
        }
        Peer::new(stream, cred.pid, cred.uid != uid, origin)
    }

    pub fn new(
        stream: UnixStream,
        pid: i32,
        operator_only: bool,
        origin: Origin,
    ) -> io::Result<Peer> {
        stream.set_nonblocking(true)?;
        Ok(Peer {
            stream,
            pid,
            origin,
            operator_only,
            stage: Stage::Hello,
            buf: Vec::new(),
            out: Vec::new(),
            sent: 0,
            deadline: Instant::now() + HANDSHAKE_TIME,
        })
    }

    /// How many bytes the current message has in all, once its head is in.
    fn wanted(&self) -> usize {
        match self.stage {
            Stage::Hello => std::mem::size_of::<Hello>(),
            Stage::Settings => std::mem::size_of::<wire::ClientSettings>(),
            Stage::Control => match self.buf.get(..4) {
                Some(l) => 4 + u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize,
                None => 4,
            },
        }
    }

    /// What to poll its socket for: room for the rest of an answer, else what it sends.
    pub fn events(&self) -> libc::c_short {
        if self.sent < self.out.len() {
            libc::POLLOUT
        } else {
            libc::POLLIN | libc::POLLRDHUP
        }
    }

    /// Sends what the socket takes now of the answer in hand; whether all of it is sent.
    fn flush(&mut self) -> io::Result<bool> {
        use std::io::Write;
        while self.sent < self.out.len() {
            match (&self.stream).write(&self.out[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out = Vec::new();
        self.sent = 0;
        Ok(true)
    }

    /// Sends what it can of the answer in hand, then reads what has arrived, without
    /// blocking, and says what it amounts to.
    pub fn progress(&mut self) -> Progress {
        match self.flush() {
            Ok(true) => {}
            Ok(false) => return Progress::Waiting,
            Err(e) => return Progress::Gone(e.to_string()),
        }
        loop {
            let want = self.wanted();
            if matches!(self.stage, Stage::Control) && want > 4 + MAX_COMMAND {
                return Progress::Gone("a control command too long".into());
            }
            if self.buf.len() < want {
                let mut chunk = vec![0u8; want - self.buf.len()];
                match self.stream.read(&mut chunk) {
                    Ok(0) => return Progress::Gone("closed".into()),
                    Ok(n) => {
                        self.buf.extend_from_slice(&chunk[..n]);
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Progress::Waiting,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Progress::Gone(e.to_string()),
                }
            }
            if matches!(self.stage, Stage::Control) && self.wanted() > want {
                // The length is in; the text comes next.
                continue;
            }
            let msg = std::mem::take(&mut self.buf);
            match self.stage {
                Stage::Hello => {
                    let hello: Hello = bytemuck::pod_read_unaligned(&msg);
                    if hello.magic != wire::HELLO_MAGIC || hello.version != wire::PROTOCOL_VERSION {
                        return Progress::Refused("bad hello (protocol version mismatch?)".into());
                    }
                    self.stage = match hello.kind {
                        wire::kind::CLIENT => Stage::Settings,
                        // A socket that takes no commands answers the first with a
                        // refusal and closes (control.rs): its handshake time, not a
                        // control connection's, bounds the wait for it.
                        wire::kind::CONTROL if !self.origin.takes_commands() => Stage::Control,
                        wire::kind::CONTROL => {
                            self.deadline = Instant::now() + CONTROL_IDLE;
                            Stage::Control
                        }
                        k => return Progress::Gone(format!("unknown connection kind {k}")),
                    };
                }
                Stage::Settings => {
                    return Progress::Client(Box::new(bytemuck::pod_read_unaligned(&msg)));
                }
                Stage::Control => {
                    self.deadline = Instant::now() + CONTROL_IDLE;
                    let line = String::from_utf8_lossy(&msg[4..]).trim().to_string();
                    return Progress::Command(line);
                }
            }
        }
    }

    /// Sends a control command's answer, as much as the socket takes now; the rest goes
    /// as the peer reads ([`Peer::progress`]), within [`CONTROL_IDLE`]. An error only when
    /// the connection failed.
    pub fn answer(&mut self, ok: bool, text: &str) -> io::Result<()> {
        let mut reply = vec![u8::from(!ok)];
        reply.extend_from_slice(text.as_bytes());
        let mut frame = Vec::with_capacity(4 + reply.len());
        omps_ring::sock::write_frame(&mut frame, &reply)?;
        self.out = frame;
        self.sent = 0;
        self.deadline = Instant::now() + CONTROL_IDLE;
        self.flush().map(drop)
    }

    /// The stream, blocking again with short timeouts, for the rest of a client's
    /// handshake (the server's welcome).
    pub fn into_stream(self) -> io::Result<UnixStream> {
        self.stream.set_nonblocking(false)?;
        self.stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        self.stream
            .set_write_timeout(Some(Duration::from_secs(2)))?;
        Ok(self.stream)
    }
}

/// Longest reason a refusal carries after its welcome.
pub const MAX_REASON: usize = 400;

/// A refusal: the welcome with `status`, then why, as text (at most [`MAX_REASON`]
/// bytes), which the shim prints with the code; shims that do not read it lose nothing.
pub fn send_refusal(s: &UnixStream, status: i32, why: &str) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let w = wire::Welcome {
        magic: wire::HELLO_MAGIC,
        version: wire::PROTOCOL_VERSION,
        status,
        ..Default::default()
    };
    let mut bytes = bytemuck::bytes_of(&w).to_vec();
    let mut end = why.len().min(MAX_REASON);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    bytes.extend_from_slice(&why.as_bytes()[..end]);
    omps_ring::sock::send_with_fds(s.as_raw_fd(), &bytes, &[])
}

/// A handshake's answer with `status` and nothing else (a refusal, or not ready).
pub fn send_status(s: &UnixStream, status: i32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let w = wire::Welcome {
        magic: wire::HELLO_MAGIC,
        version: wire::PROTOCOL_VERSION,
        status,
        ..Default::default()
    };
    omps_ring::sock::send_with_fds(s.as_raw_fd(), bytemuck::bytes_of(&w), &[])
}

#[cfg(test)]
mod tests {
    /// Review 4, finding 7: peers of PID 0 had no per-process cap at all; now they count
    /// together per socket (and user), apart from other sockets' PID-0 peers.
    #[test]
    fn peers_of_pid_0_share_a_bucket_per_socket() {
        use super::{process_full, same_process, Origin, Peer, HANDSHAKES_PER_PID};
        assert!(!process_full(HANDSHAKES_PER_PID - 1));
        assert!(
            process_full(HANDSHAKES_PER_PID),
            "a process's bucket is full"
        );
        let limits = |name: &str| std::sync::Arc::new(crate::control::namespace::test_limits(name));
        let (a, b) = (
            Origin::Namespace(limits("a")),
            Origin::Namespace(limits("b")),
        );
        let peer = |pid, origin: &Origin| {
            let (s, _) = std::os::unix::net::UnixStream::pair().unwrap();
            Peer::new(s, pid, false, origin.clone()).unwrap()
        };
        let p = peer(0, &a);
        assert!(
            same_process(&p, 0, &a, false),
            "PID 0 of one socket: one bucket"
        );
        assert!(!same_process(&p, 0, &b, false), "not another namespace's");
        assert!(!same_process(&p, 0, &Origin::Clients, false));
        assert!(!same_process(&p, 0, &a, true), "nor root's");
        assert!(!same_process(&p, 7, &a, false), "a PID is its own");
        let q = peer(7, &a);
        assert!(
            same_process(&q, 7, &b, false),
            "a PID counts on every socket"
        );
    }

    #[test]
    fn a_socket_keeps_its_reserve_when_the_others_fill_the_shared_slots() {
        use super::socket_full;
        assert!(!socket_full(63, 63, 64), "room in the shared slots");
        assert!(socket_full(64, 64, 64), "one socket took every shared slot");
        assert!(
            !socket_full(64, 0, 64),
            "another socket's connection still comes in"
        );
        assert!(!socket_full(71, 7, 64), "its 8th of its own");
        assert!(socket_full(72, 8, 64), "its reserve is used up");
        assert!(socket_full(6, 0, 6), "small bounds have no reserve");
    }

    #[test]
    fn namespaces_sockets_are_told_apart() {
        use super::Origin;
        let a = std::sync::Arc::new(crate::control::namespace::test_limits("a"));
        let b = std::sync::Arc::new(crate::control::namespace::test_limits("b"));
        let (na, nb) = (Origin::Namespace(a.clone()), Origin::Namespace(b));
        assert!(na.same_socket(&Origin::Namespace(a)));
        assert!(!na.same_socket(&nb));
        assert!(!na.same_socket(&Origin::Clients));
        assert!(Origin::Clients.same_socket(&Origin::Clients));
    }
}
