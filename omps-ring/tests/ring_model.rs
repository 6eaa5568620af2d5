//! Property tests of the ring: against a queue model, and against hostile peers that
//! scribble on the shared counters and records.
#![cfg(not(loom))]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use omps_ring::ring::{max_payload, Consumer, Producer, PushError, RingHeader, PAD_TAG};
use proptest::prelude::*;

const CAPACITY: usize = 4096;
const MAX: usize = max_payload(CAPACITY);
/// Canary bytes past the data area: a producer writing out of bounds would hit them.
const GUARD: usize = 4096;

/// The header as a segment would hold it: raw words, tail at 0 and head at 16.
#[repr(C, align(128))]
struct SharedHeader([AtomicU64; 32]);

/// A ring in memory that, like a mapping, is only ever touched through raw pointers.
struct Shared {
    header: Box<SharedHeader>,
    data: *mut u8,
}

impl Shared {
    fn new() -> Self {
        let data = Box::into_raw(vec![0xC5u8; CAPACITY + GUARD].into_boxed_slice());
        Self {
            header: Box::new(SharedHeader(std::array::from_fn(|_| AtomicU64::new(0)))),
            data: data.cast(),
        }
    }

    fn header(&self) -> *const RingHeader {
        (&*self.header as *const SharedHeader).cast()
    }

    fn producer(&self) -> Producer {
        // SAFETY: `self` outlives every end a test makes, one producer per test.
        unsafe { Producer::new(self.header(), self.data, CAPACITY) }
    }

    fn consumer(&self) -> Consumer {
        // SAFETY: `self` outlives every end a test makes, one consumer at a time.
        unsafe { Consumer::new(self.header(), self.data, CAPACITY) }
    }

    fn tail(&self) -> &AtomicU64 {
        &self.header.0[0]
    }

    fn head(&self) -> &AtomicU64 {
        &self.header.0[16]
    }

    fn write(&self, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= CAPACITY);
        // SAFETY: in bounds (asserted); no end is running concurrently.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.data.add(offset), bytes.len()) }
    }

    fn guard_intact(&self) -> bool {
        // SAFETY: the allocation is CAPACITY + GUARD bytes; nothing writes concurrently.
        let guard = unsafe { std::slice::from_raw_parts(self.data.add(CAPACITY), GUARD) };
        guard.iter().all(|&b| b == 0xC5)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.data, CAPACITY + GUARD);
        // SAFETY: made by Box::into_raw in `new`, freed once.
        drop(unsafe { Box::from_raw(slice) });
    }
}

#[derive(Debug, Clone)]
enum Op {
    Push {
        len: usize,
        tag: u32,
        seed: u8,
        split: usize,
        in_place: bool,
    },
    Pop,
}

fn op() -> impl Strategy<Value = Op> {
    let len = prop_oneof![4 => 0..=64usize, 4 => 0..=MAX, 1 => MAX - 8..=MAX + 16];
    let tag = prop_oneof![9 => 0..PAD_TAG, 1 => Just(PAD_TAG)];
    let push = (len, tag, any::<u8>(), any::<usize>(), any::<bool>()).prop_map(
        |(len, tag, seed, split, in_place)| Op::Push {
            len,
            tag,
            seed,
            split,
            in_place,
        },
    );
    prop_oneof![push, Just(Op::Pop)]
}

/// The ring's accounting restated: counters, padding, and records in flight.
struct Model {
    tail: u64,
    head: u64,
    queue: VecDeque<(u32, Vec<u8>, u64)>,
}

impl Model {
    /// Bytes the record takes, padding included, or None if it does not fit now.
    fn room_for(&self, len: usize) -> Option<u64> {
        let record = 8 + len.div_ceil(8) as u64 * 8;
        let to_end = CAPACITY as u64 - self.tail % CAPACITY as u64;
        let needed = if record > to_end {
            to_end + record
        } else {
            record
        };
        (CAPACITY as u64 - (self.tail - self.head) >= needed).then_some(needed)
    }
}

