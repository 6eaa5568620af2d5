//! The lane's side of the quick free: blocks clients freed with nothing on the GPU, kept
//! for their next allocations (`worker/kept.rs` holds them; this is how a lane keeps,
//! hands back and gives them up). Apart from ctx.rs so that the worker's context stays a
//! file a person can hold in their head.

use super::WorkerCtx;
use crate::client::ClientShared;
use crate::release::given::Release;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl WorkerCtx {
    /// Keeps block `ptr` (`len` bytes), which `client` freed with nothing on the GPU, for
    /// its next allocation of that size (worker/kept.rs): false if it must go the usual
    /// way (no room, or an allocation that ran out of memory asks blocks back now).
    pub fn keep_freed(&mut self, client: &Arc<ClientShared>, ptr: u64, len: u64) -> bool {
        if self.shared.give_back_kept.load(Ordering::SeqCst)
            || !self.kept.keep(client, ptr, len, Instant::now())
        {
            return false;
        }
        self.shared.kept_bytes.fetch_add(len, Ordering::SeqCst);
        true
    }

    /// A block `client` freed and this lane kept, of exactly `len` bytes.
    pub fn take_kept(&mut self, client: u32, len: u64) -> Option<u64> {
        let p = self.kept.take(client, len)?;
        self.shared.kept_bytes.fetch_sub(len, Ordering::SeqCst);
        Some(p)
    }

    pub fn holds_kept(&self) -> bool {
        !self.kept.is_empty()
    }

    /// `client`'s kept blocks, taken (its session ends: they go with its allocations).
    pub fn kept_of(&mut self, client: u32) -> Vec<(u64, u64)> {
        let mine = self.kept.of_client(client);
        let bytes: u64 = mine.iter().map(|b| b.len).sum();
        self.shared.kept_bytes.fetch_sub(bytes, Ordering::SeqCst);
        mine.into_iter().map(|k| (k.ptr, k.len)).collect()
    }

    /// Gives kept blocks older than kept::KEEP to the releaser, or all of them while an
    /// allocation that ran out of memory asks for them. No fence: their clients had
    /// nothing on the GPU when they freed them (worker/kept.rs).
    pub fn give_back_kept(&mut self) {
        if self.kept.is_empty() {
            return;
        }
        let all = self.shared.give_back_kept.load(Ordering::SeqCst);
        for k in self.kept.expired(Instant::now(), all) {
            self.shared.kept_bytes.fetch_sub(k.len, Ordering::SeqCst);
            let rel = Release {
                allocs: vec![(k.ptr, k.len)],
                ..Default::default()
            };
            self.free(k.client, rel, false, true);
        }
    }
}
