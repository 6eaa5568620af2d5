//! Single-producer single-consumer ring of variable-length records in shared memory.
//!
//! The shared part is a [`RingHeader`] (two monotonically increasing byte counters) and
//! a separate data area of `capacity` bytes; both are reached through pointers each
//! process derives from its own mapping, never through pointers stored in the segment.
//! All-zero bytes are an empty ring, so a freshly created segment needs no set-up.
//!
//! A record is an 8-byte header `{ len: u32, tag: u32 }` then `len` payload bytes, the
//! whole padded to a multiple of 8. A record never wraps: when one would not fit before
//! the end of the data area, the producer fills the gap with a [`PAD_TAG`] record.
//!
//! The two sides distrust each other differently. The consumer assumes a hostile
//! producer: it keeps `head` privately, checks every header against the published
//! `tail`, and copies payloads out before handing them over. The producer keeps `tail`
//! privately and only uses the shared `head` to compute free space, so a hostile
//! consumer can at worst stall the ring or garble records meant for itself.

use core::fmt;

use crate::sync::{self, AtomicU64, CachePadded, Ordering};

/// Tag of the filler record that skips to the start of the data area.
pub const PAD_TAG: u32 = u32::MAX;

/// Bytes of `{ len: u32, tag: u32 }` in front of every payload.
pub const RECORD_HEADER_BYTES: usize = 8;

/// Smallest data area accepted. Loom models need a tiny ring to stay tractable.
#[cfg(not(loom))]
pub const MIN_CAPACITY: usize = 4096;
#[cfg(loom)]
pub const MIN_CAPACITY: usize = 64;

/// The shared counters: `tail` is stored only by the producer, `head` only by the
/// consumer. Position in the data area is `counter % capacity`.
#[repr(C)]
#[derive(Default)]
pub struct RingHeader {
    tail: CachePadded<AtomicU64>,
    head: CachePadded<AtomicU64>,
}

pub const RING_HEADER_BYTES: usize = size_of::<RingHeader>();
#[cfg(not(loom))]
const _: () = assert!(RING_HEADER_BYTES == 256);

impl RingHeader {
    /// An empty ring; the same as all-zero bytes.
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Self {
            tail: CachePadded::new(AtomicU64::new(0)),
            head: CachePadded::new(AtomicU64::new(0)),
        }
    }

    /// An empty ring (loom atomics are not `const`).
    #[cfg(loom)]
    pub fn new() -> Self {
        Self::default()
    }

    /// Where the producer has published records up to (bytes since the ring's start).
    /// Written by the producer: a consumer takes it as a claim, never as a bound.
    pub fn published_tail(&self) -> u64 {
        // SYNC POINT A': pairs with the producer's Release store of `tail`.
        self.tail.load(Ordering::Acquire)
    }
}

/// Power of two, at least [`MIN_CAPACITY`], and small enough that every length fits
/// the header's `u32`.
pub const fn is_valid_capacity(capacity: usize) -> bool {
    capacity.is_power_of_two()
        && capacity >= MIN_CAPACITY
        && capacity - RECORD_HEADER_BYTES <= u32::MAX as usize
}

/// Largest payload a ring of `capacity` bytes accepts. A quarter of the ring keeps a
/// wrap (padding plus record) from ever needing more than half of it.
pub const fn max_payload(capacity: usize) -> usize {
    capacity / 4 - RECORD_HEADER_BYTES
}

const fn record_bytes(len: usize) -> usize {
    RECORD_HEADER_BYTES + ((len + 7) & !7)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError {
    /// Not enough free space now; retry after the consumer catches up.
    Full,
    /// Longer than [`max_payload`]; it will never fit.
    TooLarge,
    /// The tag was [`PAD_TAG`].
    ReservedTag,
}

impl fmt::Display for PushError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Full => "ring is full",
            Self::TooLarge => "record is larger than the ring's maximum payload",
            Self::ReservedTag => "tag is reserved for padding records",
        })
    }
}

impl std::error::Error for PushError {}

