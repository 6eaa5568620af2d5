//! Where everything sits inside a client's shared segment.
//!
//! ```text
//! offset 0        SegmentHeader (one page): magic, layout, server state word
//! PAGE            DeviceSnapshot table (what the shim answers device queries from)
//! rings_offset    one command ring per GPU: RingHeader + data (client produces)
//! channels_offset channel headers, one page each: reply + completion words
//! staging_offset  staging chunks, `chunks_per_channel` per channel
//! ```
//!
//! Channels and staging are contiguous and page aligned because the server registers
//! exactly that range with the GPU: the GPU writes completion words into channel headers
//! (`cuStreamWriteValue32`) and DMAs straight from and to the staging chunks. The rings are
//! never registered, so their pages are not pinned.
//!
//! Every offset is computed by [`Layout`] from the handful of numbers in the handshake;
//! nothing in the segment holds a pointer.

use crate::ring::RING_HEADER_BYTES;
use crate::sync::CachePadded;
use bytemuck::{Pod, Zeroable};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicI32, AtomicU32};

pub const PAGE: usize = 4096;
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"omps-seg");
/// Most GPUs one server drives; one ring per GPU in every client segment.
pub const MAX_DEVICES: usize = 8;
/// Staging chunks per channel: enough to keep copy-in and DMA overlapped.
pub const CHUNKS_PER_CHANNEL: usize = 4;
/// Bytes of inline reply payload in a channel.
pub const REPLY_BYTES: usize = 1024;
/// Device attributes kept per device in the snapshot (CUdevice_attribute values below this).
pub const MAX_ATTRIBUTES: usize = 256;

/// The numbers both sides derive the layout from. Sent in the handshake.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct LayoutParams {
    pub num_rings: u32,
    pub num_channels: u32,
    pub ring_capacity: u32,
    pub chunk_bytes: u32,
}

impl LayoutParams {
    pub const DEFAULT_RING_CAPACITY: u32 = 1 << 20;
    pub const DEFAULT_CHANNELS: u32 = 8;
    pub const DEFAULT_CHUNK: u32 = 1 << 20;

    pub fn for_devices(num_devices: usize) -> Self {
        LayoutParams {
            num_rings: num_devices.clamp(1, MAX_DEVICES) as u32,
            num_channels: Self::DEFAULT_CHANNELS,
            ring_capacity: Self::DEFAULT_RING_CAPACITY,
            chunk_bytes: Self::DEFAULT_CHUNK,
        }
    }

    /// A small segment, for clients beyond the first [`LayoutParams::CROWD`]: 2 channels
    /// of 4 x 256 KiB staging and a 256 KiB ring, 2.3 MiB in all where the default is 33
    /// MiB, so 1,024 clients pin 2.4 GiB of host memory rather than 33 GiB. Large copies
    /// and many threads making synchronous calls at once are slower in it.
    pub fn for_crowd(num_devices: usize) -> Self {
        LayoutParams {
            num_channels: 2,
            ring_capacity: 1 << 18,
            chunk_bytes: 1 << 18,
            ..Self::for_devices(num_devices)
        }
    }

    /// Connected clients beyond which new ones get [`LayoutParams::for_crowd`].
    pub const CROWD: usize = 64;

    /// Rejects parameters a peer could use to make the layout overflow or misalign.
    pub fn validate(&self) -> Result<Layout, &'static str> {
        let ok_pow2 = |v: u32, min: u32, max: u32| v.is_power_of_two() && v >= min && v <= max;
        if self.num_rings == 0 || self.num_rings as usize > MAX_DEVICES {
            return Err("ring count out of range");
        }
        if self.num_channels == 0 || self.num_channels > 64 {
            return Err("channel count out of range");
        }
        if !ok_pow2(self.ring_capacity, 4096, 1 << 26) {
            return Err("ring capacity must be a power of two in 4 KiB..64 MiB");
        }
        if !ok_pow2(self.chunk_bytes, PAGE as u32, 1 << 24) {
            return Err("chunk size must be a power of two in 4 KiB..16 MiB");
        }
        Ok(Layout::new(*self))
    }
}

