//! Records for CUDA graphs: stream capture, instantiation, launches, queries and
//! conditional nodes. A graph a client captures holds only that client's work: capture
//! runs in the server on the client stream's own work stream. Graph and executable-graph
//! ids are the server's, per client.

use bytemuck::{Pod, Zeroable};

use super::header::CallHdr;

pub mod graph {
    /// CUstreamCaptureStatus.
    pub const STATUS_NONE: u32 = 0;
    pub const STATUS_ACTIVE: u32 = 1;
    pub const STATUS_INVALIDATED: u32 = 2;
    /// GraphQuery kinds: how many nodes; the CUgraphNodeType of node `index`.
    pub const NODE_COUNT: u32 = 0;
    pub const NODE_TYPE: u32 = 1;
    /// GraphCond kinds. HOME: an empty graph of the client's, for a graph built in the
    /// shim that has conditional nodes (its id as a U64Reply). HANDLE: a conditional
    /// handle of graph `graph` (`value`: default launch value, `flags`). NODE: a
    /// conditional node of handle `handle` (`value`: CUgraphConditionalNodeType, `size`
    /// bodies) where stream `stream`'s capture into a home graph or body stands; the
    /// first body's id (the others follow it). CAPTURE_TO: stream `stream` begins
    /// capturing into home graph or body `graph`. CLEAR: home graph `graph` loses its
    /// nodes (and their bodies), keeping its handles. EXEC_UPDATE: executable graph
    /// `handle` takes the parameters of graph `graph` (cuGraphExecUpdate: a graph with
    /// conditional nodes is instantiated only once). A capture's graph that made handles
    /// is a home too, named by its id once the capture ended.
    pub const COND_HOME: u32 = 0;
    pub const COND_HANDLE: u32 = 1;
    pub const COND_NODE: u32 = 2;
    pub const CAPTURE_TO: u32 = 3;
    pub const COND_CLEAR: u32 = 4;
    pub const EXEC_UPDATE: u32 = 5;
    /// COND_HANDLE for the graph of the capture going on on stream `stream`.
    pub const COND_HANDLE_CAPTURE: u32 = 6;
    /// GRAPH_CLONE: a copy of graph `graph` (its id). CHILD_NODE: a child-graph node of
    /// (a copy of) graph `graph` where stream `stream`'s capture stands, which continues
    /// after it.
    pub const GRAPH_CLONE: u32 = 7;
    pub const CHILD_NODE: u32 = 8;
    /// The most bodies a conditional node may have (a SWITCH's cases).
    pub const MAX_BODIES: u32 = 1024;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct GraphCond {
    pub call: CallHdr,
    /// A [`graph`] COND_* kind.
    pub kind: u32,
    pub stream: u32,
    pub graph: u32,
    pub size: u32,
    pub handle: u64,
    pub value: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct GraphQuery {
    pub call: CallHdr,
    pub graph: u32,
    pub kind: u32,
    pub index: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct CaptureCall {
    pub call: CallHdr,
    pub stream: u32,
    /// CUstreamCaptureMode the client asked for (the shim enforces it for its threads).
    pub mode: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct CaptureInfo {
    /// A [`graph`] status.
    pub status: u32,
    pub _pad: u32,
    /// The capture's unique id, while one is active.
    pub id: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct GraphInstantiate {
    pub call: CallHdr,
    pub graph: u32,
    pub _pad: u32,
    pub flags: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct GraphLaunch {
    pub exec: u32,
    pub stream: u32,
}

/// The timed nodes of executable graph `exec`'s profiling twin, from node `first` on (a
/// profiler traces its replays; docs/design.md 12b, design G). The answer is a
/// [`ProfiledNodes`] and up to PROFILED_PER_REPLY [`ProfiledNode`]s.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct GraphProfileInfo {
    pub call: CallHdr,
    pub exec: u32,
    pub first: u32,
}

/// How many timed nodes the twin has, and how many follow in this answer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ProfiledNodes {
    pub total: u32,
    pub count: u32,
}

/// A timed node: `kind` is its CUgraphNodeType (kernel 0, memcpy 1, memset 2). A kernel
/// has the client's function id (0: not one of its own), shape and dynamic shared memory;
/// a memset its value and bytes; a memcpy its bytes and the sides' CUmemorytype
/// (`src_type`, `dst_type`: 1 host, 2 device, 3 array, 4 unified).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ProfiledNode {
    pub kind: u32,
    pub func: u32,
    pub shared: u32,
    pub value: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub bytes: u64,
    pub src_type: u8,
    pub dst_type: u8,
    pub _pad: [u8; 6],
}

/// Timed nodes one answer holds (a 1 KiB reply area, after its ProfiledNodes).
pub const PROFILED_PER_REPLY: usize = 18;

/// A launch of `exec`'s profiling twin on `stream`: followed by 2 x `count` event ids of
/// the client's own, a start and an end for each timed node, in order (`count` is the
/// twin's node total).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct GraphLaunchProfiled {
    pub exec: u32,
    pub stream: u32,
    pub count: u32,
    pub _pad: u32,
}
