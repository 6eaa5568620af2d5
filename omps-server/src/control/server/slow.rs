//! The slow-request thread: clients' socket requests that may take long (printf
//! flushes, page-locked memory pins), answered on the client's socket off the control
//! thread, which never waits on a client.

use crate::client::printf::PrintfRouter;
use crate::client::ClientShared;
use crate::gpu::{code, Gpu};
use omps_ring::wire::{self};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A client's socket request that may take long, for the slow-request thread, which
/// answers on the client's socket.
pub(super) enum SlowJob {
    /// The printf output of GPU `gpu` for client `id` so far.
    Flush {
        gpu: Arc<dyn Gpu>,
        client: Arc<ClientShared>,
        sock: UnixStream,
    },
    /// Page-locked memory: the client's memfd, to map at `addr` and register.
    Pin {
        client: Arc<ClientShared>,
        fd: OwnedFd,
        addr: u64,
        len: u64,
        sock: UnixStream,
    },
}

/// The thread that runs slow requests one after another. A pin that must wait for a
/// range the client gave back (pin_once) waits aside, tried again every millisecond
/// between the other requests, so that it holds up no one else's (issue 23 review).
pub(super) fn start_slow_requests(
    printf: Arc<PrintfRouter>,
) -> io::Result<std::sync::mpsc::Sender<SlowJob>> {
    use std::sync::mpsc::RecvTimeoutError;
    let (tx, rx) = std::sync::mpsc::channel::<SlowJob>();
    std::thread::Builder::new()
        .name("omps-requests".into())
        .spawn(move || {
            // Pins waiting for an unpin, with when they came (one per client at most: a
            // client has one slow request at a time).
            let mut waiting: Vec<(SlowJob, Instant)> = Vec::new();
            loop {
                let next = if waiting.is_empty() {
                    rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
                } else {
                    rx.recv_timeout(Duration::from_millis(1))
                };
                match next {
                    Ok(job) => run_slow(&printf, job, Instant::now(), &mut waiting),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
                for (job, since) in std::mem::take(&mut waiting) {
                    run_slow(&printf, job, since, &mut waiting);
                }
            }
        })?;
    Ok(tx)
}

/// Runs one slow request that came at `since`, answering it, or puts it in `waiting`.
pub(super) fn run_slow(
    printf: &PrintfRouter,
    job: SlowJob,
    since: Instant,
    waiting: &mut Vec<(SlowJob, Instant)>,
) {
    match job {
        SlowJob::Flush { gpu, client, sock } => {
            let got = printf.flush(&*gpu, client.id, wire::PRINTF_REPLY_MAX - 4);
            answer_slow(&client, &sock, 0, &wire::printf_reply(&got.out, &got.err));
        }
        SlowJob::Pin {
            ref client,
            ref fd,
            addr,
            len,
            ref sock,
        } => {
            // A client gone meanwhile gets nothing mapped for it.
            let status = if client.gone.load(Ordering::Acquire) {
                Some(code::MPS_CLIENT_TERMINATED)
            } else {
                pin_once(client, fd.as_fd(), addr, len, since)
            };
            match status {
                Some(status) => answer_slow(client, sock, status, &[]),
                None => waiting.push((job, since)),
            }
        }
    }
}

/// How long the slow-request thread waits for a client to take any more of its answer:
/// the shim reads it at once; a client that takes none of it this long is cut off, so
/// that it cannot hold every other client's pins and printf flushes behind it (issue 23,
/// review). A large answer read in pieces, however slowly, goes on.
const SLOW_ANSWER_TIME: Duration = Duration::from_millis(200);

/// Answers a slow request, the client taking some of it every [`SLOW_ANSWER_TIME`], or
/// cuts the client off; only then
/// may the client ask again (one slow request at a time each).
pub(super) fn answer_slow(client: &ClientShared, sock: &UnixStream, status: i32, text: &[u8]) {
    let head = wire::HostMemReply {
        status,
        text_len: text.len() as u32,
    };
    let mut bytes = bytemuck::bytes_of(&head).to_vec();
    bytes.extend_from_slice(text);
    // Free for its next request before it can have this answer: the shim sends the next
    // one as soon as it reads this, and a flag cleared after the send was, now and then
    // on a loaded machine, still set when that request came, which cut off an honest
    // client ("a second request before the first was answered").
    // SYNC POINT: this release pairs with the control thread's swap (AcqRel) in
    // requests.rs that takes the flag for the client's next slow request.
    client.slow_pending.store(false, Ordering::Release);
    // A client cut off already (one that took no answer, say) is owed none: it must not
    // cost this thread another wait (review 5).
    if client.gone.load(Ordering::Acquire) {
        return;
    }
    if !send_within(sock, &bytes, SLOW_ANSWER_TIME) {
        client.disconnect(
            code::MPS_CLIENT_TERMINATED,
            "it did not take the answer to its request",
        );
    }
}

/// Sends all of `bytes`, never waiting `limit` for the peer to take any (ZERO: never
/// waiting at all): whether they went.
pub(super) fn send_within(sock: &UnixStream, bytes: &[u8], limit: Duration) -> bool {
    let mut deadline = Instant::now() + limit;
    let mut sent = 0;
    while sent < bytes.len() {
        let rest = &bytes[sent..];
        // SAFETY: sending from a live buffer of rest.len() bytes on a socket we hold.
        let n = unsafe {
            libc::send(
                sock.as_raw_fd(),
                rest.as_ptr() as *const libc::c_void,
                rest.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n > 0 {
            sent += n as usize;
            deadline = Instant::now() + limit;
            continue;
        }
        let e = io::Error::last_os_error();
        if n == 0
            || !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            )
        {
            return false;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack, for the call.
        unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as i32) };
    }
    true
}

/// Pins a client's range; one it gave back a moment ago may still be mapped at the same
/// address until its fences pass on every GPU (cudaHostUnregister returns before then), and
/// a range pinned there again waits for it (2 s after `since`, when it was asked, at
/// most), as natively the first is gone by the time the call returns. The status to
/// answer, or None: to be tried again in a moment.
pub(super) fn pin_once(
    client: &ClientShared,
    fd: std::os::fd::BorrowedFd,
    addr: u64,
    len: u64,
    since: Instant,
) -> Option<i32> {
    match client.pin(fd, addr, len) {
        Err(code::NOT_SUPPORTED)
            if client.unpinning_ranges() > 0 && since.elapsed() < Duration::from_secs(2) =>
        {
            None
        }
        r => Some(r.err().unwrap_or(0)),
    }
}
