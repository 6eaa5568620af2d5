//! Model-checks the ring's memory ordering with loom. Run through `.ci/loom.sh`:
//! `RUSTFLAGS="--cfg loom" cargo test -p omps-ring --test loom_ring --release`.
//!
//! Under loom the data area is `AtomicU64` cells accessed relaxed (see `sync`), so a
//! missing Release/Acquire pair shows up as a payload the consumer reads stale.
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
    loom::model(|| {
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
        let producer = pusher.join().unwrap();
        assert!(producer.is_drained());
        assert_eq!(consumer.pop_into(&mut out), Ok(None));
    });
}
