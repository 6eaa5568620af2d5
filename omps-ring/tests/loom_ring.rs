//! Model-checks the ring's memory ordering with loom. Run through `.ci/loom.sh`:
//! `RUSTFLAGS="--cfg loom" cargo test -p omps-ring --test loom_ring --release`.
//!
//! Under loom the data area is `AtomicU64` cells accessed relaxed (see `sync`), so a
//! weakened SYNC POINT A (either side made Relaxed) shows up as a payload the consumer
//! reads stale; this test fails in that case. SYNC POINT B guards a read-then-overwrite
//! hazard, which needs load buffering to go wrong, and loom does not model that.
#![cfg(loom)]

use loom::thread;
use omps_ring::ring::{max_payload, Consumer, Producer, PushError, RingHeader};
use omps_ring::sync::AtomicU64;

const CAPACITY: usize = 64;

/// Payload lengths chosen so that the records (16, 16, 8, 16 bytes) leave 8 bytes
/// before the end and the last one needs a padding record: the producer has to wait
/// for the consumer to free space, and the consumer has to skip the padding.
const LENS: [usize; 5] = [8, 8, 0, 8, 5];

struct Shared {
    header: RingHeader,
    data: Box<[AtomicU64]>,
}

fn payload(index: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (index * 16 + i + 1) as u8).collect()
}

fn ends(shared: &Shared) -> (Producer, Consumer) {
    let header: *const RingHeader = &shared.header;
    let data = shared.data.as_ptr().cast::<u8>().cast_mut();
    // SAFETY: the model's closure keeps `shared` alive until both threads are done;
    // one producer and one consumer; under loom the data area is AtomicU64 cells.
    unsafe {
        (
            Producer::new(header, data, CAPACITY),
            Consumer::new(header, data, CAPACITY),
        )
    }
}

#[test]
fn records_cross_the_wrap_point_intact_and_in_order() {
    assert!(LENS.iter().all(|&len| len <= max_payload(CAPACITY)));
    // Three preemptions cover the interleavings that matter here in seconds; the
    // unbounded search takes minutes. LOOM_MAX_PREEMPTIONS overrides.
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound.get_or_insert(3);
    builder.check(|| {
        let shared = Shared {
            header: RingHeader::new(),
            data: (0..CAPACITY / 8).map(|_| AtomicU64::new(0)).collect(),
        };
        let (mut producer, mut consumer) = ends(&shared);

        let pusher = thread::spawn(move || {
            for (index, &len) in LENS.iter().enumerate() {
                let record = payload(index, len);
                loop {
                    match producer.try_push(index as u32, &[&record]) {
                        Ok(()) => break,
                        Err(PushError::Full) => thread::yield_now(),
                        Err(e) => panic!("push {index}: {e}"),
                    }
                }
            }
            producer
        });

        // The consumer gets its own thread too: loom never lets a thread that yielded
        // re-read a store it had already seen, and the model thread has seen the
        // zeroed cells it created, which would hide stale reads of them.
        let popper = thread::spawn(move || {
            let mut out = Vec::new();
            for (index, &len) in LENS.iter().enumerate() {
                loop {
                    match consumer.pop_into(&mut out) {
                        Ok(Some(tag)) => {
                            assert_eq!(tag, index as u32);
                            assert_eq!(out, payload(index, len));
                            break;
                        }
                        Ok(None) => thread::yield_now(),
                        Err(e) => panic!("pop {index}: {e}"),
                    }
                }
            }
            assert_eq!(consumer.pop_into(&mut out), Ok(None));
        });
        let producer = pusher.join().unwrap();
        popper.join().unwrap();
        assert!(producer.is_drained());
    });
}
