//! Arbitrary bytes as a ring written by a hostile producer: the consumer must report
//! corruption or return records that lie inside the ring, and never panic or read outside.
#![no_main]

use libfuzzer_sys::fuzz_target;
use omps_ring::ring::{Consumer, RingHeader, RING_HEADER_BYTES};

const CAP: usize = 4096;

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let mut hdr = vec![0u8; RING_HEADER_BYTES + 128];
    let base = hdr.as_mut_ptr().align_offset(128);
    let h = &mut hdr[base..base + RING_HEADER_BYTES];
    // tail (producer's counter) from the input; head stays as the consumer left it.
    h[..8].copy_from_slice(&data[..8]);
    let mut ring = vec![0u8; CAP];
    for (d, s) in ring.iter_mut().zip(data[16..].iter().cycle()) {
        *d = *s;
    }
    // SAFETY: header and data are live locals of the right sizes; one consumer.
    let mut c = unsafe { Consumer::new(h.as_ptr() as *const RingHeader, ring.as_mut_ptr(), CAP) };
    let mut out = Vec::new();
    for _ in 0..64 {
        match c.pop_into(&mut out) {
            Ok(Some(_)) => assert!(out.len() <= CAP),
            Ok(None) | Err(_) => break,
        }
    }
});
