//! What the server knows of one connected client, shared by the control thread and every
//! GPU worker.

use crate::gpu::Gpu;
use omps_ring::futex;
use omps_ring::segment::{state, SegmentView, CHUNKS_PER_CHANNEL, MAX_DEVICES};
use omps_ring::shm::Mapping;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

pub struct ClientShared {
    pub id: u32,
    pub pid: i32,
    pub name: String,
    pub seg: SegmentView,
    pub socket: OwnedFd,
    /// Device memory in use, per GPU, in bytes.
    pub mem_bytes: [AtomicU64; MAX_DEVICES],
    /// Records served, all GPUs.
    pub commands: AtomicU64,
    /// Hung up, killed, or disconnected by the server.
    pub gone: AtomicBool,
    /// Workers that have released everything this client held.
    pub released: AtomicU32,
    /// The GPU the segment is registered with (portable registration: one is enough).
    registered_on: Option<Arc<dyn Gpu>>,
    _mapping: Mapping,
}

impl ClientShared {
    pub fn new(
        id: u32,
        pid: i32,
        name: String,
        mapping: Mapping,
        seg: SegmentView,
        socket: OwnedFd,
        registered_on: Option<Arc<dyn Gpu>>,
    ) -> Self {
        ClientShared {
            id,
            pid,
            name,
            seg,
            socket,
            mem_bytes: Default::default(),
            commands: AtomicU64::new(0),
            gone: AtomicBool::new(false),
            released: AtomicU32::new(0),
            registered_on,
            _mapping: mapping,
        }
    }

    pub fn total_mem(&self) -> u64 {
        self.mem_bytes
            .iter()
            .map(|m| m.load(Ordering::Relaxed))
            .sum()
    }

    /// Tells the client it is cut off and hangs up its socket; the control thread then sees
    /// the hang-up and retires the client everywhere.
    pub fn disconnect(&self, code: i32, why: &str) {
        if self.gone.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::warn!(
            client = self.id,
            pid = self.pid,
            "disconnecting client: {why}"
        );
        self.set_state(state::DISCONNECTED, code);
        // SAFETY: shutting down a socket we own; the fd stays open until drop.
        unsafe { libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR) };
    }

    /// Publishes a server state change and wakes every thread of the client that sleeps.
    pub fn set_state(&self, new_state: u32, code: i32) {
        let h = self.seg.header();
        h.state_code.store(code, Ordering::SeqCst);
        h.server_state.store(new_state, Ordering::SeqCst);
        futex::wake(&h.server_state, u32::MAX);
        for c in 0..self.seg.layout.params.num_channels as usize {
            if let Some(ch) = self.seg.channel(c) {
                futex::wake(&ch.done, u32::MAX);
                for w in ch.chunk_done.iter().take(CHUNKS_PER_CHANNEL) {
                    futex::wake(w, u32::MAX);
                }
            }
        }
    }
}

impl Drop for ClientShared {
    fn drop(&mut self) {
        if let Some(gpu) = &self.registered_on {
            let (off, _) = self.seg.layout.registered_range();
            // SAFETY: the last reference is gone, so every worker has fenced this client's
            // streams (deferred releases hold an Arc until their fence completes).
            let r = unsafe { gpu.unregister_host(self.seg.base().add(off)) };
            if let Err(e) = r {
                tracing::warn!(client = self.id, "unregistering segment failed: {e:?}");
            }
        }
    }
}
