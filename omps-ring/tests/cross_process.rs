//! Streams a million records through a real memfd to a child process, which checks
//! every byte and tag. The child is this same test binary, re-run with `CHILD_ENV`
//! naming the inherited segment fd and a filter that selects [`child_side`].
#![cfg(not(loom))]

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use omps_ring::futex::{Doorbell, WaitResult};
use omps_ring::ring::{max_payload, Consumer, Producer, PushError, RingHeader};
use omps_ring::shm::{check_segment, create_segment, Mapping};

const CHILD_ENV: &str = "OMPS_RING_CROSS_PROCESS_FD";
const RECORDS: u64 = 1_000_000;
const CAPACITY: usize = 1 << 20;
const MAX: usize = max_payload(CAPACITY);

// Segment layout: one cache line or more apart, data area page aligned.
const HEADER_AT: usize = 0;
const DATA_BELL_AT: usize = 256; // the child sleeps here when the ring is empty
const SPACE_BELL_AT: usize = 384; // the parent sleeps here when the ring is full
const DONE_AT: usize = 512; // records the child verified
const DATA_AT: usize = 4096;
const SEGMENT_LEN: usize = DATA_AT + CAPACITY;

/// Spins before sleeping: the other side is usually only a moment away.
const SPINS: u32 = 200;
const NAP: Option<Duration> = Some(Duration::from_secs(1));

/// xorshift64*: both processes derive the same record sizes from the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}

/// Mostly small records, some up to 16 KiB, a few up to the maximum.
fn record_len(rng: &mut Rng) -> usize {
    match rng.below(1000) {
        0 => rng.below(MAX + 1),
        1..=99 => rng.below(16 * 1024 + 1),
        _ => rng.below(257),
    }
}

/// Record `i` carries `pattern[offset(i)..][..len]`: its contents depend on its index,
/// and checking it is one `memcmp` even in a debug build.
fn pattern() -> Vec<u8> {
    let mut rng = Rng(0x0123_4567_89AB_CDEF);
    (0..2 * MAX).map(|_| rng.next() as u8).collect()
}

