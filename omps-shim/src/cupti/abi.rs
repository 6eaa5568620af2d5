//! CUPTI's binary interface as a CUDA 13.0 program sees it: result codes, activity kinds,
//! attribute and callback numbers, and the byte layouts of the activity records the shim
//! writes into a profiler's buffers. Facts taken from CUDA 13.0's `cupti_activity.h`,
//! `cupti_result.h` and `cupti_driver_cbid.h` (field order, offsets, values); the code is
//! ours. `scripts/probe/cupti_layout.c` prints the same numbers from the real headers on
//! the GPU machine so that the two can be compared.
//!
//! Every record is `#pragma pack(8)` in C: each size here is a multiple of 8, and records
//! lie back to back in a buffer.

/// `CUptiResult` values.
pub mod result {
    pub const SUCCESS: u32 = 0;
    pub const INVALID_PARAMETER: u32 = 1;
    pub const INVALID_KIND: u32 = 21;
    pub const MAX_LIMIT_REACHED: u32 = 12;
    pub const QUEUE_EMPTY: u32 = 18;
    pub const NOT_INITIALIZED: u32 = 15;
    pub const NOT_SUPPORTED: u32 = 27;
    pub const MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: u32 = 39;
    pub const UNKNOWN: u32 = 999;
}

/// Activity kinds and record layouts, shared with the server (which reads CUPTI's own
/// records in them).
pub use omps_ring::cupti_layout::{kind, off};

/// The version `cuptiGetVersion` answers when no real libcupti is loaded beside the shim
/// (CUDA 13.0 Update 1's: torch's libcupti.so.13 answered this on the GPU machine).
pub const API_VERSION: u32 = 130001;

/// The copy and memory kinds, kept beside the families that report copies.
pub use crate::state::profile::{copy_kind, memory_kind};

/// `CUpti_ActivitySynchronizationType`.
pub mod sync_type {
    pub const EVENT_SYNCHRONIZE: u32 = 1;
    pub const STREAM_WAIT_EVENT: u32 = 2;
    pub const STREAM_SYNCHRONIZE: u32 = 3;
    pub const CONTEXT_SYNCHRONIZE: u32 = 4;
}

/// CUPTI's stand-in for "no such id" in synchronization records.
pub const INVALID_ID: u32 = u32::MAX;

/// Record sizes in bytes: what CUDA 13.0's CUPTI emits for each kind (`CUpti_ActivityKernel10`,
/// `CUpti_ActivityMemcpy6`, `CUpti_ActivityMemset4`, `CUpti_ActivityAPI`,
/// `CUpti_ActivitySynchronization2`, `CUpti_ActivityExternalCorrelation`). A program built
/// against an older header reads a prefix of each, which holds the same fields.
pub fn record_size(kind: u32) -> Option<usize> {
    Some(match kind {
        kind::CONCURRENT_KERNEL | kind::KERNEL => 216,
        kind::MEMCPY => 96,
        kind::MEMSET => 88,
        kind::DRIVER | kind::RUNTIME => 40,
        kind::SYNCHRONIZATION => 56,
        kind::EXTERNAL_CORRELATION => 24,
        _ => return None,
    })
}

/// The largest record the shim writes.
pub const RECORD_MAX: usize = 216;

/// One record, built field by field at its C offset (no allocation: a trace holds
/// many).
#[derive(Clone)]
pub struct Record {
    bytes: [u8; RECORD_MAX],
    len: usize,
}

impl Record {
    pub fn new(kind: u32) -> Record {
        let len = record_size(kind).expect("a kind the shim writes");
        let mut r = Record {
            bytes: [0; RECORD_MAX],
            len,
        };
        r.u32(0, kind);
        r
    }
    pub fn u8(&mut self, off: usize, v: u8) -> &mut Self {
        self.bytes[off] = v;
        self
    }
    pub fn u16(&mut self, off: usize, v: u16) -> &mut Self {
        self.bytes[off..off + 2].copy_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.bytes[off..off + 4].copy_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.bytes[off..off + 8].copy_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
    pub fn kind(&self) -> u32 {
        u32::from_le_bytes(self.bytes[..4].try_into().expect("4 bytes"))
    }
    /// Replaces the times at offsets `offs` (host ns) by `f`'s conversion; a time left
    /// at 0 (unknown) stays 0.
    pub fn convert_times(&mut self, offs: &[usize], f: &dyn Fn(u64) -> u64) {
        for &o in offs {
            let v = u64::from_le_bytes(self.bytes[o..o + 8].try_into().expect("8 bytes"));
            if v != 0 {
                self.u64(o, f(v));
            }
        }
    }
}

/// The record after `prev` in a buffer of `valid` bytes (`cuptiActivityGetNextRecord`):
/// the offset of the next one, or None at the end. `prev` None starts at the beginning.
/// A kind the shim does not write ends the walk (it never wrote one).
pub fn next_record(buf: &[u8], prev: Option<usize>) -> Option<usize> {
    let at = match prev {
        None => 0,
        Some(p) => p + record_size(kind_at(buf, p)?)?,
    };
    let size = record_size(kind_at(buf, at)?)?;
    (at + size <= buf.len()).then_some(at)
}

fn kind_at(buf: &[u8], at: usize) -> Option<u32> {
    let b = buf.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_walk_back_to_back_and_stop_at_the_valid_end() {
        let mut buf = Vec::new();
        for k in [
            kind::CONCURRENT_KERNEL,
            kind::EXTERNAL_CORRELATION,
            kind::MEMSET,
        ] {
            buf.extend_from_slice(Record::new(k).bytes());
        }
        let a = next_record(&buf, None).unwrap();
        let b = next_record(&buf, Some(a)).unwrap();
        let c = next_record(&buf, Some(b)).unwrap();
        assert_eq!((a, b, c), (0, 216, 240));
        assert_eq!(next_record(&buf, Some(c)), None);
        // A buffer cut inside a record ends before it.
        assert_eq!(next_record(&buf[..300], Some(b)), None);
        assert_eq!(next_record(&[], None), None);
    }

    #[test]
    fn sizes_are_multiples_of_eight_and_fields_fit() {
        for k in 0..kind::COUNT {
            if let Some(s) = record_size(k) {
                assert_eq!(s % 8, 0, "kind {k}");
            }
        }
        let mut r = Record::new(kind::CONCURRENT_KERNEL);
        r.u64(off::kernel::NAME, 7).u64(off::kernel::COMPLETED, 9);
        assert_eq!(r.kind(), kind::CONCURRENT_KERNEL);
        r.convert_times(&off::kernel::TIMES, &|t| t * 2);
        assert_eq!(r.bytes()[off::kernel::COMPLETED], 18);
        assert_eq!(
            r.bytes()[off::kernel::START],
            0,
            "an unset time stays unset"
        );
    }
}