/// The producer broke the ring's invariants; the ring cannot be trusted any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt {
    pub reason: &'static str,
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "corrupt ring: {}", self.reason)
    }
}

impl std::error::Error for Corrupt {}

/// # Safety
/// Shared by both constructors: see [`Producer::new`].
unsafe fn checked_header<'a>(header: *const RingHeader, capacity: usize) -> &'a RingHeader {
    assert!(
        is_valid_capacity(capacity),
        "invalid ring capacity {capacity}"
    );
    assert!(header.is_aligned(), "misaligned ring header");
    // SAFETY: the caller guarantees the header is mapped for as long as it is used.
    unsafe { &*header }
}

/// The writing end. Not `Sync`: its private `tail` assumes one writer.
pub struct Producer {
    header: *const RingHeader,
    data: *mut u8,
    capacity: usize,
    tail: u64,
    cached_head: u64,
}

// SAFETY: the pointers name memory that `new`'s caller keeps mapped for the Producer's
// whole life, whichever thread owns it.
unsafe impl Send for Producer {}

impl Producer {
    /// # Safety
    /// `header` (aligned for `RingHeader`) and the `capacity` bytes at `data` stay mapped
    /// for the Producer's life, and no other Producer exists for this ring. Under loom,
    /// `data` points to `capacity / 8` `sync::AtomicU64` cells instead of bytes.
    ///
    /// # Panics
    /// If `capacity` fails [`is_valid_capacity`] or `header` is misaligned.
    pub unsafe fn new(header: *const RingHeader, data: *mut u8, capacity: usize) -> Self {
        // SAFETY: forwarded from our caller.
        let shared = unsafe { checked_header(header, capacity) };
        // Rounded down so that a peer who scribbled on the counter before we existed
        // cannot misalign our records; an honest segment starts at zero anyway.
        let tail = shared.tail.load(Ordering::Relaxed) & !7;
        let cached_head = shared.head.load(Ordering::Acquire);
        Self {
            header,
            data,
            capacity,
            tail,
            cached_head,
        }
    }

