//! The root daemon's look at a connection's hello: which kind of connection it is decides
//! where it goes, and the hello itself stays on the socket for the server that gets it. A
//! peer decides when (and whether) its hello comes, so the wait is bounded in time and
//! must not spend the CPU while it lasts (issue 23, finding 16).

use omps_ring::wire::{self, Hello};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// How long a connection has to send its hello.
pub const WAIT: Duration = Duration::from_secs(2);

/// The kind of connection its hello announces, read without taking it off the socket;
/// None if it does not come within `limit`.
pub fn peek_kind(s: &UnixStream, limit: Duration) -> Option<u32> {
    let mut h = Hello::default();
    let want = std::mem::size_of::<Hello>();
    let t = Instant::now();
    while t.elapsed() < limit {
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
        // Part of a hello keeps the socket readable, so poll returns at once: a peer that
        // sends half of one and stops would have this loop take a core until the limit
        // (and 256 such connections, every core). SO_RCVLOWAT would not help: poll on a
        // Unix socket ignores it.
        if n > 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    None
}

/// Takes the hello off the socket (for connections the daemon answers itself).
pub fn consume(s: &UnixStream) -> std::io::Result<()> {
    let mut h = [0u8; std::mem::size_of::<Hello>()];
    (&*s).read_exact(&mut h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// CPU time of the calling thread.
    fn thread_cpu() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: one valid timespec to fill.
        let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        assert_eq!(r, 0);
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    #[test]
    fn half_a_hello_is_waited_for_without_spinning() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let h = Hello {
            magic: wire::HELLO_MAGIC,
            version: wire::PROTOCOL_VERSION,
            kind: wire::kind::CLIENT,
        };
        let bytes = bytemuck::bytes_of(&h);
        let half = bytes.len() / 2;
        peer.write_all(&bytes[..half]).unwrap();
        let (cpu, t) = (thread_cpu(), Instant::now());
        let limit = Duration::from_secs(1);
        assert_eq!(peek_kind(&ours, limit), None, "half a hello taken for one");
        let (cpu, wall) = (thread_cpu() - cpu, t.elapsed());
        assert!(wall >= limit, "gave up after {wall:?}");
        assert!(
            cpu < wall / 5,
            "waiting {wall:?} for the rest of a hello took {cpu:?} of CPU"
        );
        // The rest comes: the kind, and the hello still there for the server.
        peer.write_all(&bytes[half..]).unwrap();
        assert_eq!(peek_kind(&ours, limit), Some(wire::kind::CLIENT));
        consume(&ours).unwrap();
        drop(peer);
        assert_eq!(peek_kind(&ours, limit), None, "a closed peer");
    }
}