/// Byte offsets of every region, derived from [`LayoutParams`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub params: LayoutParams,
    pub snapshot_offset: usize,
    pub rings_offset: usize,
    pub ring_stride: usize,
    pub channels_offset: usize,
    /// One page of [`HostFnSlot`]s: host functions in stream order (see [`HostFnSlot`]).
    pub hostfn_offset: usize,
    pub staging_offset: usize,
    pub total_len: usize,
}

/// A host function queued on a stream: the GPU writes `done = seq` when the stream
/// reaches it, the client runs the function and writes `ack = seq`, and the stream waits
/// for that before going on. A client that never acknowledges holds up its own stream.
#[repr(C)]
pub struct HostFnSlot {
    pub done: AtomicU32,
    pub ack: AtomicU32,
}

/// Host functions that can be queued at once, per client.
pub const HOSTFN_SLOTS: usize = PAGE / core::mem::size_of::<HostFnSlot>();

const fn page_up(n: usize) -> usize {
    (n + PAGE - 1) & !(PAGE - 1)
}

impl Layout {
    fn new(p: LayoutParams) -> Self {
        let snapshot_offset = PAGE;
        let rings_offset = page_up(snapshot_offset + core::mem::size_of::<SnapshotTable>());
        let ring_stride = page_up(RING_HEADER_BYTES + p.ring_capacity as usize);
        let channels_offset = rings_offset + ring_stride * p.num_rings as usize;
        let hostfn_offset = channels_offset + PAGE * p.num_channels as usize;
        let staging_offset = hostfn_offset + PAGE;
        let staging_len = p.num_channels as usize * CHUNKS_PER_CHANNEL * p.chunk_bytes as usize;
        Layout {
            params: p,
            snapshot_offset,
            rings_offset,
            ring_stride,
            channels_offset,
            hostfn_offset,
            staging_offset,
            total_len: staging_offset + staging_len,
        }
    }

    /// Offset of ring `i`'s header; its data follows `RING_HEADER_BYTES` later.
    pub fn ring_offset(&self, i: usize) -> usize {
        self.rings_offset + i * self.ring_stride
    }

    pub fn channel_offset(&self, c: usize) -> usize {
        self.channels_offset + c * PAGE
    }

    pub fn chunk_offset(&self, c: usize, chunk: usize) -> usize {
        self.staging_offset + (c * CHUNKS_PER_CHANNEL + chunk) * self.params.chunk_bytes as usize
    }

    /// The range the server registers with the GPU: channel headers and staging.
    pub fn registered_range(&self) -> (usize, usize) {
        (self.channels_offset, self.total_len - self.channels_offset)
    }

    /// What of [`Layout::registered_range`] the GPU needs before any copy: the channel
    /// headers (completion words) and the host-function page. The server may register
    /// this alone and each channel's [`Layout::staging_range`] at its first copy.
    pub fn control_range(&self) -> (usize, usize) {
        (
            self.channels_offset,
            self.staging_offset - self.channels_offset,
        )
    }

    /// Channel `c`'s staging chunks, contiguous and page aligned; None past the channels.
    pub fn staging_range(&self, c: usize) -> Option<(usize, usize)> {
        let len = CHUNKS_PER_CHANNEL * self.params.chunk_bytes as usize;
        (c < self.params.num_channels as usize).then(|| (self.staging_offset + c * len, len))
    }
}

/// Server state as seen by a client, in [`SegmentHeader::server_state`].
pub mod state {
    pub const ACTIVE: u32 = 0;
    /// The server disconnected this client (malformed command) or is going away.
    pub const DISCONNECTED: u32 = 1;
    /// A fatal GPU fault poisoned the shared context.
    pub const FAULT: u32 = 2;
}

