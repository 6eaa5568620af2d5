//! Device printf and assert messages, routed back to the client whose kernel wrote them.
//!
//! The driver keeps one printf buffer per context and writes its contents, formatted, to
//! file descriptor 1 of the process that owns the context, whenever that process makes a
//! synchronizing call (any stream's synchronize, an event's, the context's, and some
//! queries) from any thread. The message of a failed device `assert()` goes to file
//! descriptor 2 instead (H100, driver 580: `scripts/probe/assert_text.sh`). The contexts
//! are the server's, so the server points its fds 1 and 2 at pipes that pump threads
//! drain at all times, since a driver write that blocked would stall whichever thread
//! made the call, a worker among them. The server's own diagnostics go to the stderr it
//! started with ([`crate::base::stdio`]).
//!
//! Who printed is not in the text. The shim tells the server which clients run code
//! that references `vprintf` or `__assertfail` (or might: images it cannot read). Text
//! goes to the one such client; when there are several, or none, it goes to the server
//! log, with a warning. A client's text waits in the server until the client asks for it
//! after one of its own synchronizing calls: `flush` makes the driver write out its
//! buffer, then puts a marker into each pipe and waits until its pump has routed
//! everything before the marker.

use crate::gpu::Gpu;
use omps_ring::wire::printf_use;
use std::collections::BTreeMap;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Starts every marker; 8 more bytes (the marker's number) follow.
/// A marker's first bytes: a NUL, then seven random bytes drawn when the server starts,
/// so that no kernel can print a marker that ends a flush early.
fn mark_prefix() -> &'static [u8; 8] {
    static P: std::sync::OnceLock<[u8; 8]> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let mut p = [0u8; 8];
        // SAFETY: writes at most 7 bytes into the buffer's tail.
        let n = unsafe { libc::getrandom(p[1..].as_mut_ptr() as *mut libc::c_void, 7, 0) };
        if n != 7 {
            // No randomness: the time, which a kernel cannot know ahead either.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            p[1..].copy_from_slice(&t.to_le_bytes()[..7]);
        }
        p
    })
}
const MARK_LEN: usize = 16;
/// The most of one piece of device text the log takes, and how many such pieces it
/// takes whole before it only counts them (a client printing without end cannot fill
/// the log).
const LOG_TEXT_MAX: usize = 4096;
const LOG_PIECES: u64 = 64;
/// Text a client has not collected yet is capped at this per stream; the rest is counted
/// as lost.
const PENDING_MAX: usize = 16 << 20;
/// How long `flush` waits for the pumps to reach their markers.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// The two descriptors the driver writes device text to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// fd 1: device printf.
    Out = 0,
    /// fd 2: assert messages.
    Err = 1,
}

const STREAMS: [Stream; 2] = [Stream::Out, Stream::Err];

#[derive(Default)]
struct Pending {
    text: Vec<u8>,
    dropped: usize,
}

impl Pending {
    /// Up to `max` bytes of what is waiting, with a note of what was dropped.
    fn take(&mut self, max: usize) -> Vec<u8> {
        if self.dropped > 0 && self.text.len() < max {
            let note = format!(
                "[omps: {} bytes of device output were dropped]\n",
                self.dropped
            );
            self.text.extend_from_slice(note.as_bytes());
            self.dropped = 0;
        }
        let n = self.text.len().min(max);
        self.text.drain(..n).collect()
    }
}

#[derive(Default)]
struct State {
    /// Clients that run (or may run) printing code, with the level they declared.
    users: BTreeMap<u32, u64>,
    /// Per client, what each stream holds for it.
    pending: BTreeMap<u32, [Pending; 2]>,
    /// Per stream, the number of the last marker its pump has passed, and of the last sent.
    marks_seen: [u64; 2],
    marks_sent: [u64; 2],
    /// Bytes routed to the log because no single client could be named, and in how many
    /// pieces.
    unattributed: u64,
    logged_pieces: u64,
}

