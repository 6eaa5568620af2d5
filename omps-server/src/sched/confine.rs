//! SM confinement: a client's work held to a subset of the GPU's SMs, through a green
//! context over that subset (measured on the H100: work on a green context's stream runs
//! on its SMs only, reads and writes the primary context's memory, launches its modules,
//! and orders against its streams through events).
//!
//! The SMs divide into chunks (8 SMs on Hopper, MPS's static-partition unit), with a
//! remainder the split leaves over. A confinement is a set of chunks, optionally with the
//! remainder, and lives in a numbered slot. Creating a green context waits for all work
//! running on the GPU (1 s beside a 1 s kernel, like a module load), so the slots every
//! server needs are made at start-up, before any client runs:
//!
//! * slot `k - 1` for `k` in `1..=chunks`: the last `k` chunks (thread-percentage limits);
//! * slot `chunks`: every chunk but the first `reserve` ones, with the remainder (where
//!   clients that are not latency-critical run while a latency-critical one is connected);
//! * later slots: static partitions, made by `sm_partition add`.

/// How a GPU's SMs divide into chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmChunks {
    pub total: u32,
    /// SMs per chunk.
    pub chunk: u32,
    /// Whole chunks; `total - chunk * chunks` SMs remain.
    pub chunks: u32,
}

impl SmChunks {
    pub fn remainder(&self) -> u32 {
        self.total.saturating_sub(self.chunk * self.chunks)
    }

    /// SMs of `set`.
    pub fn sms(&self, set: &SmSet) -> u32 {
        set.chunks.len() as u32 * self.chunk + if set.remainder { self.remainder() } else { 0 }
    }

    /// Chunks for a thread percentage (thousandths), rounded down as MPS does, at least one.
    pub fn chunks_for(&self, milli_pct: u32) -> u32 {
        let sms = self.total as u64 * milli_pct.min(100_000) as u64 / 100_000;
        ((sms / self.chunk.max(1) as u64) as u32).clamp(1, self.chunks.max(1))
    }

    /// The slot of a limit to `k` chunks.
    pub fn limit_slot(&self, k: u32) -> usize {
        (k.clamp(1, self.chunks.max(1)) - 1) as usize
    }

    /// The slot outside the latency-critical reserve.
    pub fn shared_slot(&self) -> usize {
        self.chunks as usize
    }

    /// The first slot of static partitions.
    pub fn first_partition_slot(&self) -> usize {
        self.chunks as usize + 1
    }

    /// What each fixed slot holds, given a reserve of `reserve` chunks.
    pub fn fixed_sets(&self, reserve: u32) -> Vec<SmSet> {
        let mut v: Vec<SmSet> = (1..=self.chunks)
            .map(|k| SmSet {
                chunks: (self.chunks - k..self.chunks).collect(),
                remainder: false,
            })
            .collect();
        v.push(SmSet {
            chunks: (reserve.min(self.chunks)..self.chunks).collect(),
            remainder: true,
        });
        v
    }
}

/// A set of SMs: chunks by index, and whether the remainder belongs to it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SmSet {
    pub chunks: Vec<u32>,
    pub remainder: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: SmChunks = SmChunks {
        total: 132,
        chunk: 8,
        chunks: 15,
    };

    #[test]
    fn percentages_round_down_to_chunks() {
        assert_eq!(H100.remainder(), 12);
        assert_eq!(H100.chunks_for(25_000), 4, "33 SMs -> 4 chunks of 8");
        assert_eq!(H100.chunks_for(100_000), 15);
        assert_eq!(H100.chunks_for(1), 1, "never none");
        assert_eq!(H100.limit_slot(4), 3);
    }

    #[test]
    fn the_fixed_slots_are_the_last_k_chunks_then_all_but_the_reserve() {
        let sets = H100.fixed_sets(2);
        assert_eq!(sets.len(), 16);
        assert_eq!(sets[0].chunks, vec![14]);
        assert_eq!(H100.sms(&sets[3]), 32);
        let shared = &sets[H100.shared_slot()];
        assert_eq!(shared.chunks.first(), Some(&2));
        assert_eq!(H100.sms(shared), 132 - 16, "everything but 16 SMs");
    }
}