    fn shared(&self) -> &RingHeader {
        // SAFETY: `new`'s caller keeps the header mapped while we live.
        unsafe { &*self.header }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn max_payload(&self) -> usize {
        max_payload(self.capacity)
    }

    /// A head that is ahead of our tail or a whole ring behind it can only come from a
    /// scribbling consumer; it reads as no space at all.
    fn free_cached(&self) -> usize {
        let used = self.tail.wrapping_sub(self.cached_head);
        (self.capacity as u64).saturating_sub(used) as usize
    }

    fn refresh_head(&mut self) {
        // SYNC POINT B: pairs with the consumer's Release store of `head`, made after it
        // copied the payloads out, so our writes into the freed bytes follow its reads.
        self.cached_head = self.shared().head.load(Ordering::Acquire);
    }

    /// Free bytes right now (not all of them usable by one record: see [`max_payload`]).
    pub fn free_bytes(&mut self) -> usize {
        self.refresh_head();
        self.free_cached()
    }

    /// Whether the consumer has consumed everything pushed so far.
    pub fn is_drained(&self) -> bool {
        // SYNC POINT B (as in `refresh_head`).
        self.shared().head.load(Ordering::Acquire) == self.tail
    }

    /// Pushes the concatenation of `parts` as one record.
    pub fn try_push(&mut self, tag: u32, parts: &[&[u8]]) -> Result<(), PushError> {
        let len = parts
            .iter()
            .try_fold(0usize, |sum, part| sum.checked_add(part.len()))
            .ok_or(PushError::TooLarge)?;
        self.try_push_with(tag, len, |dst| {
            let mut at = 0;
            for part in parts {
                dst[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
        })
    }

    /// Pushes a record of `len` bytes that `fill` writes in place. The slice is in
    /// shared memory: its prior contents are garbage, and only what `fill` leaves
    /// there matters.
    pub fn try_push_with(
        &mut self,
        tag: u32,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), PushError> {
        if tag == PAD_TAG {
            return Err(PushError::ReservedTag);
        }
        if len > self.max_payload() {
            return Err(PushError::TooLarge);
        }
        let record = record_bytes(len);
        let mut pos = (self.tail as usize) & (self.capacity - 1);
        let to_end = self.capacity - pos;
        let wraps = record > to_end;
        let needed = if wraps { to_end + record } else { record };
        if self.free_cached() < needed {
            self.refresh_head();
            if self.free_cached() < needed {
                return Err(PushError::Full);
            }
        }

        // Committed only at the end, so a panicking `fill` publishes nothing.
        let mut tail = self.tail;
        if wraps {
            // `to_end` is a non-zero multiple of 8, so the gap can hold a header.
            self.write_header(pos, (to_end - RECORD_HEADER_BYTES) as u32, PAD_TAG);
            tail += to_end as u64;
            pos = 0;
        }
        self.write_header(pos, len as u32, tag);
        // SAFETY: the record fits before the end of the data area (checked above or
        // moved to offset 0), and the free-space check says the consumer is done with
        // those bytes.
        unsafe { sync::fill_data(self.data, pos + RECORD_HEADER_BYTES, len, fill) };
        self.tail = tail + record as u64;
        // SYNC POINT A: publishes the headers and payload written above; pairs with
        // the consumer's Acquire load of `tail`.
        self.shared().tail.store(self.tail, Ordering::Release);
        Ok(())
    }

    fn write_header(&mut self, pos: usize, len: u32, tag: u32) {
        let mut bytes = [0u8; RECORD_HEADER_BYTES];
        bytes[..4].copy_from_slice(&len.to_ne_bytes());
        bytes[4..].copy_from_slice(&tag.to_ne_bytes());
        // SAFETY: `pos` is a multiple of 8 below `capacity`, so 8 bytes fit.
        unsafe { sync::write_data(self.data, pos, &bytes) }
    }
}

/// The reading end. Not `Sync`: its private `head` assumes one reader.
pub struct Consumer {
    header: *const RingHeader,
    data: *const u8,
    capacity: usize,
    head: u64,
    cached_tail: u64,
}

// SAFETY: as for `Producer`.
unsafe impl Send for Consumer {}

fn corrupt<T>(reason: &'static str) -> Result<T, Corrupt> {
    Err(Corrupt { reason })
}

impl Consumer {
    /// # Safety
    /// As for [`Producer::new`], with "no other Consumer".
    ///
    /// # Panics
    /// As for [`Producer::new`].
    pub unsafe fn new(header: *const RingHeader, data: *mut u8, capacity: usize) -> Self {
        // SAFETY: forwarded from our caller.
        let shared = unsafe { checked_header(header, capacity) };
        // The only time we read `head`: afterwards the producer could rewrite it.
        let head = shared.head.load(Ordering::Relaxed);
        Self {
            header,
            data,
            capacity,
            head,
            cached_tail: head,
        }
    }

    fn shared(&self) -> &RingHeader {
        // SAFETY: `new`'s caller keeps the header mapped while we live.
        unsafe { &*self.header }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn max_payload(&self) -> usize {
        max_payload(self.capacity)
    }

    /// How far this consumer has read (bytes since the ring's start).
    pub fn position(&self) -> u64 {
        self.head
    }

    fn refresh_tail(&mut self) {
        // SYNC POINT A: pairs with the producer's Release store of `tail`, making the
        // records below it visible.
        self.cached_tail = self.shared().tail.load(Ordering::Acquire);
    }

    /// Whether a record (or a corruption to report) is waiting; touches the shared
    /// line only when the cached tail says the ring is empty.
    pub fn has_data(&mut self) -> bool {
        if self.cached_tail == self.head {
            self.refresh_tail();
        }
        self.cached_tail != self.head
    }

    /// Copies the next record's payload into `out` (cleared first) and returns its tag,
    /// or `None` if the ring is empty. After an error the ring stays where it was.
    pub fn pop_into(&mut self, out: &mut Vec<u8>) -> Result<Option<u32>, Corrupt> {
        out.clear();
        if !self.has_data() {
            return Ok(None);
        }
        let capacity = self.capacity as u64;
        let mut head = self.head;
        loop {
            let avail = self.cached_tail.wrapping_sub(head);
            if avail > capacity {
                return corrupt("tail is more than a ring ahead of head, or behind it");
            }
            if (avail | head) & 7 != 0 {
                return corrupt("tail or head is not a multiple of 8");
            }
            if avail == 0 {
                return corrupt("padding record with no record after it");
            }
            let pos = (head % capacity) as usize;
            let to_end = self.capacity - pos;
            // Read once into private memory: the producer may rewrite it after we check.
            let mut bytes = [0u8; RECORD_HEADER_BYTES];
            // SAFETY: `pos` is a multiple of 8 below `capacity`, so 8 bytes fit.
            unsafe { sync::read_data(self.data, pos, bytes.as_mut_ptr(), bytes.len()) };
            let len = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
            let tag = u32::from_ne_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);

            if tag == PAD_TAG {
                if len + RECORD_HEADER_BYTES != to_end {
                    return corrupt("padding record does not end at the end of the data area");
                }
                if to_end as u64 > avail {
                    return corrupt("padding record runs past tail");
                }
                head += to_end as u64;
                continue;
            }
            if len > self.max_payload() {
                return corrupt("record longer than the maximum payload");
            }
            let record = record_bytes(len);
            if record as u64 > avail {
                return corrupt("record runs past tail");
            }
            if record > to_end {
                return corrupt("record runs past the end of the data area");
            }

            out.reserve(len);
            // SAFETY: the payload lies inside the data area (checked just above) and
            // `out` has room for `len` bytes after `reserve`.
            unsafe {
                sync::read_data(self.data, pos + RECORD_HEADER_BYTES, out.as_mut_ptr(), len);
                out.set_len(len);
            }
            self.head = head + record as u64;
            // SYNC POINT B: tells the producer we are done reading everything below
            // `head` (skipped padding included); pairs with its Acquire load of `head`.
            self.shared().head.store(self.head, Ordering::Release);
            return Ok(Some(tag));
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A ring on the heap, the data area as `u64`s so positions are 8-aligned like a mapping.
    struct HeapRing {
        header: Box<RingHeader>,
        data: Vec<u64>,
    }

    impl HeapRing {
        fn new(capacity: usize) -> Self {
            Self {
                header: Box::new(RingHeader::new()),
                data: vec![0; capacity / 8],
            }
        }

        fn ends(&mut self) -> (Producer, Consumer) {
            let capacity = self.data.len() * 8;
            let data = self.data.as_mut_ptr().cast::<u8>();
            // SAFETY: `self` outlives the producer in every test, and it is the only one.
            let producer = unsafe { Producer::new(&*self.header, data, capacity) };
            (producer, self.consumer())
        }

        /// A consumer that starts from the published head, as after a restart.
        fn consumer(&mut self) -> Consumer {
            let capacity = self.data.len() * 8;
            let data = self.data.as_mut_ptr().cast::<u8>();
            // SAFETY: `self` outlives the consumer in every test; tests drop or stop
            // using the previous one before asking for another.
            unsafe { Consumer::new(&*self.header, data, capacity) }
        }

        fn set_tail(&self, tail: u64) {
            self.header.tail.store(tail, Ordering::Release);
        }

        fn head(&self) -> u64 {
            self.header.head.load(Ordering::Acquire)
        }

        fn write_header(&mut self, pos: usize, len: u32, tag: u32) {
            self.data[pos / 8] = header_word(len, tag);
        }
    }

    fn header_word(len: u32, tag: u32) -> u64 {
        let bytes = [len.to_ne_bytes(), tag.to_ne_bytes()].concat();
        u64::from_ne_bytes(bytes.try_into().unwrap())
    }

    fn pop(consumer: &mut Consumer) -> Result<Option<(u32, Vec<u8>)>, Corrupt> {
        let mut out = vec![0xEE; 3];
        Ok(consumer.pop_into(&mut out)?.map(|tag| (tag, out)))
    }

    #[test]
    fn header_layout_matches_the_wire() {
        assert_eq!(RING_HEADER_BYTES, 256);
        assert_eq!(core::mem::align_of::<RingHeader>(), 128);
        assert_eq!(core::mem::offset_of!(RingHeader, tail), 0);
        assert_eq!(core::mem::offset_of!(RingHeader, head), 128);
    }

    #[test]
    fn all_zero_memory_is_an_empty_ring() {
        #[repr(C, align(128))]
        struct Zeroed([u8; RING_HEADER_BYTES]);
        let header = Zeroed([0; RING_HEADER_BYTES]);
        let mut data = vec![0u64; MIN_CAPACITY / 8];
        let data = data.as_mut_ptr().cast::<u8>();
        let header = (&header as *const Zeroed).cast::<RingHeader>();
        // SAFETY: both buffers outlive the ends; zero bytes are valid atomics.
        let (mut producer, mut consumer) = unsafe {
            (
                Producer::new(header, data, MIN_CAPACITY),
                Consumer::new(header, data, MIN_CAPACITY),
            )
        };
        assert!(producer.is_drained());
        assert_eq!(producer.free_bytes(), MIN_CAPACITY);
        assert!(!consumer.has_data());
        assert_eq!(pop(&mut consumer), Ok(None));
        producer.try_push(3, &[b"xyz"]).unwrap();
        assert!(consumer.has_data());
        assert_eq!(pop(&mut consumer), Ok(Some((3, b"xyz".to_vec()))));
    }

    #[test]
    fn gathers_parts_into_one_record() {
        let mut ring = HeapRing::new(MIN_CAPACITY);
        let (mut producer, mut consumer) = ring.ends();
        producer.try_push(7, &[b"ab", b"", b"cde"]).unwrap();
        producer.try_push(0, &[]).unwrap();
        producer
            .try_push_with(9, 4, |dst| dst.copy_from_slice(b"wxyz"))
            .unwrap();
        assert!(!producer.is_drained());
        assert_eq!(pop(&mut consumer), Ok(Some((7, b"abcde".to_vec()))));
        assert_eq!(pop(&mut consumer), Ok(Some((0, vec![]))));
        assert_eq!(pop(&mut consumer), Ok(Some((9, b"wxyz".to_vec()))));
        assert_eq!(pop(&mut consumer), Ok(None));
        assert!(producer.is_drained());
        assert_eq!(ring.head(), 16 + 8 + 16);
    }

    #[test]
    fn pads_instead_of_wrapping_a_record() {
        let mut ring = HeapRing::new(4096);
        let (mut producer, mut consumer) = ring.ends();
        for i in 0..4 {
            producer.try_push(i, &[&[i as u8; 1000]]).unwrap();
            assert_eq!(pop(&mut consumer), Ok(Some((i, vec![i as u8; 1000]))));
        }
        // 4 * 1008 bytes used: 64 left before the end, too few for a 112-byte record.
        producer.try_push(42, &[&[9; 100]]).unwrap();
        assert_eq!(ring.data[4032 / 8], header_word(56, PAD_TAG));
        assert_eq!(ring.data[0], header_word(100, 42));
        assert_eq!(&ring.data[1..13], &[u64::from_ne_bytes([9; 8]); 12]);
        assert_eq!(pop(&mut consumer), Ok(Some((42, vec![9; 100]))));
        assert_eq!(ring.head(), 4096 + 112);
    }

    #[test]
    fn full_ring_refuses_until_the_consumer_frees_space() {
        let mut ring = HeapRing::new(4096);
        let (mut producer, mut consumer) = ring.ends();
        let payload = [1u8; 504]; // 512-byte records: exactly 8 fill the ring
        for _ in 0..8 {
            producer.try_push(1, &[&payload]).unwrap();
        }
        assert_eq!(producer.free_bytes(), 0);
        assert_eq!(producer.try_push(1, &[]), Err(PushError::Full));
        assert_eq!(pop(&mut consumer), Ok(Some((1, payload.to_vec()))));
        assert_eq!(producer.free_bytes(), 512);
        producer.try_push(2, &[&payload]).unwrap();
        assert_eq!(producer.try_push(1, &[]), Err(PushError::Full));
    }

    #[test]
    fn rejects_oversized_records_and_the_pad_tag() {
        let mut ring = HeapRing::new(4096);
        let (mut producer, mut consumer) = ring.ends();
        let max = producer.max_payload();
        assert_eq!(max, 1016);
        let big = vec![5u8; max + 1];
        assert_eq!(producer.try_push(1, &[&big]), Err(PushError::TooLarge));
        assert_eq!(producer.try_push(PAD_TAG, &[]), Err(PushError::ReservedTag));
        producer.try_push(1, &[&big[..max]]).unwrap();
        assert_eq!(pop(&mut consumer), Ok(Some((1, vec![5; max]))));
        assert_eq!(pop(&mut consumer), Ok(None));
    }

    #[test]
    #[should_panic(expected = "invalid ring capacity")]
    fn refuses_a_capacity_that_is_not_a_power_of_two() {
        let mut data = vec![0u64; 1000];
        let header = RingHeader::new();
        // SAFETY: never reached: the capacity check panics first.
        let _ = unsafe { Producer::new(&header, data.as_mut_ptr().cast(), 6000) };
    }

    /// Each case: tail to publish, records to plant, expected reason.
    fn assert_corrupt(tail: u64, records: &[(usize, u32, u32)], reason: &'static str) {
        let mut ring = HeapRing::new(4096);
        let (_, mut consumer) = ring.ends();
        for &(pos, len, tag) in records {
            ring.write_header(pos, len, tag);
        }
        ring.set_tail(tail);
        assert_eq!(pop(&mut consumer), Err(Corrupt { reason }));
        // A second look fails the same way and the head never moved.
        assert_eq!(pop(&mut consumer), Err(Corrupt { reason }));
        assert_eq!(ring.head(), 0);
    }

    #[test]
    fn reports_every_kind_of_corruption() {
        let ahead = "tail is more than a ring ahead of head, or behind it";
        assert_corrupt(4104, &[], ahead);
        assert_corrupt(u64::MAX - 7, &[], ahead);
        assert_corrupt(12, &[(0, 0, 1)], "tail or head is not a multiple of 8");
        assert_corrupt(
            4096,
            &[(0, 2000, 1)],
            "record longer than the maximum payload",
        );
        assert_corrupt(16, &[(0, 9, 1)], "record runs past tail");
        assert_corrupt(
            8,
            &[(0, 100, PAD_TAG)],
            "padding record does not end at the end of the data area",
        );
        assert_corrupt(8, &[(0, 4088, PAD_TAG)], "padding record runs past tail");
    }

    #[test]
    fn reports_corruption_after_a_wrap() {
        let mut ring = HeapRing::new(4096);
        let (mut producer, mut consumer) = ring.ends();
        let payload = [0u8; 1008 - 8];
        for _ in 0..4 {
            producer.try_push(1, &[&payload]).unwrap();
            pop(&mut consumer).unwrap().unwrap();
        }
        // head is now 4032: 64 bytes before the end.
        ring.write_header(4032, 100, 1);
        ring.set_tail(4032 + 112);
        let past_end = "record runs past the end of the data area";
        assert_eq!(pop(&mut consumer), Err(Corrupt { reason: past_end }));
        // A consumer caches the tail while it has data, so each case gets a fresh one.
        ring.write_header(4032, 56, PAD_TAG);
        ring.set_tail(4096);
        let mut consumer = ring.consumer();
        let nothing = "padding record with no record after it";
        assert_eq!(pop(&mut consumer), Err(Corrupt { reason: nothing }));
        ring.write_header(0, 3, 77);
        ring.set_tail(4096 + 16);
        let mut consumer = ring.consumer();
        assert_eq!(pop(&mut consumer), Ok(Some((77, payload[..3].to_vec()))));
        assert_eq!(ring.head(), 4096 + 16);
    }
}
