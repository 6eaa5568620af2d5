//! The client's end of the transport: the connection to the server, the command rings,
//! the channels that carry synchronous calls, and waiting that never hangs on a lost server.

use crate::cuda::*;
/// The server's bounds on what the client holds, under the path they always had.
pub use crate::quota::Quota;
/// The environment's settings for the server, under the path they always had.
pub use crate::settings::{settings_from, settings_from_env};
use omps_ring::futex::{self, Doorbell, WaitResult};
use omps_ring::ring::{Producer, PushError};
use omps_ring::segment::{
    state, Channel, LayoutParams, SegmentView, SnapshotTable, WaitPlan, Word, CHUNKS_PER_CHANNEL,
    SEGMENT_MAGIC,
};
use omps_ring::shm::{self, Mapping};
use omps_ring::sock;
use omps_ring::wire::{self, CallHdr, Hello, Op, Welcome};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// What a channel's owner remembers between calls.
#[derive(Default)]
pub struct ChanState {
    seq: u32,
    /// Sequence of the last transfer through each staging chunk (0: never used).
    chunk_seq: [u32; CHUNKS_PER_CHANNEL],
}

pub struct Conn {
    sock: UnixStream,
    seg: SegmentView,
    _seg_map: Mapping,
    bells: Vec<Mapping>,
    rings: Vec<Mutex<Producer>>,
    chans: Vec<Mutex<ChanState>>,
    pub snapshot: Box<SnapshotTable>,
    lost: AtomicBool,
    /// Serialises requests on the socket (pinned memory), one answer per request.
    requests: Mutex<()>,
    /// Streams and events the server lets this client hold, and how many it holds.
    pub streams: Quota,
    pub events: Quota,
}

/// A channel held by one thread for the length of a call.
pub struct ChanGuard<'a> {
    pub idx: u32,
    st: MutexGuard<'a, ChanState>,
    conn: &'a Conn,
}

static CONN: OnceLock<Result<Conn, CUresult>> = OnceLock::new();

/// The process's connection, made on first use.
pub fn conn() -> Result<&'static Conn, CUresult> {
    CONN.get_or_init(|| {
        connect_waiting(&sock::socket_path(), connect_wait()).map_err(|(code, why)| {
            eprintln!("omps: {why}");
            code
        })
    })
    .as_ref()
    .map_err(|&e| e)
}

pub fn connected() -> Option<&'static Conn> {
    CONN.get().and_then(|c| c.as_ref().ok())
}

pub type ConnectError = (CUresult, String);

/// How a connection closed before the server's welcome fails: [`Conn::connect_with`]
/// tries it again, for up to [`CLOSED_RETRY`].
const CLOSED_EARLY: &str = "handshake failed";
pub const CLOSED_RETRY: std::time::Duration = std::time::Duration::from_secs(3);

