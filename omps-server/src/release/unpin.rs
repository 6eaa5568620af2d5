//! Host memory the GPU no longer needs, unregistered when the GPU is quiet.
//!
//! `cuMemHostUnregister` waits for all work of the context and holds up every thread's
//! launches meanwhile (H100, `scripts/probe/blocking_calls.cu`): a client that exits while
//! another runs a 2 s kernel stalled every client for the rest of it (1.44 s, the bystander
//! probe). So a dead client's segment and its pinned allocations stay registered, and
//! mapped, until no stream has work; then they go at no cost. A GPU that never rests gets
//! them unregistered anyway after [`PATIENCE`], or once [`MAX_WAITING`] bytes wait.

use crate::gpu::Gpu;
use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The longest a range waits for a quiet GPU.
pub const PATIENCE: Duration = Duration::from_secs(30);
/// Bytes waiting beyond which the oldest go at once, quiet or not.
pub const MAX_WAITING: u64 = 2 << 30;
/// How often a waiting range asks whether the GPU is quiet (each ask queries every stream
/// in use, about a microsecond each).
const POLL: Duration = Duration::from_millis(10);

/// What a range keeps alive until it is unregistered (its mapping).
pub type Keep = Box<dyn Send>;

struct Waiting {
    gpu: Arc<dyn Gpu>,
    addr: usize,
    len: u64,
    keep: Keep,
    since: Instant,
}

pub struct Unpinner {
    tx: Mutex<mpsc::Sender<Waiting>>,
    /// Ranges waiting now (tests and the log).
    waiting: Arc<std::sync::atomic::AtomicUsize>,
}

/// The process's unpinner (one thread serves every GPU: registrations are process-wide).
pub fn unpinner() -> &'static Unpinner {
    static U: OnceLock<Unpinner> = OnceLock::new();
    U.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Waiting>();
        let waiting: Arc<std::sync::atomic::AtomicUsize> = Default::default();
        let w = waiting.clone();
        let spawned = std::thread::Builder::new()
            .name("omps-unpin".into())
            .spawn(move || run(rx, &w));
        if let Err(e) = spawned {
            tracing::error!("cannot start the unpin thread: {e}; host memory stays pinned");
        }
        Unpinner {
            tx: Mutex::new(tx),
            waiting,
        }
    })
}

impl Unpinner {
    /// Unregisters `addr` (`len` bytes) from `gpu` once the GPU is quiet, then drops
    /// `keep`.
    ///
    /// # Safety
    /// `addr` was registered with `gpu` and no transfer to or from it is in flight or will
    /// be queued; `keep` holds its mapping.
    pub unsafe fn unregister_later(&self, gpu: Arc<dyn Gpu>, addr: *mut u8, len: u64, keep: Keep) {
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let w = Waiting {
            gpu,
            addr: addr as usize,
            len,
            keep,
            since: Instant::now(),
        };
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(mpsc::SendError(w)) = tx.send(w) {
            unregister(w, &self.waiting);
        }
    }

