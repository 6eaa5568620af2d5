//! Host memory the GPU no longer needs, unregistered when the GPU is quiet.
//!
//! `cuMemHostUnregister` waits for all work of the context and holds up every thread's
//! launches meanwhile (H100, `scripts/probe/blocking_calls.cu`): a client that exits while
//! another runs a 2 s kernel stalled every client for the rest of it (1.44 s, the bystander
//! probe). So a dead client's segment and its pinned allocations stay registered, and
//! mapped, until no stream has work; then they go at no cost. A GPU that never rests gets
//! them unregistered anyway after [`PATIENCE`], or once [`MAX_WAITING`] bytes wait.

use crate::gpu::Gpu;
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

fn run(rx: mpsc::Receiver<Waiting>, count: &std::sync::atomic::AtomicUsize) {
    let mut queue: Vec<Waiting> = Vec::new();
    loop {
        let next = if queue.is_empty() {
            rx.recv().ok()
        } else {
            match rx.recv_timeout(POLL) {
                Ok(w) => Some(w),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        };
        if let Some(w) = next {
            queue.push(w);
            continue;
        }
        // Per GPU: all of its ranges go when it is quiet; the oldest when it has been
        // busy too long or too much waits.
        let mut total: u64 = queue.iter().map(|w| w.len).sum();
        let mut i = 0;
        while i < queue.len() {
            let w = &queue[i];
            let forced = w.since.elapsed() > PATIENCE || total > MAX_WAITING;
            if forced || w.gpu.quiet() {
                if forced {
                    tracing::warn!(
                        bytes = w.len,
                        "unregistering host memory on a busy GPU: every client waits for its running kernels"
                    );
                }
                let w = queue.swap_remove(i);
                total -= w.len;
                unregister(w, count);
            } else {
                i += 1;
            }
        }
    }
}

fn unregister(w: Waiting, count: &std::sync::atomic::AtomicUsize) {
    // SAFETY: the sender's promise: registered, unused, and mapped until `keep` drops.
    if let Err(e) = unsafe { w.gpu.unregister_host(w.addr as *mut u8) } {
        tracing::warn!("unregistering host memory failed: CUDA error {}", e.0);
    }
    drop(w.keep);
    count.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
}
