//! A module load, JIT compile or link running off the lane as its session keeps it
//! ([`Pending`]), and what is given back of one whose client left before it was done:
//! below the session (state.rs holds one) and the family that starts and completes them
//! (compile.rs).

use crate::client::ClientShared;
use crate::gpu::{Gpu, GpuResult, LoadedModule};
use crate::image::module_cache::Defaults;
use crate::image::verifier::Work;
use crate::release::given::Release;
use crate::worker::GpuShared;
use omps_ring::wire::CallHdr;
use std::sync::{Arc, Mutex};

/// What work off the lane came to.
pub(in crate::session) enum Outcome {
    /// It stopped the verifier: refused, never given to the server's driver.
    Refused(Work),
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

/// The record a session waits on while its work runs off the lane.
pub(in crate::session) struct Pending {
    pub(in crate::session) call: CallHdr,
    pub(in crate::session) slot: Arc<Slot>,
}

impl Drop for Pending {
    /// The session goes (its client left) or has taken the outcome: a result not taken
    /// is given back now, one still to come by the thread that runs it.
    fn drop(&mut self) {
        let left = std::mem::replace(&mut *self.slot.lock(), State::Over);
        if let State::Done(out) = left {
            self.slot.leftover.give_back(out);
        }
    }
}
