//! A module load, JIT compile or link running off the lane as its session keeps it
//! ([`Pending`]), and what is given back of one whose client left before it was done:
//! below the session (state.rs holds one) and the family that starts and completes them
//! (compile.rs).

use crate::client::account::Account;
use crate::client::ClientShared;
use crate::gpu::{Gpu, GpuResult, LoadedModule};
use crate::image::module_cache::Defaults;
use crate::image::verifier::Work as Kind;
use crate::release::given::Release;
use crate::worker::GpuShared;
use omps_ring::wire::CallHdr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// The work itself, as a session hands it to the compile threads: it is given what tells
/// whether its client still waits for it.
pub(in crate::session) type Work = Box<dyn FnOnce(&Wanted) -> Outcome + Send>;

/// What work off the lane came to.
pub(in crate::session) enum Outcome {
    /// It stopped the verifier: refused, never given to the server's driver.
    Refused(Kind),
    /// A module load: the module, its settable attributes if shareable, whether its code
    /// prints, and the image (for the module cache).
    Load {
        r: GpuResult<LoadedModule>,
        defaults: Option<Defaults>,
        printf: u64,
        blob: Vec<u8>,
    },
    /// A JIT load: the module, the compiler's logs, whether its code prints.
    Jit {
        r: GpuResult<LoadedModule>,
        info: String,
        error: String,
        printf: u64,
    },
    /// A link: the image and the linker's logs.
    Link {
        r: GpuResult<Vec<u8>>,
        info: String,
        error: String,
    },
    /// The work panicked (a bug): its client is cut off, as for a record the lane failed.
    Panicked,
    /// Its client left before the driver was reached: nothing was loaded.
    Abandoned,
}

impl Outcome {
    /// The module it loaded, if any.
    pub(in crate::session) fn module(&self) -> Option<u64> {
        match self {
            Outcome::Load { r: Ok(m), .. } | Outcome::Jit { r: Ok(m), .. } => Some(m.handle),
            _ => None,
        }
    }
}

pub(in crate::session) enum State {
    Running,
    Done(Outcome),
    /// Taken by its session, or left by it: nothing more to do with it there.
    Over,
}

/// What the work and its session share.
pub(in crate::session) struct Slot {
    pub(in crate::session) state: Mutex<State>,
    pub(in crate::session) leftover: Leftover,
}

impl Slot {
    pub(in crate::session) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What to give back of work whose client left while it ran.
pub(in crate::session) struct Leftover {
    pub(in crate::session) client: Arc<ClientShared>,
    pub(in crate::session) gpu: Arc<dyn Gpu>,
    pub(in crate::session) shared: Arc<GpuShared>,
    /// The context generation it ran in (no reset runs while it does: crate::image::compile).
    pub(in crate::session) generation: u64,
    /// What its module's variables were charged to the client.
    pub(in crate::session) charged: u64,
}

impl Leftover {
    pub(in crate::session) fn give_back(&self, out: Outcome) {
        match out.module() {
            // Through the releaser: an unload waits for running kernels, a compile thread
            // must not.
            Some(handle) => crate::worker::free_on(
                &self.shared,
                &self.gpu,
                self.client.clone(),
                Release {
                    modules: vec![handle],
                    module_bytes: self.charged,
                    ..Default::default()
                },
                false,
                Some(self.generation),
            ),
            None => self.client.uncharge(self.gpu.ordinal(), self.charged),
        }
    }
}

/// What work off the lane asks whether its client still waits for it (a job of a client
/// gone is not given to the verifier or the driver: review 4).
pub(in crate::session) struct Wanted(pub(in crate::session) Arc<Slot>);

impl Wanted {
    /// Whether its client is gone (it will take no outcome).
    pub(in crate::session) fn gone(&self) -> bool {
        matches!(*self.0.lock(), State::Over)
    }

    /// Whose check this is to the verifier (`Account::tenant`).
    pub(in crate::session) fn tenant(&self) -> usize {
        self.0.leftover.client.account.tenant()
    }
}

/// A process's turn at the compile threads: at most one job per account is queued or
/// running, over all its connections and GPUs, and after its client left too, until the
/// job ends or is dropped (crate::image::compile).
pub(in crate::session) struct Turn(Arc<Account>);

impl Turn {
    /// The turn of `account`, if no job of it is queued or running.
    pub(in crate::session) fn take(account: &Arc<Account>) -> Option<Turn> {
        account
            .compiling
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()
            .map(|_| Turn(account.clone()))
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.compiling.store(false, Ordering::SeqCst);
    }
}

/// A job on the compile threads: dropped unrun (its client gone, or the threads with it),
/// it gives back what its client was charged and the process's turn.
pub(in crate::session) struct Job {
    pub(in crate::session) slot: Arc<Slot>,
    pub(in crate::session) turn: Option<Turn>,
    pub(in crate::session) work: Option<Work>,
}

impl Job {
    /// Runs the work, unless its client is gone, and leaves the outcome for its session
    /// (or gives it back, the session gone).
    pub(in crate::session) fn run(mut self) {
        let wanted = Wanted(self.slot.clone());
        let out = match self.work.take() {
            Some(_) if wanted.gone() => Outcome::Abandoned,
            Some(work) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&wanted)))
                .unwrap_or(Outcome::Panicked),
            None => Outcome::Abandoned,
        };
        self.done(out);
    }

    /// The process's turn ends before the outcome shows: its next load, sent once this
    /// one is answered, finds the turn free.
    fn done(&mut self, out: Outcome) {
        drop(self.turn.take());
        let mut st = self.slot.lock();
        if matches!(*st, State::Running) {
            *st = State::Done(out);
        } else {
            drop(st);
            self.slot.leftover.give_back(out);
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.work.take().is_some() {
            self.done(Outcome::Abandoned);
        }
    }
}

/// The record a session waits on while its work runs off the lane, or waits for its
/// process's turn (`waiting`: the work not yet handed on, the client's ring held).
pub(in crate::session) struct Pending {
    pub(in crate::session) call: CallHdr,
    pub(in crate::session) slot: Arc<Slot>,
    pub(in crate::session) waiting: Option<Work>,
}

impl Drop for Pending {
    /// The session goes (its client left) or has taken the outcome: a result not taken
    /// is given back now, one still to come by the thread that runs it (or that drops
    /// it unrun), and the charge of work never handed on now too.
    fn drop(&mut self) {
        let left = std::mem::replace(&mut *self.slot.lock(), State::Over);
        if let State::Done(out) = left {
            self.slot.leftover.give_back(out);
        } else if self.waiting.take().is_some() {
            self.slot.leftover.give_back(Outcome::Abandoned);
        }
    }
}