/// First page of the segment.
#[repr(C)]
pub struct SegmentHeader {
    pub magic: u64,
    pub params: LayoutParams,
    pub client_id: u32,
    /// One of [`state`]; a futex word so waiting clients can be woken when it changes.
    pub server_state: AtomicU32,
    /// The CUresult behind a FAULT or DISCONNECTED state.
    pub state_code: AtomicI32,
    /// How long the client may stay on the CPU waiting for an answer (spinning, then
    /// yielding) before it sleeps on the word, in microseconds; 0: [`WaitPlan::DEFAULT`].
    /// The server lowers it while more clients are connected than it has CPUs: clients
    /// that spin then take the CPUs from the lanes and from each other (section 5 of
    /// docs/design.md). Read at every wait; a client that ignores it only costs CPU.
    pub wait_active_us: AtomicU32,
}

/// How a client waits for a word: spins for `spin`, then yields the CPU between looks
/// until `active` has passed since the start, then sleeps on the word's futex (the server
/// wakes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitPlan {
    pub spin: core::time::Duration,
    pub active: core::time::Duration,
}

impl WaitPlan {
    /// As the driver's default waits: an answer that comes within a few hundred
    /// microseconds (a short graph's synchronize) costs no futex wake.
    pub const DEFAULT: WaitPlan = WaitPlan {
        spin: core::time::Duration::from_micros(200),
        active: core::time::Duration::from_millis(2),
    };

    /// The plan a header's `wait_active_us` asks for (0: the default; never longer).
    pub fn from_header(active_us: u32) -> WaitPlan {
        if active_us == 0 {
            return Self::DEFAULT;
        }
        let active = core::time::Duration::from_micros(active_us as u64).min(Self::DEFAULT.active);
        WaitPlan {
            spin: active.min(Self::DEFAULT.spin),
            active,
        }
    }
}

/// One channel: a caller's in-flight synchronous call and its staging chunks.
///
/// `done` and `chunk_done` hold the sequence number of the last finished call or chunk
/// transfer. The server writes them from the CPU, or the GPU writes them in stream order
/// with `cuStreamWriteValue32`; either way the client waits for `== seq`.
#[repr(C)]
pub struct Channel {
    pub done: CachePadded<AtomicU32>,
    /// The client sets this before it sleeps on `done` or a `chunk_done` word; the server
    /// then wakes it after completing.
    pub waiting: CachePadded<AtomicU32>,
    pub chunk_done: [CachePadded<AtomicU32>; CHUNKS_PER_CHANNEL],
    /// CUresult of the call, written before `done`.
    pub result: AtomicI32,
    /// Bytes of reply payload that follow; beyond `REPLY_BYTES` they are in chunk 0.
    pub reply_len: AtomicU32,
    reply: UnsafeCell<[u8; REPLY_BYTES]>,
}

// SAFETY: `reply` is only touched through the copy methods below, and the protocol hands it
// over with the `done` word: the server writes it before its Release store of `done`, the
// client reads it after its Acquire load sees `seq`.
unsafe impl Sync for Channel {}

impl Channel {
    /// Server side: copies `bytes` (at most REPLY_BYTES) into the reply area.
    pub fn write_reply(&self, bytes: &[u8]) {
        let n = bytes.len().min(REPLY_BYTES);
        // SAFETY: n is within the area; the peer does not read it until `done` flips, and a
        // hostile peer that does so only sees torn bytes of its own reply.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), self.reply.get() as *mut u8, n) };
    }

    /// Client side: copies the reply area into `out` (at most REPLY_BYTES).
    pub fn read_reply(&self, out: &mut [u8]) {
        let n = out.len().min(REPLY_BYTES);
        // SAFETY: n is within the area; see write_reply for the hand-off.
        unsafe {
            core::ptr::copy_nonoverlapping(self.reply.get() as *const u8, out.as_mut_ptr(), n)
        };
    }