/// How long a program's first CUDA call waits for a server that answers "not ready"
/// (CUDA_ERROR_MPS_SERVER_NOT_READY: in FAULT until its clients are gone, or starting
/// again after a fault), as an MPS client waits for its server: OMPS_CONNECT_WAIT seconds,
/// default 30; 0 returns the refusal at once.
pub fn connect_wait() -> std::time::Duration {
    let secs = std::env::var("OMPS_CONNECT_WAIT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(30.0);
    std::time::Duration::from_secs_f64(secs.min(86_400.0))
}

/// [`Conn::connect_to`], tried again every 20 ms while the server answers "not ready" and
/// `wait` has not passed; any other failure, or the last refusal, is the answer.
pub fn connect_waiting(
    path: &std::path::Path,
    wait: std::time::Duration,
) -> Result<Conn, ConnectError> {
    let start = std::time::Instant::now();
    let mut said = false;
    loop {
        match Conn::connect_to(path) {
            Err((code, why)) if code == CUDA_ERROR_MPS_SERVER_NOT_READY => {
                if start.elapsed() >= wait {
                    return Err((code, why));
                }
                if !said && crate::trace_enabled() {
                    eprintln!("omps trace: the server is not ready; waiting up to {wait:?}");
                    said = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

impl Conn {
    /// A new connection to the server of the pipe directory. Programs use the process's
    /// one connection through [`conn`]; tools and tests may hold several.
    pub fn connect() -> Result<Conn, ConnectError> {
        Self::connect_to(&sock::socket_path())
    }

    pub fn connect_to(path: &std::path::Path) -> Result<Conn, ConnectError> {
        let settings = settings_from_env().map_err(|e| (CUDA_ERROR_INVALID_VALUE, e))?;
        Self::connect_with(path, &settings)
    }

    /// As [`Conn::connect_to`], asking for `settings` rather than what the environment says.
    /// A connection the server closes before its welcome (it sheds handshakes beyond its
    /// slots: OMPS_MAX_HANDSHAKES) is tried again for up to [`CLOSED_RETRY`].
    pub fn connect_with(
        path: &std::path::Path,
        settings: &wire::ClientSettings,
    ) -> Result<Conn, ConnectError> {
        let start = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(10);
        loop {
            match Self::connect_once(path, settings) {
                Err((_, why))
                    if why.starts_with(CLOSED_EARLY) && start.elapsed() < CLOSED_RETRY =>
                {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(200));
                }
                other => return other,
            }
        }
    }

    fn connect_once(
        path: &std::path::Path,
        settings: &wire::ClientSettings,
    ) -> Result<Conn, ConnectError> {
        let fail = |what: String| (CUDA_ERROR_MPS_CONNECTION_FAILED, what);
        let s = UnixStream::connect(path).map_err(|e| {
            fail(format!("cannot reach the omps server at {} ({e}); start it with `omps-server` or run the program with `omps-ctl run -- PROGRAM`", path.display()))
        })?;
        // Before the hello: another user's server would get this client's calls and its
        // pinned memory.
        sock::check_server_peer(&s, path).map_err(|e| fail(e.to_string()))?;
        let hello = Hello {
            magic: wire::HELLO_MAGIC,
            version: wire::PROTOCOL_VERSION,
            kind: wire::kind::CLIENT,
        };
        let mut first = bytemuck::bytes_of(&hello).to_vec();
        first.extend_from_slice(bytemuck::bytes_of(settings));
        // Without SIGPIPE (MSG_NOSIGNAL): a server that closed the connection must not
        // kill the program.
        sock::send_with_fds(s.as_raw_fd(), &first, &[])
            .map_err(|e| fail(format!("{CLOSED_EARLY}: {e}")))?;
        let mut buf = [0u8; std::mem::size_of::<Welcome>()];
        let (n, fds) = sock::recv_with_fds(s.as_raw_fd(), &mut buf)
            .map_err(|e| fail(format!("{CLOSED_EARLY}: {e}")))?;
        let w: Welcome = wire::get(&buf[..n]).ok_or_else(|| {
            fail(format!(
                "{CLOSED_EARLY}: the server closed the connection before its welcome"
            ))
        })?;
        if w.magic != wire::HELLO_MAGIC || w.version != wire::PROTOCOL_VERSION {
            return Err(fail(format!(
                "server speaks protocol {} (this shim: {})",
                w.version,
                wire::PROTOCOL_VERSION
            )));
        }
        if w.status != 0 {
            // The server's reason follows the welcome, in the same send (at most 400
            // bytes, as text; none from an older server).
            let mut why = [0u8; 512];
            let _ = s.set_read_timeout(Some(std::time::Duration::from_millis(200)));
            let n = std::io::Read::read(&mut &s, &mut why).unwrap_or(0);
            let why = String::from_utf8_lossy(&why[..n]);
            let why: String = why.chars().filter(|c| !c.is_control()).collect();
            let said = if why.is_empty() {
                String::new()
            } else {
                format!(": {why}")
            };
            return Err((
                w.status,
                format!(
                    "the omps server refused this client{said} (CUDA error {})",
                    w.status
                ),
            ));
        }
        Self::attach(s, w, fds).map_err(fail)
    }

    fn attach(sock: UnixStream, w: Welcome, fds: Vec<OwnedFd>) -> Result<Conn, String> {
        let layout = w.layout.validate()?;
        let ndev = w.num_devices as usize;
        if fds.len() != 1 + ndev
            || ndev > layout.params.num_rings as usize
            || layout.total_len as u64 != w.segment_len
        {
            return Err("handshake carried the wrong descriptors".into());
        }
        let mut fds = fds.into_iter();
        let seg_fd = fds.next().expect("counted above");
        shm::check_segment(seg_fd.as_fd(), layout.total_len)
            .map_err(|e| format!("segment: {e}"))?;
        let seg_map = Mapping::map(seg_fd.as_fd(), layout.total_len)
            .map_err(|e| format!("mapping the segment: {e}"))?;
        // SAFETY: the mapping is total_len bytes and lives in the Conn beside the view.
        let seg = unsafe { SegmentView::new(seg_map.as_ptr(), layout) };
        if seg.header().magic != SEGMENT_MAGIC || seg.header().params != w.layout {
            return Err("segment header does not match the handshake".into());
        }
        let bells = fds
            .map(|fd| Mapping::map(fd.as_fd(), wire::DOORBELL_PAGE))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("mapping a doorbell: {e}"))?;
        let rings = (0..ndev)
            .map(|d| {
                let (h, data, cap) = seg.ring_parts(d);
                // SAFETY: ring d is inside the mapping owned by this Conn; this process is
                // its only producer (the server consumes).
                Mutex::new(unsafe { Producer::new(h, data, cap) })
            })
            .collect();
        let snapshot = Box::new(*seg.snapshot());
        let chans = (0..layout.params.num_channels)
            .map(|_| Mutex::new(ChanState::default()))
            .collect();
        Ok(Conn {
            sock,
            seg,
            _seg_map: seg_map,
            bells,
            rings,
            chans,
            snapshot,
            lost: AtomicBool::new(false),
            requests: Mutex::new(()),
            streams: Quota::new(w.max_streams),
            events: Quota::new(w.max_events),
        })
    }

    /// The socket's descriptor (tests that speak the request protocol by hand).
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }

    pub fn params(&self) -> LayoutParams {
        self.seg.layout.params
    }

    pub fn num_devices(&self) -> usize {
        self.rings.len()
    }

    /// A pinned-memory request on the socket; returns the server's CUresult.
    pub fn host_request(
        &self,
        kind: u32,
        addr: u64,
        len: u64,
        fd: Option<std::os::fd::RawFd>,
    ) -> Result<(), CUresult> {
        self.socket_request(kind, addr, len, fd).map(drop)
    }

    /// A request on the socket (wire::hostmem); returns the text that follows the reply.
    pub fn socket_request(
        &self,
        kind: u32,
        addr: u64,
        len: u64,
        fd: Option<std::os::fd::RawFd>,
    ) -> Result<Vec<u8>, CUresult> {
        // Device text is asked for during a fault too: an assert's message explains it.
        self.check_state(kind == wire::hostmem::PRINTF_FLUSH)?;
        let _one_at_a_time = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        let req = wire::HostMemRequest {
            kind,
            _pad: 0,
            addr,
            len,
        };
        let fds: Vec<_> = fd.into_iter().collect();
        sock::send_with_fds(self.sock.as_raw_fd(), bytemuck::bytes_of(&req), &fds)
            .map_err(|_| CUDA_ERROR_MPS_RPC_FAILURE)?;
        let mut buf = [0u8; std::mem::size_of::<wire::HostMemReply>()];
        let (n, _) = sock::recv_with_fds(self.sock.as_raw_fd(), &mut buf)
            .map_err(|_| CUDA_ERROR_MPS_RPC_FAILURE)?;
        let reply: wire::HostMemReply = wire::get(&buf[..n]).ok_or(CUDA_ERROR_MPS_RPC_FAILURE)?;
        let text_len = reply.text_len as usize;
        if text_len > wire::PRINTF_REPLY_MAX {
            return Err(CUDA_ERROR_MPS_RPC_FAILURE);
        }
        let mut text = vec![0u8; text_len];
        std::io::Read::read_exact(&mut &self.sock, &mut text)
            .map_err(|_| CUDA_ERROR_MPS_RPC_FAILURE)?;
        match reply.status {
            0 => Ok(text),
            e => Err(e),
        }
    }

    /// Wakes GPU `dev`'s worker if it sleeps.
    pub fn ring_bell(&self, dev: usize) {
        self.bell(dev).ring();
    }

    /// Waits until the server has handled everything queued so far on `dev`; returns the
    /// first asynchronous error since the last synchronizing call.
    /// The id the server gave this connection (`omps-ctl stats` lists it).
    pub fn client_id(&self) -> u32 {
        self.seg.header().client_id
    }

    pub fn ping(&self, dev: usize) -> Result<(), CUresult> {
        let mut ch = self.channel();
        ch.call(dev, Op::Ping, |call| bytemuck::bytes_of(&call).to_vec())
    }

    fn bell(&self, dev: usize) -> &Doorbell {
        // SAFETY: the doorbell page is mapped for the life of the Conn; Doorbell is atomics.
        unsafe { &*(self.bells[dev].as_ptr() as *const Doorbell) }
    }

    /// The server is gone, or cut us off: every call fails from now on.
    pub fn check_alive(&self) -> Result<(), CUresult> {
        self.check_state(false)
    }

    /// As [`Conn::check_alive`]; with `fault_ok`, a GPU fault is not an error.
    fn check_state(&self, fault_ok: bool) -> Result<(), CUresult> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(CUDA_ERROR_MPS_RPC_FAILURE);
        }
        let h = self.seg.header();
        match h.server_state.load(Ordering::Acquire) {
            state::ACTIVE => {}
            state::FAULT if fault_ok => {}
            _ => {
                let code = h.state_code.load(Ordering::Relaxed);
                return Err(if code != 0 {
                    code
                } else {
                    CUDA_ERROR_MPS_RPC_FAILURE
                });
            }
        }
        let mut p = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        if n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            if !self.lost.swap(true, Ordering::Relaxed) {
                eprintln!("omps: lost the connection to the omps server");
            }
            return Err(CUDA_ERROR_MPS_RPC_FAILURE);
        }
        Ok(())
    }

    /// Puts one record into GPU `dev`'s ring and rings the server if it sleeps.
    pub fn push(&self, dev: usize, op: Op, parts: &[&[u8]]) -> Result<(), CUresult> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.push_with(dev, op, len, |buf| {
            let mut at = 0;
            for p in parts {
                buf[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
        })
    }

    pub fn push_with(
        &self,
        dev: usize,
        op: Op,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), CUresult> {
        let ring = self.rings.get(dev).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        let mut fill = Some(fill);
        let mut ring = ring.lock().unwrap_or_else(|p| p.into_inner());
        let mut since: Option<Instant> = None;
        loop {
            let r = ring.try_push_with(op as u32, len, |b| (fill.take().expect("called once"))(b));
            match r {
                Ok(()) => {
                    if let Some(t) = since.filter(|_| crate::stats::enabled()) {
                        crate::stats::RING_FULL.add(t);
                    }
                    break;
                }
                Err(PushError::Full) => {
                    self.bell(dev).ring();
                    let t = since.get_or_insert_with(Instant::now);
                    // A full ring holds milliseconds of work: after a short spin, sleep,
                    // leaving the CPU to the server's workers (32 clients spinning on 16
                    // cores took it from them: 336k launches/s instead of 494k).
                    let waited = t.elapsed();
                    if waited > Duration::from_millis(1) {
                        self.check_alive()?;
                    }
                    if waited > Duration::from_micros(20) {
                        std::thread::sleep(Duration::from_micros(50));
                    } else {
                        std::hint::spin_loop();
                    }
                }
                Err(_) => return Err(CUDA_ERROR_INVALID_VALUE),
            }
        }
        drop(ring);
        self.bell(dev).ring();
        Ok(())
    }

    /// Takes a free channel, waiting if every one is busy.
    pub fn channel(&self) -> ChanGuard<'_> {
        let n = self.chans.len();
        let start = thread_slot() % n;
        loop {
            for i in 0..n {
                let idx = (start + i) % n;
                if let Ok(st) = self.chans[idx].try_lock() {
                    return ChanGuard {
                        idx: idx as u32,
                        st,
                        conn: self,
                    };
                }
            }
            std::thread::yield_now();
        }
    }

    pub fn seg(&self) -> &SegmentView {
        &self.seg
    }

    /// Spins briefly, then sleeps on the futex word until it holds `seq`.
    fn wait_word(&self, ch: &Channel, word: &AtomicU32, seq: u32) -> Result<(), CUresult> {
        let timed = crate::stats::enabled().then(Instant::now);
        let r = self.wait_word_untimed(ch, word, seq);
        if let Some(t) = timed {
            crate::stats::WAITS.add(t);
        }
        r
    }

    fn wait_word_untimed(&self, ch: &Channel, word: &AtomicU32, seq: u32) -> Result<(), CUresult> {
        // As the driver's default waits: spin while the answer is likely near (a graph or
        // a kernel of up to a few hundred microseconds), then yield the CPU between looks,
        // then sleep. A futex wake costs several microseconds that a synchronize of a short
        // graph would pay every time. While more clients are connected than the server has
        // CPUs it asks for less (`wait_active_us`): their spinning took the CPUs from the
        // server's lanes and each other.
        let plan = WaitPlan::from_header(self.seg.header().wait_active_us.load(Ordering::Relaxed));
        let start = Instant::now();
        loop {
            for _ in 0..64 {
                if word.load(Ordering::Acquire) == seq {
                    return Ok(());
                }
                std::hint::spin_loop();
            }
            if start.elapsed() > plan.spin {
                break;
            }
        }
        while start.elapsed() < plan.active {
            if word.load(Ordering::Acquire) == seq {
                return Ok(());
            }
            std::thread::yield_now();
        }
        let slept = crate::stats::enabled().then(Instant::now);
        let r = loop {
            ch.waiting.store(1, Ordering::SeqCst);
            let cur = word.load(Ordering::SeqCst);
            if cur == seq {
                break Ok(());
            }
            if let Err(e) = self.check_alive() {
                break Err(e);
            }
            if let WaitResult::TimedOut = futex::wait(word, cur, Some(Duration::from_millis(20))) {
                if let Err(e) = self.check_alive() {
                    break Err(e);
                }
            }
        };
        ch.waiting.store(0, Ordering::Relaxed);
        if let Some(t) = slept {
            crate::stats::SLEPT.add(t);
        }
        r
    }
}

