//! The one door through which the ring touches memory shared with the other side.
//!
//! Under `cfg(loom)` the atomics are loom's, so the model checker sees every one of them.
//! Loom cannot see plain loads and stores through raw pointers, so under loom the data
//! area is an array of `AtomicU64` words (one per 8 bytes) accessed with relaxed
//! operations: payload bytes then become visible to the other side only through the
//! ring's Release/Acquire pairs, and a missing pair shows up as a wrong payload.

#[cfg(loom)]
pub use loom::hint::spin_loop;
#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub use core::hint::spin_loop;
#[cfg(not(loom))]
pub use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Keeps its value on its own 128-byte block so that the producer's and consumer's
/// indices never share a cache line (or an adjacent-line prefetch pair).
///
/// Ours rather than crossbeam's because the layout must be `repr(C)` to live in a
/// segment that two separately compiled programs read.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub struct CachePadded<T> {
    value: T,
}

impl<T> CachePadded<T> {
    pub const fn new(value: T) -> Self {
        Self { value }
    }
}

impl<T> core::ops::Deref for CachePadded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> core::ops::DerefMut for CachePadded<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

/// Copies `src` into the data area at byte `offset`.
///
/// # Safety
/// `data` is the ring's data area (under loom: `capacity / 8` `AtomicU64` cells),
/// `offset + src.len()` does not pass its end, and under loom `offset` is a multiple of 8.
#[cfg(not(loom))]
pub(crate) unsafe fn write_data(data: *mut u8, offset: usize, src: &[u8]) {
    // SAFETY: the caller guarantees the range lies inside the data area; `src` is
    // private memory so the two cannot overlap.
    unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), data.add(offset), src.len()) }
}

/// Copies `len` bytes at `offset` out of the data area into `dst`, which may be
/// uninitialised (it is a `Vec`'s spare capacity).
///
/// # Safety
/// As for [`write_data`], and `dst` is valid for `len` bytes of writes.
#[cfg(not(loom))]
pub(crate) unsafe fn read_data(data: *const u8, offset: usize, dst: *mut u8, len: usize) {
    // SAFETY: the caller guarantees both ranges; `dst` is private memory so the two
    // cannot overlap.
    unsafe { core::ptr::copy_nonoverlapping(data.add(offset), dst, len) }
}

/// Lets `fill` write `len` bytes at `offset` of the data area in place.
///
/// # Safety
/// As for [`write_data`], with `len` for `src.len()`, and nothing else touches that
/// range while `fill` runs (the ring's free-space accounting guarantees it for an honest
/// peer; a dishonest one can only garble its own records).
#[cfg(not(loom))]
pub(crate) unsafe fn fill_data(
    data: *mut u8,
    offset: usize,
    len: usize,
    fill: impl FnOnce(&mut [u8]),
) {
    // SAFETY: the caller guarantees the range is inside the data area and is ours alone.
    fill(unsafe { core::slice::from_raw_parts_mut(data.add(offset), len) })
}

#[cfg(loom)]
unsafe fn cell<'a>(data: *const u8, offset: usize) -> &'a AtomicU64 {
    debug_assert_eq!(offset % 8, 0);
    // SAFETY: under loom the caller's data area is an array of `AtomicU64` cells and
    // the offset lies inside it.
    unsafe { &*(data as *const AtomicU64).add(offset / 8) }
}

/// Loom version of the plain-memory copy: whole words, the tail word zero-padded.
///
/// # Safety
/// See the non-loom version.
#[cfg(loom)]
pub(crate) unsafe fn write_data(data: *mut u8, offset: usize, src: &[u8]) {
    for (i, chunk) in src.chunks(8).enumerate() {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        // SAFETY: forwarded from the caller.
        let cell = unsafe { cell(data, offset + i * 8) };
        cell.store(u64::from_ne_bytes(word), Ordering::Relaxed);
    }
}

/// # Safety
/// See the non-loom version.
#[cfg(loom)]
pub(crate) unsafe fn read_data(data: *const u8, offset: usize, dst: *mut u8, len: usize) {
    for at in (0..len).step_by(8) {
        // SAFETY: forwarded from the caller.
        let cell = unsafe { cell(data, offset + at) };
        let word = cell.load(Ordering::Relaxed).to_ne_bytes();
        let n = (len - at).min(8);
        // SAFETY: `at + n <= len`, inside what the caller said `dst` holds.
        unsafe { core::ptr::copy_nonoverlapping(word.as_ptr(), dst.add(at), n) }
    }
}

/// # Safety
/// See the non-loom version.
#[cfg(loom)]
pub(crate) unsafe fn fill_data(
    data: *mut u8,
    offset: usize,
    len: usize,
    fill: impl FnOnce(&mut [u8]),
) {
    let mut staged = vec![0u8; len];
    fill(&mut staged);
    // SAFETY: forwarded from the caller.
    unsafe { write_data(data, offset, &staged) }
}