    /// The word a completion for `target` lands in.
    pub fn word(&self, target: Word) -> Option<&AtomicU32> {
        match target {
            Word::Done => Some(&self.done),
            Word::Chunk(i) => self.chunk_done.get(i as usize).map(|c| &**c),
        }
    }
}

/// Which completion word of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Word {
    Done,
    Chunk(u8),
}

const _: () = assert!(core::mem::size_of::<Channel>() <= PAGE);
const _: () = assert!(core::mem::size_of::<SegmentHeader>() <= PAGE);

/// What the shim needs to answer device queries without a round trip.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct DeviceSnapshot {
    pub name: [u8; 256],
    pub uuid: [u8; 16],
    /// As cuDeviceGetPCIBusId writes it, NUL-terminated.
    pub pci_bus_id: [u8; 32],
    /// cuCtxGetStreamPriorityRange: least, greatest.
    pub stream_priority: [i32; 2],
    pub total_mem: u64,
    /// `attributes[a]` is CUdevice_attribute `a`; `attr_valid` says whether the driver had it.
    pub attributes: [i32; MAX_ATTRIBUTES],
    pub attr_valid: [u8; MAX_ATTRIBUTES],
    /// The driver's TPC-to-virtual-GPC and TPC-in-GPC maps (export table 1734dc26,
    /// entry 4), which cuBLASLt reads; `tpc_map_len` is 0 where the driver gave none.
    pub tpc_vgpc: [u8; TPC_MAP_MAX],
    pub tpc_mtpc: [u8; TPC_MAP_MAX],
    pub tpc_map_len: [u32; 2],
    /// Per peer device (numbered as this table numbers devices): cuDeviceGetP2PAttribute
    /// `a` at index `a - 1` ([`P2P_ATTRIBUTES`] of them); access (attribute 2) is 1 where
    /// the server has enabled access from this device to that one.
    pub p2p: [[i32; P2P_ATTRIBUTES]; MAX_DEVICES],
}

/// cuDeviceGetP2PAttribute's attributes kept per pair of devices (1 to 5 in CUDA 13, the
/// rest spare).
pub const P2P_ATTRIBUTES: usize = 8;
/// Of those, the ones the driver defines.
pub const P2P_DEFINED: usize = 5;

/// Bytes kept of each TPC map (a byte per TPC; an H100 has 66 TPCs).
pub const TPC_MAP_MAX: usize = 512;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct SnapshotTable {
    pub driver_version: i32,
    pub device_count: u32,
    pub devices: [DeviceSnapshot; MAX_DEVICES],
}

impl DeviceSnapshot {
    pub fn name_str(&self) -> &str {
        let end = self
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.name.len());
        core::str::from_utf8(&self.name[..end]).unwrap_or("")
    }

    pub fn attribute(&self, attr: usize) -> Option<i32> {
        (attr < MAX_ATTRIBUTES && self.attr_valid[attr] != 0).then(|| self.attributes[attr])
    }
}

/// Typed access to a mapped segment. Holds the base address only; the mapping's owner
/// guarantees it outlives this view.
#[derive(Clone, Copy)]
pub struct SegmentView {
    base: *mut u8,
    pub layout: Layout,
}

// SAFETY: the view only hands out references to atomics and Pod data in shared memory,
// which are fine to use from any thread.
unsafe impl Send for SegmentView {}
// SAFETY: as above.
unsafe impl Sync for SegmentView {}