fn run_model(ops: &[Op]) -> Result<(), TestCaseError> {
    let shared = Shared::new();
    let (mut producer, mut consumer) = (shared.producer(), shared.consumer());
    let mut model = Model {
        tail: 0,
        head: 0,
        queue: VecDeque::new(),
    };
    let mut out = Vec::new();
    for op in ops {
        match *op {
            Op::Push {
                len,
                tag,
                seed,
                split,
                in_place,
            } => {
                let payload: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
                let result = if in_place {
                    producer.try_push_with(tag, len, |dst| dst.copy_from_slice(&payload))
                } else {
                    let (a, b) = payload.split_at(split % (len + 1));
                    producer.try_push(tag, &[a, &[], b])
                };
                let expected = if tag == PAD_TAG {
                    Err(PushError::ReservedTag)
                } else if len > MAX {
                    Err(PushError::TooLarge)
                } else if let Some(needed) = model.room_for(len) {
                    model.tail += needed;
                    model.queue.push_back((tag, payload, needed));
                    Ok(())
                } else {
                    Err(PushError::Full)
                };
                prop_assert_eq!(result, expected);
            }
            Op::Pop => {
                let got = consumer.pop_into(&mut out).unwrap();
                match model.queue.pop_front() {
                    None => prop_assert_eq!(got, None),
                    Some((tag, payload, needed)) => {
                        model.head += needed;
                        prop_assert_eq!(got, Some(tag));
                        prop_assert_eq!(&out, &payload);
                    }
                }
            }
        }
        prop_assert_eq!(shared.tail().load(Ordering::Acquire), model.tail);
        prop_assert_eq!(shared.head().load(Ordering::Acquire), model.head);
        prop_assert_eq!(
            producer.free_bytes(),
            CAPACITY - (model.tail - model.head) as usize
        );
        prop_assert_eq!(producer.is_drained(), model.queue.is_empty());
        prop_assert_eq!(consumer.has_data(), !model.queue.is_empty());
    }
    prop_assert!(shared.guard_intact());
    Ok(())
}

/// A header word as a hostile producer might plant it: plausible or not.
fn planted_header() -> impl Strategy<Value = [u8; 8]> {
    let len = prop_oneof![
        6 => 0..1100u32,
        1 => (1..=CAPACITY as u32 / 8).prop_map(|w| w * 8 - 8),
        1 => any::<u32>(),
    ];
    let tag = prop_oneof![1 => Just(PAD_TAG), 6 => 0..16u32, 2 => any::<u32>()];
    (len, tag).prop_map(|(len, tag)| {
        let mut word = [0u8; 8];
        word[..4].copy_from_slice(&len.to_ne_bytes());
        word[4..].copy_from_slice(&tag.to_ne_bytes());
        word
    })
}

/// Lays headers end to end from the head's position, as a producer would, so that the
/// consumer gets past the first record; `true` makes a pad exactly fill the gap.
fn plant_chain(shared: &Shared, head: u64, chain: &[([u8; 8], bool)]) {
    let mut pos = (head % CAPACITY as u64) as usize & !7;
    for &(mut header, fit_pad) in chain {
        if fit_pad {
            header[..4].copy_from_slice(&((CAPACITY - pos - 8) as u32).to_ne_bytes());
            header[4..].copy_from_slice(&PAD_TAG.to_ne_bytes());
        }
        shared.write(pos, &header);
        let len = u32::from_ne_bytes(header[..4].try_into().unwrap()) as usize;
        pos = (pos + 8 + len.min(CAPACITY).next_multiple_of(8)) % CAPACITY;
    }
}

