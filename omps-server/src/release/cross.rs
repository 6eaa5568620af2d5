//! The types of cross-GPU fencing (crate::release::peer_fence), on their own so that the
//! client's state ([`crate::client::ClientShared`] holds a [`CrossQueue`] per GPU) and a
//! [`crate::session::Release`] (which carries a [`CrossPart`]) can hold them without
//! depending on the workers, sessions and releaser that act on them: a held release is
//! a closure here, which the worker that held it made.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What a [`CrossRelease`] does once every fence for it has passed: sends the release to
/// its GPU's releaser (made by crate::worker's `hold`).
pub type HeldJob = Box<dyn FnOnce() + Send>;

/// A release held until every GPU's fence for it has passed.
pub struct CrossRelease {
    /// Fences still to pass.
    left: AtomicUsize,
    job: Mutex<Option<HeldJob>>,
}

impl CrossRelease {
    /// A release that runs `job` once `fences` fences have passed.
    pub fn new(fences: usize, job: HeldJob) -> Self {
        CrossRelease {
            left: AtomicUsize::new(fences),
            job: Mutex::new(Some(job)),
        }
    }

    /// One fence passed (or none is needed): the last one sends the release to its GPU's
    /// releaser.
    pub fn done(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let job = self.job.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(j) = job {
            j();
        }
    }
}

/// Per client and GPU: the fences other GPUs asked this GPU's worker for.
#[derive(Default)]
pub enum CrossQueue {
    /// The session runs (or is about to: the control thread opens the queue before it
    /// hands the client to the workers): its worker takes each once it has read the
    /// client's ring up to the position given with it.
    Open(Vec<(Arc<CrossRelease>, u64)>),
    /// The session ended; these pass when the fence of its last work does.
    Retired(Vec<Arc<CrossRelease>>),
    /// The session's last work is done: nothing of the client runs on this GPU.
    #[default]
    Released,
}

/// A release's part in cross-GPU fencing: tokens whose fence on this GPU it carries, and
/// whether its passing means the client's session here has nothing left running.
#[derive(Default)]
pub struct CrossPart {
    pub tokens: Vec<Arc<CrossRelease>>,
    pub settles: bool,
}

impl CrossPart {
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty() && !self.settles
    }
}