impl SegmentView {
    /// # Safety
    /// `base` points to a mapping of at least `layout.total_len` bytes, page aligned, that
    /// stays mapped for as long as the view or anything borrowed from it is used.
    pub unsafe fn new(base: *mut u8, layout: Layout) -> Self {
        SegmentView { base, layout }
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    pub fn header(&self) -> &SegmentHeader {
        // SAFETY: offset 0 is inside the mapping, page aligned; SegmentHeader is all atomics
        // and plain integers for which any bit pattern is valid.
        unsafe { &*(self.base as *const SegmentHeader) }
    }

    pub fn snapshot(&self) -> &SnapshotTable {
        // SAFETY: the snapshot region lies inside the mapping (Layout::new) and is Pod.
        unsafe { &*(self.base.add(self.layout.snapshot_offset) as *const SnapshotTable) }
    }

    /// # Safety
    /// No other reference to the snapshot is alive (the server writes it before sharing).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn snapshot_mut(&self) -> &mut SnapshotTable {
        // SAFETY: as snapshot(); exclusivity is the caller's promise.
        unsafe { &mut *(self.base.add(self.layout.snapshot_offset) as *mut SnapshotTable) }
    }

    /// Host-function slot `i`, if in range.
    pub fn hostfn(&self, i: usize) -> Option<&HostFnSlot> {
        (i < HOSTFN_SLOTS).then(|| {
            // SAFETY: the slots page lies inside the mapping (Layout::new), is 4-byte
            // aligned, and holds HOSTFN_SLOTS slots of atomics.
            unsafe {
                &*(self
                    .base
                    .add(self.layout.hostfn_offset + i * core::mem::size_of::<HostFnSlot>())
                    as *const HostFnSlot)
            }
        })
    }

