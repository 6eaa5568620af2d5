//! The bounds the server sets on the streams and events a client holds, with the counts
//! held: the connection (conn.rs) carries one per kind.

use crate::cuda::CUresult;
use std::sync::atomic::{AtomicU32, Ordering};

/// A bound the server set on what the client holds, and the count held.
pub struct Quota {
    max: u32,
    held: AtomicU32,
}

impl Quota {
    pub(crate) fn new(max: u32) -> Quota {
        Quota {
            max,
            held: AtomicU32::new(0),
        }
    }

    /// One more held: CUDA_ERROR_OUT_OF_MEMORY at the bound, as the driver answers when
    /// it can make no more.
    pub fn take(&self) -> Result<(), CUresult> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .map(drop)
            .map_err(|_| crate::cuda::CUDA_ERROR_OUT_OF_MEMORY)
    }

    pub fn give_back(&self) {
        let _ = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}