    /// Ranges still waiting for a quiet GPU.
    pub fn waiting(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Serves the queue. Each range is looked at within [`POLL`] of its arrival however fast
/// new ones come (once nothing went until 10 ms passed without a message: 600 clients
/// connecting and closing in a loop left 600 segments pinned), and the byte cap holds at
/// every arrival.
fn run(rx: mpsc::Receiver<Waiting>, count: &std::sync::atomic::AtomicUsize) {
    let mut queue: VecDeque<Waiting> = VecDeque::new();
    let mut total: u64 = 0;
    let mut next_look = Instant::now();
    loop {
        let next = if queue.is_empty() {
            match rx.recv() {
                Ok(w) => Some(w),
                Err(_) => return,
            }
        } else {
            match rx.recv_timeout(next_look.saturating_duration_since(Instant::now())) {
                Ok(w) => Some(w),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        };
        if let Some(w) = next {
            if queue.is_empty() {
                next_look = Instant::now() + POLL;
            }
            total = total.saturating_add(w.len);
            queue.push_back(w);
            // Too much waits: the oldest go now, quiet GPU or not.
            while total > MAX_WAITING {
                let Some(w) = queue.pop_front() else { break };
                total = total.saturating_sub(w.len);
                forced(w, count);
            }
        }
        if Instant::now() >= next_look {
            total = total.saturating_sub(sweep(&mut queue, count));
            next_look = Instant::now() + POLL;
        }
    }
}

/// Unregisters every range whose GPU is quiet, and those that waited past [`PATIENCE`];
/// returns the bytes that went. Each GPU is asked once.
fn sweep(queue: &mut VecDeque<Waiting>, count: &std::sync::atomic::AtomicUsize) -> u64 {
    let mut quiet: Vec<(*const (), bool)> = Vec::new();
    let mut gone = 0;
    let mut kept = VecDeque::with_capacity(queue.len());
    for w in queue.drain(..) {
        let key = Arc::as_ptr(&w.gpu) as *const ();
        let is_quiet = match quiet.iter().find(|(k, _)| *k == key) {
            Some(&(_, q)) => q,
            None => {
                let q = w.gpu.quiet();
                quiet.push((key, q));
                q
            }
        };
        if is_quiet {
            gone += w.len;
            unregister(w, count);
        } else if w.since.elapsed() > PATIENCE {
            gone += w.len;
            forced(w, count);
        } else {
            kept.push_back(w);
        }
    }
    *queue = kept;
    gone
}

/// Unregisters `w` on a GPU that is not quiet: every client waits for its running kernels.
fn forced(w: Waiting, count: &std::sync::atomic::AtomicUsize) {
    tracing::warn!(
        bytes = w.len,
        "unregistering host memory on a busy GPU: every client waits for its running kernels"
    );
    unregister(w, count);
}

fn unregister(w: Waiting, count: &std::sync::atomic::AtomicUsize) {
    // SAFETY: the sender's promise: registered, unused, and mapped until `keep` drops.
    if let Err(e) = unsafe { w.gpu.unregister_host(w.addr as *mut u8) } {
        tracing::warn!("unregistering host memory failed: CUDA error {}", e.0);
    }
    drop(w.keep);
    count.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::host::HostGpu;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A thread serving a queue of its own, sent `n` ranges one a millisecond, each a
    /// buffer registered with `host` that claims `len` bytes. Returns the most ranges seen
    /// waiting once the first `warmup` were sent. Each send waits for the thread to take
    /// the range (a loaded machine may run it late; what it has not taken is not its
    /// queue); with `settle`, the count is read once it is that low, or 200 ms on.
    fn churn(
        host: &Arc<HostGpu>,
        n: usize,
        len: u64,
        warmup: usize,
        settle: Option<usize>,
    ) -> usize {
        let gpu: Arc<dyn Gpu> = host.clone();
        let (tx, rx) = mpsc::sync_channel::<Waiting>(0);
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let t = std::thread::spawn(move || run(rx, &c));
        let mut most = 0;
        for i in 0..n {
            let mut buf = vec![0u8; 64].into_boxed_slice();
            let addr = buf.as_mut_ptr();
            // SAFETY: the buffer lives in `keep` until the range is unregistered.
            unsafe { gpu.register_host(addr, buf.len()) }.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            let w = Waiting {
                gpu: gpu.clone(),
                addr: addr as usize,
                len,
                keep: Box::new(buf),
                since: Instant::now(),
            };
            tx.send(w).unwrap();
            // Never 10 ms without a message.
            std::thread::sleep(Duration::from_millis(1));
            if let Some(k) = settle {
                let t = Instant::now();
                while count.load(Ordering::SeqCst) > k && t.elapsed() < Duration::from_millis(200) {
                    std::thread::yield_now();
                }
            }
            if i >= warmup {
                most = most.max(count.load(Ordering::SeqCst));
            }
        }
        drop(tx);
        t.join().unwrap();
        most
    }

    #[test]
    fn ranges_go_while_new_ones_keep_coming() {
        let host = Arc::new(HostGpu::new(0, 1 << 20));
        let most = churn(&host, 300, 64, 100, None);
        // A look every 10 ms: some 10 to 20 wait at any time (on a loaded machine more).
        assert!(most < 100, "{most} of 300 ranges still waiting under churn");
    }

    #[test]
    fn the_byte_cap_holds_at_every_arrival() {
        let host = Arc::new(HostGpu::new(0, 1 << 20));
        // A GPU that never rests, and ranges of 1 GiB each: no more than 2 GiB waits.
        host.stick_releases(true);
        let most = churn(&host, 100, 1 << 30, 10, Some(3));
        host.stick_releases(false);
        assert!(most <= 3, "{most} GiB waiting, over the 2 GiB cap");
    }
}