struct Shared {
    state: Mutex<State>,
    marked: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct PrintfRouter {
    shared: Arc<Shared>,
    /// The pipes' write ends, by [`Stream`]: the driver's fds 1 and 2 (when capturing),
    /// and where markers go.
    write_ends: [OwnedFd; 2],
}

/// Device text a client collects: what its kernels printed and what their asserts said.
#[derive(Debug, Default, PartialEq)]
pub struct Collected {
    pub out: Vec<u8>,
    pub err: Vec<u8>,
}

impl PrintfRouter {
    /// A router reading two new pipes. With `capture`, they become this process's fds 1
    /// and 2, where the driver writes device text.
    pub fn new(capture: bool) -> io::Result<PrintfRouter> {
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            marked: Condvar::new(),
        });
        let mut write_ends = Vec::new();
        for stream in STREAMS {
            let mut fds = [0; 2];
            // SAFETY: fds has room for the two descriptors pipe2 returns.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: pipe2 just returned these descriptors, owned by nobody else.
            let (read_end, write_end) =
                unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            // A larger pipe absorbs bursts while the pump is descheduled (best effort).
            // SAFETY: fcntl on a descriptor we own.
            unsafe { libc::fcntl(read_end.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("omps-printf{}", stream as usize + 1))
                .spawn(move || pump(std::fs::File::from(read_end), &s, stream))?;
            write_ends.push(write_end);
        }
        let write_ends: [OwnedFd; 2] = write_ends.try_into().expect("two streams");
        if capture {
            crate::base::stdio::keep_stdio()?;
            for (stream, w) in STREAMS.iter().zip(&write_ends) {
                // SAFETY: dup2 onto fd 1 or 2; the previous one is closed by it, which is
                // intended (the originals were kept by keep_stdio).
                if unsafe { libc::dup2(w.as_raw_fd(), *stream as i32 + 1) } < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(PrintfRouter { shared, write_ends })
    }

    /// Where device text goes, for GPUs that do not write to fds 1 and 2 themselves.
    pub fn write_fd(&self, stream: Stream) -> RawFd {
        self.write_ends[stream as usize].as_raw_fd()
    }

    /// Client `id` runs code at printf level `level` (raised, never lowered).
    pub fn declare(&self, id: u32, level: u64) {
        self.declare_unless_gone(id, level, &std::sync::atomic::AtomicBool::new(false));
    }

    /// As [`PrintfRouter::declare`], from a worker, for a client the control thread may
    /// be retiring meanwhile: `gone` (set before [`PrintfRouter::forget`] runs) is read
    /// under the router's lock, so a client forgotten is never declared again (it would
    /// stay a printing client for ever, and its text, or everyone's, would go nowhere).
    pub fn declare_unless_gone(&self, id: u32, level: u64, gone: &std::sync::atomic::AtomicBool) {
        if level == printf_use::NONE {
            return;
        }
        let mut st = self.shared.lock();
        if gone.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let l = st.users.entry(id).or_insert(level);
        *l = (*l).max(level);
    }

    /// Makes `gpu` write out its printf buffer, waits until the pumps have routed it, and
    /// returns up to `max` bytes (both streams together) of what client `id` has waiting.
    pub fn flush(&self, gpu: &dyn Gpu, id: u32, max: usize) -> Collected {
        if let Err(e) = gpu.flush_printf() {
            tracing::debug!(client = id, "printf flush: CUDA error {}", e.0);
        }
        for stream in STREAMS {
            self.sync_pump(stream);
        }
        let mut st = self.shared.lock();
        let Some([out, err]) = st.pending.get_mut(&id) else {
            return Collected::default();
        };
        let out = out.take(max);
        let err = err.take(max - out.len());
        Collected { out, err }
    }

    /// Client `id` is gone: what it did not collect goes to the log.
    pub fn forget(&self, id: u32) {
        let mut st = self.shared.lock();
        st.users.remove(&id);
        if let Some(p) = st.pending.remove(&id) {
            for (stream, p) in STREAMS.iter().zip(p) {
                if !p.text.is_empty() {
                    tracing::warn!(
                        client = id,
                        "device output ({stream:?}) the client did not collect before it went:\n{}",
                        log_text(&p.text)
                    );
                }
            }
        }
    }

    /// Bytes of device text that went to the log because no one client could be named.
    pub fn unattributed(&self) -> u64 {
        self.shared.lock().unattributed
    }

    /// Puts a marker into `stream`'s pipe and waits until the pump has passed it, so
    /// everything written there before it has been routed.
    fn sync_pump(&self, stream: Stream) {
        let k = stream as usize;
        let n = {
            let mut st = self.shared.lock();
            st.marks_sent[k] += 1;
            st.marks_sent[k]
        };
        let mut mark = [0u8; MARK_LEN];
        mark[..8].copy_from_slice(mark_prefix());
        mark[8..].copy_from_slice(&n.to_le_bytes());
        // SAFETY: writes MARK_LEN bytes from a live buffer to a descriptor we own; below
        // PIPE_BUF, so the marker is never split by other writers.
        let w = unsafe {
            libc::write(
                self.write_ends[k].as_raw_fd(),
                mark.as_ptr() as *const _,
                MARK_LEN,
            )
        };
        if w != MARK_LEN as isize {
            tracing::warn!(
                "printf: cannot write a marker: {}",
                io::Error::last_os_error()
            );
            return;
        }
        let st = self.shared.lock();
        let (_st, timeout) = self
            .shared
            .marked
            .wait_timeout_while(st, FLUSH_TIMEOUT, |s| s.marks_seen[k] < n)
            .unwrap_or_else(|e| e.into_inner());
        if timeout.timed_out() {
            tracing::warn!("printf: the {stream:?} pump did not reach marker {n} in time");
        }
    }
}

/// Reads the pipe until it closes, routing text and counting markers.
fn pump(mut pipe: std::fs::File, shared: &Shared, stream: Stream) {
    let mut acc: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        acc.extend_from_slice(&buf[..n]);
        let mut st = shared.lock();
        let mut marked = false;
        let kept = split_marks(&acc, |piece| match piece {
            Piece::Text(t) => route(&mut st, stream, t),
            // A marker numbered past the last one sent is not ours: a kernel printed the
            // bytes. Taking it would let later flushes return before their text is in.
            Piece::Mark(m) if m > st.marks_sent[stream as usize] => {}
            Piece::Mark(m) => {
                let k = stream as usize;
                st.marks_seen[k] = st.marks_seen[k].max(m);
                marked = true;
            }
        });
        drop(st);
        acc.drain(..acc.len() - kept);
        if marked {
            shared.marked.notify_all();
        }
    }
}

#[derive(Debug, PartialEq)]
enum Piece<'a> {
    Text(&'a [u8]),
    Mark(u64),
}

/// Cuts `data` into text and markers, in order; returns how many bytes at its end were
/// held back because they may be the start of a marker not yet complete.
fn split_marks<'a>(data: &'a [u8], mut f: impl FnMut(Piece<'a>)) -> usize {
    let mut rest = data;
    loop {
        match find(rest, mark_prefix()) {
            Some(i) if rest.len() >= i + MARK_LEN => {
                if i > 0 {
                    f(Piece::Text(&rest[..i]));
                }
                let n = u64::from_le_bytes(rest[i + 8..i + MARK_LEN].try_into().expect("8 bytes"));
                f(Piece::Mark(n));
                rest = &rest[i + MARK_LEN..];
            }
            Some(i) => {
                if i > 0 {
                    f(Piece::Text(&rest[..i]));
                }
                return rest.len() - i;
            }
            None => {
                // The longest tail that is a proper prefix of the marker waits for more.
                let prefix = mark_prefix();
                let keep = (1..prefix.len())
                    .rev()
                    .find(|&k| rest.len() >= k && rest[rest.len() - k..] == prefix[..k])
                    .unwrap_or(0);
                if rest.len() > keep {
                    f(Piece::Text(&rest[..rest.len() - keep]));
                }
                return keep;
            }
        }
    }
}

/// Device text as the log takes it: at most LOG_TEXT_MAX bytes, and how much was cut.
fn log_text(text: &[u8]) -> String {
    let shown = String::from_utf8_lossy(&text[..text.len().min(LOG_TEXT_MAX)]);
    match text.len().checked_sub(LOG_TEXT_MAX) {
        Some(cut) if cut > 0 => format!("{shown}\n[... {cut} more bytes not logged]"),
        _ => shown.into_owned(),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Text goes to the one client whose code can write it (printf text: code that calls
/// printf or may; assert messages: also code that only asserts); otherwise to the log.
fn route(st: &mut State, stream: Stream, text: &[u8]) {
    let least = match stream {
        Stream::Out => printf_use::MAYBE,
        Stream::Err => printf_use::ASSERT,
    };
    let mut users = st
        .users
        .iter()
        .filter(|&(_, &level)| level >= least)
        .map(|(id, _)| id);
    match (users.next(), users.next()) {
        (Some(&id), None) => {
            let p = &mut st.pending.entry(id).or_default()[stream as usize];
            let room = PENDING_MAX.saturating_sub(p.text.len());
            let take = text.len().min(room);
            p.text.extend_from_slice(&text[..take]);
            p.dropped += text.len() - take;
        }
        (first, _) => {
            st.unattributed += text.len() as u64;
            let why = if first.is_none() {
                "no client declared printing code"
            } else {
                "several clients run printing code"
            };
            st.logged_pieces += 1;
            if st.logged_pieces <= LOG_PIECES {
                tracing::warn!(
                    "device output on {stream:?} ({why}, so it cannot be given to one client):\n{}",
                    log_text(text)
                );
            } else if st.logged_pieces.is_multiple_of(1000) {
                tracing::warn!(
                    "{} bytes of device output in all could not be given to one client",
                    st.unattributed
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(n: u64) -> Vec<u8> {
        let mut m = mark_prefix().to_vec();
        m.extend_from_slice(&n.to_le_bytes());
        m
    }

    fn pieces(data: &[u8]) -> (Vec<String>, usize) {
        let mut out = Vec::new();
        let kept = split_marks(data, |p| {
            out.push(match p {
                Piece::Text(t) => format!("T:{}", String::from_utf8_lossy(t)),
                Piece::Mark(n) => format!("M:{n}"),
            })
        });
        (out, kept)
    }

    #[test]
    fn markers_are_cut_out_of_the_text() {
        let mut d = b"one\n".to_vec();
        d.extend(mark(7));
        d.extend_from_slice(b"two\n");
        d.extend(mark(8));
        assert_eq!(
            pieces(&d),
            (
                vec![
                    "T:one\n".into(),
                    "M:7".into(),
                    "T:two\n".into(),
                    "M:8".into()
                ],
                0
            )
        );
    }

    #[test]
    fn a_marker_split_across_reads_is_held_back() {
        let m = mark(3);
        for cut in 1..MARK_LEN {
            let mut d = b"abc".to_vec();
            d.extend_from_slice(&m[..cut]);
            let (p, kept) = pieces(&d);
            assert_eq!(p, vec!["T:abc".to_string()], "cut at {cut}");
            assert_eq!(kept, cut, "cut at {cut}");
        }
        // A NUL that starts no marker is text, once it cannot be one. The byte after it
        // must differ from the marker's second, which is random (with 'b' always, this
        // failed one run in 256).
        let second = if mark_prefix()[1] == b'b' { b'c' } else { b'b' };
        let text = [b'a', 0, second];
        let want = format!("T:{}", String::from_utf8_lossy(&text));
        assert_eq!(pieces(&text), (vec![want], 0));
    }

    #[test]
    fn text_goes_to_the_only_printf_client_else_to_the_log() {
        let mut st = State::default();
        route(&mut st, Stream::Out, b"nobody\n");
        assert_eq!(st.unattributed, 7);
        st.users.insert(4, printf_use::YES);
        route(&mut st, Stream::Out, b"hello\n");
        route(&mut st, Stream::Err, b"assert\n");
        assert_eq!(st.pending[&4][0].text, b"hello\n");
        assert_eq!(st.pending[&4][1].text, b"assert\n");
        st.users.insert(5, printf_use::ASSERT);
        route(&mut st, Stream::Err, b"whose?\n");
        assert_eq!(st.pending[&4][1].text, b"assert\n");
        assert_eq!(st.unattributed, 14);
        // printf text cannot come from code that only asserts: it is still 4's.
        route(&mut st, Stream::Out, b"printed\n");
        assert_eq!(st.pending[&4][0].text, b"hello\nprinted\n");
    }

    #[test]
    fn pending_text_is_capped_and_the_loss_counted() {
        let mut st = State::default();
        st.users.insert(1, printf_use::YES);
        let big = vec![b'x'; PENDING_MAX - 2];
        route(&mut st, Stream::Out, &big);
        route(&mut st, Stream::Out, b"12345");
        assert_eq!(st.pending[&1][0].text.len(), PENDING_MAX);
        assert_eq!(st.pending[&1][0].dropped, 3);
        let got = st.pending.get_mut(&1).unwrap()[0].take(PENDING_MAX + 100);
        assert!(got.ends_with(b"[omps: 3 bytes of device output were dropped]\n"));
    }
}
