//! Records that run work: kernel launches and their attributes, streams, events, host
//! functions in stream order, driver questions ([`Query`]) and green contexts.

use bytemuck::{Pod, Zeroable};

use super::header::CallHdr;

/// Followed by `num_attrs` launch attributes of [`LAUNCH_ATTR_BYTES`] each, as
/// cuLaunchKernelEx takes them, then `args_len` bytes: the kernel's parameter buffer, laid
/// out with the offsets the server reported for this function.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Launch {
    pub func: u32,
    pub stream: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub args_len: u32,
    pub num_attrs: u32,
    pub _pad: u32,
}

/// Size of one CUlaunchAttribute: a u32 id, 4 bytes of padding, a 64-byte value.
pub const LAUNCH_ATTR_BYTES: usize = 72;
pub const MAX_LAUNCH_ATTRS: u32 = 16;

/// Launch attributes that carry only values (no handles of the client's): omps forwards
/// these to the driver. The others (events, graph nodes) are refused, never dropped.
pub fn launch_attr_forwardable(id: u32) -> bool {
    matches!(id, 0..=6 | 8..=11 | 14 | 16..=18)
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct StreamCreate {
    pub id: u32,
    pub flags: u32,
    pub priority: i32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct EventCreate {
    pub id: u32,
    pub flags: u32,
}

/// Also used for StreamWaitEvent.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct EventRecord {
    pub event: u32,
    pub stream: u32,
}

/// Followed, for the cluster queries, by `num_attrs` launch attributes. The answer is a
/// [`U64Reply`](crate::wire::U64Reply) holding an i64.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Query {
    pub call: CallHdr,
    pub kind: u32,
    /// A function id, for the queries about a function; else 0.
    pub func: u32,
    pub args: [i64; 7],
    pub num_attrs: u32,
    pub _pad: u32,
}

/// [`Query::kind`] values and their `args`.
pub mod query {
    /// (block size, dynamic shared memory, flags) -> blocks per multiprocessor.
    pub const OCC_MAX_BLOCKS: u32 = 1;
    /// (blocks, block size) -> dynamic shared memory bytes available per block.
    pub const OCC_DYN_SMEM: u32 = 2;
    /// (grid x y z, block x y z, shared memory) + attributes -> clusters.
    pub const OCC_MAX_CLUSTERS: u32 = 3;
    /// As OCC_MAX_CLUSTERS -> largest cluster size.
    pub const OCC_MAX_CLUSTER_SIZE: u32 = 4;
    /// (limit) -> value.
    pub const CTX_GET_LIMIT: u32 = 5;
    /// (limit, value).
    pub const CTX_SET_LIMIT: u32 = 6;
    /// (cache config) for a function.
    pub const FUNC_CACHE_CONFIG: u32 = 7;
    /// () -> 0: persisting L2 lines become normal (cuCtxResetPersistingL2Cache).
    pub const CTX_RESET_PERSISTING_L2: u32 = 8;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct EventElapsed {
    pub call: CallHdr,
    pub start: u32,
    pub end: u32,
}

/// The most pairs one EventTimes call carries: their answers fill the reply area.
pub const EVENT_TIMES_MAX: usize = 32;

/// Times of up to EVENT_TIMES_MAX pieces of work at once (a profiler's flush): followed
/// by `count` pairs of event ids (start, end), each u32. The answer is `count`
/// [`EventTime`]s. Nothing waits: work not finished answers CUDA_ERROR_NOT_READY.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct EventTimes {
    pub call: CallHdr,
    pub anchor: u32,
    pub count: u32,
}

/// One pair's answer: the CUDA result and where the times come from. From the events
/// (`source` [`time_source::EVENTS`]): milliseconds from the anchor to the start and from
/// the start to the end (cuEventElapsedTime's). From the GPU's own record of the work
/// between the two events (`source` [`time_source::GPU`], a client the server times, see
/// [`Profiling`]): the work's start and end in CLOCK_MONOTONIC nanoseconds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct EventTime {
    pub result: i32,
    pub source: u32,
    pub from_anchor_ms: f32,
    pub length_ms: f32,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Where an [`EventTime`]'s times come from.
pub mod time_source {
    pub const EVENTS: u32 = 0;
    pub const GPU: u32 = 1;
}

/// A profiler in the client starts (`on` 1) or stops (0) tracing this GPU's work: while
/// on, the server times the client's kernels, copies and memsets with the GPU's own
/// records of them where it can, and answers the spans of [`EventTimes`] from those. The
/// answer is 0 when it does, CUDA_ERROR_NOT_SUPPORTED when it cannot (events then time
/// everything).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Profiling {
    pub call: CallHdr,
    pub on: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HostFunc {
    pub stream: u32,
    pub slot: u32,
    pub seq: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HostNodeAt {
    pub stream: u32,
    pub _pad: u32,
    /// 8-aligned: `done` at `words`, `ack` at `words + 4`.
    pub words: u64,
}

/// A client's green contexts: bookkeeping of the shim that the server needs to confine the
/// work of their streams to SMs ([`GreenCall`]'s `kind`).
pub mod green {
    /// Answers a [`super::GreenInfo`]: how the GPU's SMs divide (no chunks: no green
    /// contexts on this GPU).
    pub const QUERY: u32 = 0;
    /// Green context `green` of `sms` SMs, with `stream` as its legacy default stream.
    pub const CREATE: u32 = 1;
    /// Green context `green` goes, with every stream made in it.
    pub const DESTROY: u32 = 2;
    /// Stream `stream` (`flags`, `priority` as StreamCreate's) made in green context `green`.
    pub const STREAM: u32 = 3;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct GreenCall {
    pub call: CallHdr,
    pub kind: u32,
    pub green: u32,
    pub sms: u32,
    pub stream: u32,
    pub flags: u32,
    pub priority: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct GreenInfo {
    pub total: u32,
    /// SMs per chunk: the granularity of a confinement.
    pub chunk: u32,
    pub chunks: u32,
    pub _pad: u32,
}