    /// Changes attribute `attr` of device `dev` in the snapshot while the client runs (an
    /// operator's compute limit changes its SM count): one aligned 4-byte store, which the
    /// client reads whole. Out-of-range indices change nothing.
    pub fn publish_attribute(&self, dev: usize, attr: usize, value: i32) {
        if dev >= MAX_DEVICES || attr >= MAX_ATTRIBUTES {
            return;
        }
        let snap = self.snapshot() as *const SnapshotTable as *mut SnapshotTable;
        // SAFETY: in bounds (checked above) of the mapped, 4-byte aligned snapshot; the
        // store goes through an atomic, so a concurrent reader sees the old or new value.
        unsafe {
            let p = std::ptr::addr_of_mut!((*snap).devices[dev].attributes[attr]);
            std::sync::atomic::AtomicI32::from_ptr(p)
                .store(value, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Attribute `attr` of device `dev` as the server last published it (see
    /// [`SegmentView::publish_attribute`]).
    pub fn read_attribute(&self, dev: usize, attr: usize) -> Option<i32> {
        if dev >= MAX_DEVICES || attr >= MAX_ATTRIBUTES {
            return None;
        }
        let snap = self.snapshot() as *const SnapshotTable as *mut SnapshotTable;
        // SAFETY: in bounds of the mapped, aligned snapshot; read through an atomic, as the
        // server writes it.
        Some(unsafe {
            let p = std::ptr::addr_of_mut!((*snap).devices[dev].attributes[attr]);
            std::sync::atomic::AtomicI32::from_ptr(p).load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// Header and data pointers of ring `i` (panics if `i` is out of range).
    pub fn ring_parts(&self, i: usize) -> (*const crate::ring::RingHeader, *mut u8, usize) {
        assert!(
            i < self.layout.params.num_rings as usize,
            "ring index out of range"
        );
        let off = self.layout.ring_offset(i);
        // SAFETY: ring i lies inside the mapping by construction of Layout.
        let hdr = unsafe { self.base.add(off) };
        // SAFETY: as above; the data follows the header inside the same ring stride.
        let data = unsafe { self.base.add(off + RING_HEADER_BYTES) };
        (
            hdr as *const _,
            data,
            self.layout.params.ring_capacity as usize,
        )
    }

    /// Channel `c`; `None` when the index is out of range (it may come from a hostile peer).
    pub fn channel(&self, c: usize) -> Option<&Channel> {
        if c >= self.layout.params.num_channels as usize {
            return None;
        }
        // SAFETY: c is in range, so the page lies inside the mapping; Channel is atomics and
        // bytes, valid for any bit pattern.
        Some(unsafe { &*(self.base.add(self.layout.channel_offset(c)) as *const Channel) })
    }

    /// Staging chunk `chunk` of channel `c` as a raw pointer and its length.
    pub fn chunk(&self, c: usize, chunk: usize) -> Option<(*mut u8, usize)> {
        if c >= self.layout.params.num_channels as usize || chunk >= CHUNKS_PER_CHANNEL {
            return None;
        }
        // SAFETY: both indices are in range, so the chunk lies inside the mapping.
        let p = unsafe { self.base.add(self.layout.chunk_offset(c, chunk)) };
        Some((p, self.layout.params.chunk_bytes as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_regions_do_not_overlap_and_are_page_aligned() {
        let l = LayoutParams::for_devices(3).validate().unwrap();
        assert!(l.snapshot_offset + core::mem::size_of::<SnapshotTable>() <= l.rings_offset);
        assert_eq!(l.ring_offset(1) - l.ring_offset(0), l.ring_stride);
        assert!(l.ring_offset(2) + l.ring_stride <= l.channels_offset);
        assert_eq!(l.channels_offset % PAGE, 0);
        assert_eq!(l.staging_offset % PAGE, 0);
        assert_eq!(
            l.chunk_offset(7, 3) + l.params.chunk_bytes as usize,
            l.total_len
        );
    }

    #[test]
    fn control_and_staging_ranges_tile_the_registered_range() {
        for p in [LayoutParams::for_devices(2), LayoutParams::for_crowd(1)] {
            let l = p.validate().unwrap();
            let (start, len) = l.registered_range();
            let (c_at, c_len) = l.control_range();
            assert_eq!(c_at, start);
            let mut at = c_at + c_len;
            for c in 0..p.num_channels as usize {
                let (s_at, s_len) = l.staging_range(c).unwrap();
                assert_eq!(s_at, at, "channel {c} follows the one before");
                assert_eq!(s_at % PAGE, 0);
                assert_eq!(s_len % PAGE, 0);
                // Every chunk of the channel, and nothing of another.
                for k in 0..CHUNKS_PER_CHANNEL {
                    let o = l.chunk_offset(c, k);
                    assert!(o >= s_at && o + p.chunk_bytes as usize <= s_at + s_len);
                }
                at = s_at + s_len;
            }
            assert_eq!(
                at,
                start + len,
                "the ranges end where the registered range does"
            );
            assert_eq!(l.staging_range(p.num_channels as usize), None);
        }
    }

    #[test]
    fn a_wait_plan_is_the_default_unless_the_server_asks_for_less() {
        use core::time::Duration;
        assert_eq!(WaitPlan::from_header(0), WaitPlan::DEFAULT);
        let crowded = WaitPlan::from_header(20);
        assert_eq!(crowded.spin, Duration::from_micros(20));
        assert_eq!(crowded.active, Duration::from_micros(20), "no yielding");
        assert_eq!(
            WaitPlan::from_header(u32::MAX),
            WaitPlan::DEFAULT,
            "never longer"
        );
        assert_eq!(WaitPlan::from_header(500).spin, Duration::from_micros(200));
    }

    #[test]
    fn hostile_layout_params_are_rejected() {
        let good = LayoutParams::for_devices(1);
        for bad in [
            LayoutParams {
                num_rings: 0,
                ..good
            },
            LayoutParams {
                num_rings: 99,
                ..good
            },
            LayoutParams {
                num_channels: 0,
                ..good
            },
            LayoutParams {
                ring_capacity: 5000,
                ..good
            },
            LayoutParams {
                ring_capacity: u32::MAX,
                ..good
            },
            LayoutParams {
                chunk_bytes: 1,
                ..good
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?} accepted");
        }
    }
}