fn thread_slot() -> usize {
    thread_local! { static SLOT: usize = {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() as usize }
    } }
    // During exit the thread's locals may be gone (static destructors that call CUDA).
    // SAFETY: gettid has no preconditions.
    SLOT.try_with(|s| *s)
        .unwrap_or_else(|_| unsafe { libc::gettid() as usize })
}

impl<'a> ChanGuard<'a> {
    fn chan(&self) -> &'a Channel {
        let conn: &'a Conn = self.conn;
        conn.seg
            .channel(self.idx as usize)
            .expect("own channel index")
    }

    pub fn next_call(&mut self) -> CallHdr {
        self.st.seq = self.st.seq.wrapping_add(1).max(1);
        CallHdr {
            channel: self.idx,
            seq: self.st.seq,
        }
    }

    /// Waits for the answer to `call` and returns its CUresult. The result is taken: the
    /// channel's staging chunks report through the same word, and a failed call must not
    /// fail the next transfer on this channel.
    pub fn wait(&self, call: CallHdr) -> Result<(), CUresult> {
        let ch = self.chan();
        self.conn.wait_word(ch, &ch.done, call.seq)?;
        match ch.result.swap(0, Ordering::Relaxed) {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// Sends a call record (its fixed part must start with `call`'s CallHdr) and waits.
    pub fn call(
        &mut self,
        dev: usize,
        op: Op,
        build: impl FnOnce(CallHdr) -> Vec<u8>,
    ) -> Result<(), CUresult> {
        let call = self.next_call();
        if crate::stats::enabled() {
            crate::stats::count_call(op as u32);
        }
        let rec = build(call);
        self.conn.push(dev, op, &[&rec])?;
        self.wait(call)
    }

    /// Reads the first `len` bytes (at most the reply area's) of the last call's reply.
    pub fn reply_bytes(&self, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.chan().read_reply(&mut b);
        b
    }

    /// Reads the inline reply of the last call.
    pub fn reply<T: bytemuck::Pod>(&self) -> T {
        let mut b = vec![0u8; std::mem::size_of::<T>()];
        self.chan().read_reply(&mut b);
        bytemuck::pod_read_unaligned(&b)
    }

    /// Waits until staging chunk `k` is free again; reports the error of its last transfer.
    pub fn wait_chunk(&mut self, k: usize) -> Result<(), CUresult> {
        let seq = self.st.chunk_seq[k];
        if seq == 0 {
            return Ok(());
        }
        let ch = self.chan();
        self.conn
            .wait_word(ch, ch.word(Word::Chunk(k as u8)).expect("k < CHUNKS"), seq)?;
        self.st.chunk_seq[k] = 0;
        match ch.result.swap(0, Ordering::Relaxed) {
            0 => Ok(()),
            e => Err(e),
        }
    }

    pub fn wait_all_chunks(&mut self) -> Result<(), CUresult> {
        let mut first = Ok(());
        for k in 0..CHUNKS_PER_CHANNEL {
            let r = self.wait_chunk(k);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Staging chunk `k` of this channel.
    pub fn chunk_ptr(&self, k: usize) -> (*mut u8, usize) {
        self.conn
            .seg
            .chunk(self.idx as usize, k)
            .expect("own channel")
    }

    /// Marks chunk `k` busy with a new transfer and returns that transfer's sequence.
    pub fn claim_chunk(&mut self, k: usize) -> u32 {
        self.st.seq = self.st.seq.wrapping_add(1).max(1);
        self.st.chunk_seq[k] = self.st.seq;
        self.st.seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_connection_closed_before_its_welcome_is_tried_again() {
        let d = std::env::temp_dir().join(format!("omps-shim-retry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join(sock::SOCKET_NAME);
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // The first two are closed at once (as a server short of handshake slots does);
        // the third is answered: a refusal, CUDA_ERROR_MPS_MAX_CLIENTS_REACHED.
        let server = std::thread::spawn(move || {
            for _ in 0..2 {
                drop(l.accept().unwrap());
            }
            let (s, _) = l.accept().unwrap();
            let mut hello =
                [0u8; std::mem::size_of::<Hello>() + std::mem::size_of::<wire::ClientSettings>()];
            std::io::Read::read_exact(&mut &s, &mut hello).unwrap();
            let w = Welcome {
                magic: wire::HELLO_MAGIC,
                version: wire::PROTOCOL_VERSION,
                status: 808,
                ..Default::default()
            };
            sock::send_with_fds(s.as_raw_fd(), bytemuck::bytes_of(&w), &[]).unwrap();
        });
        let Err((code, why)) = Conn::connect_with(&path, &wire::ClientSettings::none()) else {
            panic!("connected to a server that refuses");
        };
        server.join().unwrap();
        assert_eq!(code, 808, "the answer after two closed connections: {why}");
        // One that is always closed fails within the bounded while.
        let l = std::os::unix::net::UnixListener::bind(d.join("closing")).unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = done.clone();
        l.set_nonblocking(true).unwrap();
        let server = std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((s, _)) = l.accept() {
                    drop(s);
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        let t = std::time::Instant::now();
        let Err((code, _)) = Conn::connect_with(&d.join("closing"), &wire::ClientSettings::none())
        else {
            panic!("connected to a server that closes every connection");
        };
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        server.join().unwrap();
        assert_eq!(code, CUDA_ERROR_MPS_CONNECTION_FAILED);
        assert!(t.elapsed() < CLOSED_RETRY + std::time::Duration::from_secs(1));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_server_of_another_uid_fails_the_connection() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: only root can listen as another uid");
            return;
        }
        let d = std::env::temp_dir().join(format!("omps-shim-peer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let path = d.join(sock::SOCKET_NAME);
        let l = match sock::listen_as_uid(&path, 65534) {
            Ok(l) => l,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                eprintln!("skipped: cannot take another uid here ({e})");
                return;
            }
            Err(e) => panic!("listening as uid 65534: {e}"),
        };
        // The impostor hangs up at once, so an unchecked connection fails too, later
        // and for another reason, rather than waiting for a welcome forever.
        let impostor = std::thread::spawn(move || drop(l.accept()));
        let Err((code, why)) = Conn::connect_with(&path, &wire::ClientSettings::none()) else {
            panic!("connected to another user's server");
        };
        impostor.join().unwrap();
        assert_eq!(code, CUDA_ERROR_MPS_CONNECTION_FAILED);
        assert!(why.contains(&path.display().to_string()), "{why}");
        assert!(why.contains("uid 65534") && why.contains("uid 0"), "{why}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
