//! Client segments made ahead of the clients that will use them.
//!
//! A segment is a memfd, mapped here and registered with the driver so the GPU reaches
//! its staging chunks and completion words. Registering 32 MiB takes 1-3.5 ms and holds up
//! every launch into the context meanwhile (`scripts/probe/blocking_calls.cu`); made on
//! the control thread at connect, it also made eight processes starting at once wait for
//! each other's (18-109 ms to the first `cudaMalloc`). A thread keeps a few segments
//! ready, so a connecting client takes one at once and the cost is paid ahead of it.
//!
//! Only the first [`STAGING_AHEAD`] clients get their staging registered ahead (a spare,
//! or one made whole at connect). A later client's segment has its channel headers and
//! host-function page registered, and each channel's staging chunks at the first copy
//! through it (`ClientShared::staging_ready`): registration pins every page (resident in
//! the server), and 1,024 clients that mostly never copy through staging pinned 4 GB.

use crate::gpu::Gpu;
use omps_ring::segment::Layout;
use omps_ring::shm::{self, Mapping};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// The descriptor, its mapping, and the GPU it is registered with.
pub type Parts = (OwnedFd, Mapping, Option<Arc<dyn Gpu>>);

/// Connected clients below which a new client's staging is registered with its segment
/// (a spare's, so the first clients start and copy as before). Beyond, a channel's staging
/// is registered at its first copy, on the lane: 4 MiB (1 MiB in a small segment) once
/// per channel used, where the pool registers 32 MiB per segment (1-3.5 ms, holding up
/// every launch into the context meanwhile), against 32 MiB pinned, resident in the
/// server, for every client whether or not it ever copies through staging.
pub const STAGING_AHEAD: usize = 4;

/// What of a segment's registered range [`Prepared::make`] registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staging {
    /// All of it, as one registration: channel headers and every channel's staging.
    Ahead,
    /// The channel headers and host-function page; each channel's staging is registered
    /// at its first copy (`ClientShared::staging_ready`).
    AtFirstCopy,
}

/// A fresh segment: zeroed, mapped, registered (when there is a GPU).
pub struct Prepared {
    /// None once handed over.
    parts: Option<Parts>,
    registered_at: *mut u8,
    staging: Staging,
    /// The context generation it was registered in: a reset drops registrations.
    generation: u64,
}

// SAFETY: the raw pointer only names the registered range for unregistering; the mapping
// it points into moves with the value.
unsafe impl Send for Prepared {}

impl Prepared {
    /// Makes one segment for `layout` and registers with `gpu` its registered range, or
    /// with [`Staging::AtFirstCopy`] the part of it every client needs.
    pub fn make(
        layout: &Layout,
        gpu: Option<&Arc<dyn Gpu>>,
        staging: Staging,
    ) -> std::io::Result<Prepared> {
        let fd = shm::create_segment("omps-client", layout.total_len)?;
        let map = Mapping::map(fd.as_fd(), layout.total_len)?;
        let (off, len) = match staging {
            Staging::Ahead => layout.registered_range(),
            Staging::AtFirstCopy => layout.control_range(),
        };
        // SAFETY: off + len lies inside the mapping (the layout says so).
        let at = unsafe { map.as_ptr().add(off) };
        if let Some(g) = gpu {
            // SAFETY: the range is inside the mapping, which outlives the registration
            // (Drop, or ClientShared, unregisters before unmapping).
            unsafe { g.register_host(at, len) }.map_err(|e| {
                std::io::Error::other(format!(
                    "registering client memory failed: CUDA error {}",
                    e.0
                ))
            })?;
        }
        Ok(Prepared {
            parts: Some((fd, map, gpu.cloned())),
            registered_at: at,
            staging,
            generation: 0,
        })
    }

    /// Whether its staging is registered already, or waits for the first copies.
    pub fn staging(&self) -> Staging {
        self.staging
    }

    /// The segment's parts, for a client that now owns them (and unregisters at its end).
    pub fn hand_over(mut self) -> Parts {
        self.parts.take().expect("handed over once")
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if let Some((_, _, Some(g))) = &self.parts {
            // SAFETY: registered by make() and not handed over; unmapped only after this.
            if let Err(e) = unsafe { g.unregister_host(self.registered_at) } {
                tracing::warn!("unregistering a spare segment failed: {}", e.0);
            }
        }
    }
}

struct State {
    ready: Vec<Prepared>,
    quit: bool,
}

/// The GPU's context state the pool follows: its generation, and whether it is faulted
/// (registering then fails, and the reset to come would drop it anyway).
#[derive(Clone, Default)]
pub struct ContextState {
    pub generation: Arc<AtomicU64>,
    pub faulted: Arc<AtomicBool>,
}

/// Up to `spare` segments kept ready by a thread of their own.
pub struct SegmentPool {
    state: Arc<(Mutex<State>, Condvar)>,
    spare: usize,
    context: ContextState,
}

impl SegmentPool {
    pub fn start(
        layout: Layout,
        gpu: Option<Arc<dyn Gpu>>,
        spare: usize,
        context: ContextState,
    ) -> SegmentPool {
        let state = Arc::new((
            Mutex::new(State {
                ready: Vec::new(),
                quit: false,
            }),
            Condvar::new(),
        ));
        let s = state.clone();
        let ctx = context.clone();
        if spare > 0 {
            let spawned = std::thread::Builder::new()
                .name("omps-segments".into())
                .spawn(move || refill(&s, &layout, gpu.as_ref(), spare, &ctx));
            if let Err(e) = spawned {
                tracing::warn!("no segment pool ({e}): segments are made at connect");
            }
        }
        SegmentPool {
            state,
            spare,
            context,
        }
    }

    /// A ready segment registered in the current context, if one is; the pool then makes
    /// another. Segments from before a context reset are thrown away.
    pub fn take(&self) -> Option<Prepared> {
        let now = self.context.generation.load(Ordering::SeqCst);
        let (m, cv) = &*self.state;
        let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
        st.ready.retain(|p| p.generation == now);
        let p = st.ready.pop();
        drop(st);
        cv.notify_all();
        p
    }

    pub fn spare(&self) -> usize {
        self.spare
    }
}

impl Drop for SegmentPool {
    fn drop(&mut self) {
        let (m, cv) = &*self.state;
        let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
        st.quit = true;
        st.ready.clear();
        cv.notify_all();
    }
}

fn refill(
    state: &(Mutex<State>, Condvar),
    layout: &Layout,
    gpu: Option<&Arc<dyn Gpu>>,
    spare: usize,
    context: &ContextState,
) {
    let (m, cv) = state;
    loop {
        if context.faulted.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(100));
            continue;
        }
        // Read before registering: a reset meanwhile makes the segment stale, not wrong.
        let generation = context.generation.load(Ordering::SeqCst);
        {
            let st = m.lock().unwrap_or_else(|e| e.into_inner());
            let st = cv
                .wait_while(st, |s| !s.quit && s.ready.len() >= spare)
                .unwrap_or_else(|e| e.into_inner());
            if st.quit {
                return;
            }
        }
        match Prepared::make(layout, gpu, Staging::Ahead) {
            Ok(mut p) => {
                p.generation = generation;
                let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
                if st.quit {
                    return;
                }
                st.ready.push(p);
            }
            Err(e) => {
                tracing::warn!("cannot make a spare segment: {e}");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }
}