fn offset(index: u64) -> usize {
    (index.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % MAX
}

fn tag(index: u64) -> u32 {
    (index.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as u32
}

/// The shared objects of one mapping.
struct Segment {
    map: Mapping,
}

impl Segment {
    fn at<T>(&self, offset: usize) -> &T {
        assert!(offset + size_of::<T>() <= self.map.len());
        // SAFETY: in bounds (asserted) and aligned (the mapping is page aligned and the
        // offsets above are multiples of the types' alignment); the types are atomics,
        // valid for any bits, and the mapping lives as long as `self`.
        unsafe { &*self.map.as_ptr().add(offset).cast::<T>() }
    }

    fn data_bell(&self) -> &Doorbell {
        self.at(DATA_BELL_AT)
    }

    fn space_bell(&self) -> &Doorbell {
        self.at(SPACE_BELL_AT)
    }

    fn done(&self) -> &AtomicU64 {
        self.at(DONE_AT)
    }

    fn ring_parts(&self) -> (*const RingHeader, *mut u8) {
        let base = self.map.as_ptr();
        // SAFETY: both offsets are inside the mapping.
        unsafe { (base.add(HEADER_AT).cast(), base.add(DATA_AT)) }
    }
}

#[test]
fn million_records_through_a_memfd_to_a_child_process() {
    let fd = create_segment("omps-cross-process-test", SEGMENT_LEN).unwrap();
    let segment = Segment {
        map: Mapping::map(fd.as_fd(), SEGMENT_LEN).unwrap(),
    };
    let (header, data) = segment.ring_parts();
    // SAFETY: the mapping outlives the producer; the child is the only consumer.
    let mut producer = unsafe { Producer::new(header, data, CAPACITY) };

    // A dup without FD_CLOEXEC is what the child inherits.
    // SAFETY: plain syscall on an fd we own.
    let raw = unsafe { libc::dup(fd.as_raw_fd()) };
    assert!(raw >= 0, "dup: {}", std::io::Error::last_os_error());
    // SAFETY: dup just gave us this fd.
    let inherited = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_side", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, raw.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(inherited);

    let start = Instant::now();
    let pattern = pattern();
    let mut rng = Rng(42);
    let (mut sleeps, mut bytes) = (0u64, 0u64);
    for index in 0..RECORDS {
        let len = record_len(&mut rng);
        let payload = &pattern[offset(index)..][..len];
        let mut spins = 0;
        loop {
            // Alternate the two push paths: in place, and gathered from two parts.
            let pushed = if index % 2 == 0 {
                producer.try_push_with(tag(index), len, |dst| dst.copy_from_slice(payload))
            } else {
                let (a, b) = payload.split_at(len / 3);
                producer.try_push(tag(index), &[a, b])
            };
            match pushed {
                Ok(()) => break,
                Err(PushError::Full) if spins < SPINS => {
                    spins += 1;
                    std::hint::spin_loop();
                }
                Err(PushError::Full) => {
                    let free = producer.free_bytes();
                    let bell = segment.space_bell();
                    if bell.sleep_unless(|| producer.free_bytes() > free, NAP)
                        == Some(WaitResult::TimedOut)
                        && child.try_wait().unwrap().is_some()
                    {
                        fail(child);
                    }
                    sleeps += 1;
                }
                Err(e) => panic!("record {index}: {e}"),
            }
        }
        bytes += len as u64;
        segment.data_bell().ring();
    }
    let elapsed = start.elapsed();
    if !child.wait().unwrap().success() {
        fail(child);
    }
    assert_eq!(segment.done().load(Ordering::Acquire), RECORDS);
    assert!(producer.is_drained());
    eprintln!(
        "{RECORDS} records, {} MiB in {elapsed:.2?}; producer slept {sleeps} times",
        bytes >> 20
    );
}

fn fail(child: Child) -> ! {
    let output = child.wait_with_output().unwrap();
    panic!(
        "child failed: {}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
}

/// The child's half; does nothing unless run as the child.
#[test]
fn child_side() {
    let Ok(raw) = std::env::var(CHILD_ENV) else {
        return;
    };
    // SAFETY: the parent dup'ed this fd for us to own and inherit.
    let fd = unsafe { OwnedFd::from_raw_fd(raw.parse().unwrap()) };
    check_segment(fd.as_fd(), SEGMENT_LEN).unwrap();
    let segment = Segment {
        map: Mapping::map(fd.as_fd(), SEGMENT_LEN).unwrap(),
    };
    let (header, data) = segment.ring_parts();
    // SAFETY: the mapping outlives the consumer; the parent is the only producer.
    let mut consumer = unsafe { Consumer::new(header, data, CAPACITY) };
    // SAFETY: plain syscall.
    let parent = unsafe { libc::getppid() };

    let pattern = pattern();
    let mut rng = Rng(42);
    let mut out = Vec::new();
    for index in 0..RECORDS {
        let len = record_len(&mut rng);
        let mut spins = 0;
        let tag_seen = loop {
            if let Some(tag) = consumer.pop_into(&mut out).unwrap() {
                break tag;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let bell = segment.data_bell();
            if bell.sleep_unless(|| consumer.has_data(), NAP) == Some(WaitResult::TimedOut) {
                // SAFETY: plain syscall.
                assert_eq!(unsafe { libc::getppid() }, parent, "parent died");
            }
        };
        segment.space_bell().ring();
        assert_eq!(tag_seen, tag(index), "tag of record {index}");
        assert_eq!(out.len(), len, "length of record {index}");
        assert!(
            out == pattern[offset(index)..][..len],
            "contents of record {index}"
        );
    }
    assert_eq!(consumer.pop_into(&mut out), Ok(None));
    segment.done().store(RECORDS, Ordering::Release);
}
