//! Blocks clients freed while they had nothing on the GPU, kept by their lane a moment for
//! the same client's next allocation of that size ([`KeptBlocks`]; issue 25, the quick
//! free: session/kinds/quick_free.rs says when a free qualifies).
//!
//! They are the lane's, not the session's, so that an allocation of any client that runs
//! out of memory gives them all back first (`WorkerCtx::reclaim`, which also asks the
//! other lanes through [`GpuShared`]'s `give_back_kept`). Otherwise they go back once
//! older than [`KEEP`] (the lane looks each pass, and wakes within 50 us while it keeps
//! any), and with their client's session. A kept block stays charged to its client; it is
//! given straight to the releaser, with no fence: its client had nothing on the GPU when it
//! freed it, and work queued after a free never may use the block.

use crate::client::ClientShared;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Blocks kept at most per client, and bytes.
pub const MAX_BLOCKS: usize = 8;
pub const MAX_BYTES: u64 = 256 << 20;
/// Blocks kept at most per lane (over all its clients).
pub const MAX_LANE_BLOCKS: usize = 256;
/// How long a kept block waits for an allocation of its size before it goes back.
pub const KEEP: Duration = if cfg!(test) {
    Duration::from_millis(20)
} else {
    Duration::from_millis(5)
};

pub struct Kept {
    pub client: Arc<ClientShared>,
    pub ptr: u64,
    pub len: u64,
    at: Instant,
}

#[derive(Default)]
pub struct KeptBlocks {
    blocks: Vec<Kept>,
}

impl KeptBlocks {
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Bytes kept now.
    pub fn bytes(&self) -> u64 {
        self.blocks.iter().map(|k| k.len).sum()
    }

    /// Keeps `ptr` (`len` bytes) of `client` if there is room: false if it must go back
    /// the usual way.
    pub fn keep(&mut self, client: &Arc<ClientShared>, ptr: u64, len: u64, now: Instant) -> bool {
        let (n, bytes) = self
            .blocks
            .iter()
            .filter(|k| k.client.id == client.id)
            .fold((0, 0u64), |(n, b), k| (n + 1, b + k.len));
        if n >= MAX_BLOCKS
            || bytes.saturating_add(len) > MAX_BYTES
            || self.blocks.len() >= MAX_LANE_BLOCKS
        {
            return false;
        }
        self.blocks.push(Kept {
            client: client.clone(),
            ptr,
            len,
            at: now,
        });
        true
    }

    /// A block of `client` of exactly `len` bytes, taken.
    pub fn take(&mut self, client: u32, len: u64) -> Option<u64> {
        let i = self
            .blocks
            .iter()
            .rposition(|k| k.client.id == client && k.len == len)?;
        Some(self.blocks.swap_remove(i).ptr)
    }

    /// Blocks kept longer than KEEP by `now` (all of them with `all`), taken.
    pub fn expired(&mut self, now: Instant, all: bool) -> Vec<Kept> {
        let (go, stay) = std::mem::take(&mut self.blocks)
            .into_iter()
            .partition(|k| all || now.saturating_duration_since(k.at) >= KEEP);
        self.blocks = stay;
        go
    }

    /// `client`'s blocks, taken.
    pub fn of_client(&mut self, client: u32) -> Vec<Kept> {
        let (mine, rest): (Vec<Kept>, Vec<Kept>) = std::mem::take(&mut self.blocks)
            .into_iter()
            .partition(|k| k.client.id == client);
        self.blocks = rest;
        mine
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::host::HostGpu;
    use crate::gpu::Gpu;

    #[test]
    fn keeps_within_bounds_per_client_and_gives_back_by_age() {
        let gpu: Arc<dyn Gpu> = Arc::new(HostGpu::new(0, 1 << 26));
        let (a, _pa) = crate::testing::fake_client(&gpu, 1).unwrap();
        let (b, _pb) = crate::testing::fake_client(&gpu, 2).unwrap();
        let mut k = KeptBlocks::default();
        let t0 = Instant::now();
        for i in 0..MAX_BLOCKS as u64 {
            assert!(k.keep(&a, 0x1000 * (i + 1), 1 << 20, t0));
        }
        assert!(
            !k.keep(&a, 0xdead, 1 << 20, t0),
            "at most MAX_BLOCKS a client"
        );
        assert!(
            k.keep(&b, 0xbeef, 1 << 20, t0 + KEEP),
            "another client's own count"
        );
        assert!(
            !k.keep(&b, 0xf00d, MAX_BYTES, t0),
            "at most MAX_BYTES a client"
        );
        assert_eq!(k.take(2, 2 << 20), None, "exact size only");
        assert_eq!(k.take(1, 1 << 20).map(|p| p % 0x1000), Some(0), "a's own");
        assert!(k.take(1, 1 << 20).is_some());
        assert_eq!(k.bytes(), (MAX_BLOCKS as u64 - 2 + 1) << 20);
        let old = k.expired(t0 + KEEP, false);
        assert_eq!(old.len(), MAX_BLOCKS - 2, "b's younger block stays");
        let b_left: Vec<(u64, u64)> = k.of_client(2).iter().map(|b| (b.ptr, b.len)).collect();
        assert_eq!(b_left, vec![(0xbeef, 1 << 20)]);
        assert!(k.is_empty());
    }
}
