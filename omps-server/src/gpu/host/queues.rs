//! Two limits of a real GPU that the host GPU otherwise leaves out, played on request for
//! tests of clients that try to stall others (issue 23):
//! - **hardware queues** ([`HostGpu::model_queues`]): stream `i` uses queue
//!   `i % connections`, and a queue runs its commands in order, so a wait on a word not yet
//!   written holds up every later command of every stream on that queue. Only stream
//!   memory operations are played (a wait, a completion word): a synchronization's word
//!   written on a held queue lands once the queue moves again.
//! - **the driver's depth bound** ([`HostGpu::model_depth`]): while the stuck switch plays a
//!   long kernel, completion words land only once it ends, and a stream takes about a
//!   thousand operations; the next one blocks the calling thread until the GPU moves (the
//!   thread is a worker lane: every client of it waits).

use super::queue_model::{met, Held, DRIVER_DEPTH};
use super::state::HostGpu;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering;

impl HostGpu {
    /// Plays the GPU's hardware queues (see the module's text).
    pub fn model_queues(&self, on: bool) {
        let mut m = self.model.lock().unwrap();
        m.queues_on = on;
        m.connections = crate::gpu::Gpu::layout(self).connections.max(1);
        if !on {
            m.held.clear();
        }
    }

    /// Plays the driver's bound on a stream's pending operations (see the module's text).
    pub fn model_depth(&self, on: bool) {
        self.model.lock().unwrap().depth_on = on;
    }

    /// The most operations one stream had pending while the GPU was stuck.
    pub fn deepest_stream(&self) -> usize {
        self.model.lock().unwrap().deepest
    }

    /// Completion words waiting on a held queue now.
    pub fn held_on_queues(&self) -> usize {
        let mut m = self.model.lock().unwrap();
        m.run();
        m.held
            .values()
            .flatten()
            .filter(|h| matches!(h, Held::Write { .. }))
            .count()
    }

    /// The GPU moved: nothing is pending any more.
    pub(super) fn unstick_model(&self) {
        let mut m = self.model.lock().unwrap();
        m.pending.clear();
        for (addr, value) in std::mem::take(&mut m.stuck_writes) {
            // SAFETY: as in met(): a registered, aligned host word.
            unsafe { (*(addr as *const AtomicU32)).store(value, Ordering::Release) }
        }
    }

    /// Moves the queues (called where the server asks the GPU how far it got).
    pub(super) fn run_queues(&self) {
        let mut m = self.model.lock().unwrap();
        if m.queues_on {
            m.run();
        }
    }

    /// One operation queued on stream `s`: while the GPU is stuck and the depth bound is
    /// played, the caller blocks past [`DRIVER_DEPTH`] until the GPU moves, as in the driver.
    pub(super) fn queued(&self, s: usize) {
        let over = {
            let mut m = self.model.lock().unwrap();
            if !m.depth_on || !*self.stuck.lock().unwrap() {
                return;
            }
            let n = m.pending.entry(s).or_default();
            *n += 1;
            let n = *n;
            m.deepest = m.deepest.max(n);
            n > DRIVER_DEPTH
        };
        if over {
            let stuck = self.stuck.lock().unwrap();
            drop(self.unstuck.wait_while(stuck, |s| *s).unwrap());
        }
    }

    /// A wait on stream `s`: true when a held queue took it (played queues only).
    pub(super) fn hold_wait(&self, addr: usize, value: u32, eq: bool, s: usize) -> bool {
        let mut m = self.model.lock().unwrap();
        if !m.queues_on {
            return false;
        }
        m.run();
        let q = s % m.connections;
        if !m.held.contains_key(&q) && met(addr, value, eq) {
            return false;
        }
        m.held
            .entry(q)
            .or_default()
            .push_back(Held::Wait { addr, value, eq });
        true
    }

    /// A word written on stream `s`: true when a held queue, or the long kernel the stuck
    /// switch plays (with the depth bound played), took it, to land later.
    pub(super) fn hold_write(&self, addr: usize, value: u32, s: usize) -> bool {
        let mut m = self.model.lock().unwrap();
        if m.depth_on && *self.stuck.lock().unwrap() {
            m.stuck_writes.push((addr, value));
            return true;
        }
        if !m.queues_on {
            return false;
        }
        m.run();
        let q = s % m.connections;
        match m.held.get_mut(&q) {
            Some(h) => {
                h.push_back(Held::Write { addr, value });
                true
            }
            None => false,
        }
    }
}