fn counter_near(base: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        (0..=CAPACITY as u64 / 8 + 2).prop_map(move |w| base.wrapping_add(w * 8)),
        (0..=CAPACITY as u64 * 2).prop_map(move |d| base.wrapping_add(d)),
        any::<u64>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn ring_behaves_like_a_queue(ops in prop::collection::vec(op(), 1..400)) {
        run_model(&ops)?;
    }

    /// Garbage everywhere the producer controls: the consumer reports corruption or
    /// returns records that lie inside the ring, and never panics or reads out of bounds.
    #[test]
    fn consumer_survives_a_hostile_producer(
        garbage in prop::collection::vec(any::<u8>(), CAPACITY),
        chain in prop::collection::vec((planted_header(), prop::bool::weighted(0.15)), 0..64),
        head in prop_oneof![2 => Just(0u64), 6 => (0..u64::MAX / 16).prop_map(|h| h * 8), 1 => any::<u64>()],
        tails in prop::collection::vec(any::<prop::sample::Index>(), 1..8),
    ) {
        let shared = Shared::new();
        shared.write(0, &garbage);
        plant_chain(&shared, head, &chain);
        shared.head().store(head, Ordering::Release);
        let mut consumer = shared.consumer();
        let mut out = Vec::new();
        for pick in &tails {
            // Tails near the head reach the deeper checks; any value at all is fair.
            let candidates = [head.wrapping_add(pick.index(CAPACITY / 8 + 2) as u64 * 8),
                head.wrapping_add(pick.index(2 * CAPACITY) as u64), pick.index(usize::MAX) as u64];
            shared.tail().store(candidates[[0, 0, 0, 0, 0, 0, 1, 2][pick.index(8)]], Ordering::Release);
            for _ in 0..8 {
                let before = shared.head().load(Ordering::Acquire);
                match consumer.pop_into(&mut out) {
                    Ok(Some(tag)) => {
                        prop_assert_ne!(tag, PAD_TAG);
                        prop_assert!(out.len() <= MAX);
                        let after = shared.head().load(Ordering::Acquire);
                        let moved = after.wrapping_sub(before);
                        prop_assert!(moved >= 8 + out.len() as u64 && moved <= CAPACITY as u64);
                    }
                    Ok(None) => prop_assert!(out.is_empty()),
                    Err(_) => {
                        prop_assert_eq!(shared.head().load(Ordering::Acquire), before);
                        break;
                    }
                }
            }
        }
    }

    /// A hostile consumer controls `head`: the producer never panics, never writes
    /// outside the data area, and never claims more free space than the ring has.
    #[test]
    fn producer_survives_a_hostile_consumer(
        heads in prop::collection::vec(counter_near(0), 1..32),
        lens in prop::collection::vec(0..=MAX, 1..32),
    ) {
        let shared = Shared::new();
        let mut producer = shared.producer();
        for (head, len) in heads.iter().zip(&lens) {
            shared.head().store(*head, Ordering::Release);
            prop_assert!(producer.free_bytes() <= CAPACITY);
            let _ = producer.try_push(1, &[&vec![7; *len]]);
            let tail = shared.tail().load(Ordering::Acquire);
            prop_assert_eq!(tail % 8, 0);
        }
        prop_assert!(shared.guard_intact());
    }
}

#[test]
fn corrupt_record_length_is_reported_not_followed() {
    let shared = Shared::new();
    let mut producer = shared.producer();
    producer.try_push(5, &[b"hello"]).unwrap();
    // Rewrite the published record's length to run far past the tail.
    shared.write(0, &4000u32.to_ne_bytes());
    let mut consumer = shared.consumer();
    let err = consumer.pop_into(&mut Vec::new()).unwrap_err();
    assert_eq!(err.reason, "record longer than the maximum payload");
    shared.write(0, &100u32.to_ne_bytes());
    let err = consumer.pop_into(&mut Vec::new()).unwrap_err();
    assert_eq!(err.reason, "record runs past tail");
    assert_eq!(shared.head().load(Ordering::Acquire), 0);
}
