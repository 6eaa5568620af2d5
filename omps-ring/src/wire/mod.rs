//! The wire format: plain-old-data records.
//!
//! A ring record's tag is an [`Op`]; its payload is that op's fixed-size struct, optionally
//! followed by variable bytes (kernel arguments, a symbol name). Calls that need an answer
//! carry a [`CallHdr`] naming the channel the answer goes to and the sequence number the
//! channel's `done` word takes when it is there.
//!
//! Handles that cross the wire are small integers the client chose (streams, events) or the
//! server assigned (modules, functions); device pointers are the real device addresses. The
//! server resolves every one of them in that client's own tables.

use bytemuck::{Pod, Zeroable};

pub const PROTOCOL_VERSION: u32 = 10;
pub const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"omps-hi!");

/// The stream handle a client uses for its legacy default stream (CUDA's `0`).
pub const STREAM_DEFAULT: u32 = 0;

macro_rules! ops {
    ($($(#[$doc:meta])* $name:ident = $val:expr => $ty:ty,)*) => {
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Op { $($(#[$doc])* $name = $val,)* }

        impl Op {
            pub fn from_tag(tag: u32) -> Option<Op> {
                match tag { $($val => Some(Op::$name),)* _ => None }
            }

            /// Size of the fixed part of this op's payload.
            pub fn fixed_len(self) -> usize {
                match self { $(Op::$name => core::mem::size_of::<$ty>(),)* }
            }
        }
    };
}

ops! {
    // Fire-and-forget: errors surface at the client's next synchronizing call.
    Launch = 1 => Launch,
    Memset = 2 => Memset,
    CopyDtoD = 3 => CopyDtoD,
    /// A device-to-device copy whose far end lies on another GPU of the client's, run on
    /// this GPU's stream over direct peer access (the client enabled it).
    CopyPeer = 28 => CopyPeer,
    CopyHtoDChunk = 4 => ChunkCopy,
    CopyDtoHChunk = 5 => ChunkCopy,
    BlobAppend = 6 => ChunkCopy,
    StreamCreate = 7 => StreamCreate,
    StreamDestroy = 8 => Handle,
    EventCreate = 9 => EventCreate,
    EventDestroy = 10 => Handle,
    EventRecord = 11 => EventRecord,
    StreamWaitEvent = 12 => EventRecord,
    MemFree = 13 => MemFree,
    ModuleUnload = 14 => Handle,
    // Calls: answered in a channel.
    MemAlloc = 32 => MemAlloc,
    MemGetInfo = 33 => CallHdr,
    /// The client enables direct access from this GPU to its device `peer`: the server
    /// enables it in its context if it has not yet, and from now on what the client frees
    /// waits for its work on every GPU (answered, so that no later free on another ring
    /// overtakes it).
    PeerAccess = 62 => PeerAccess,
    ModuleLoad = 34 => ModuleLoad,
    ModuleGetGlobal = 35 => ModuleGetGlobal,
    FuncGetAttribute = 36 => FuncGetAttribute,
    StreamSync = 37 => HandleCall,
    StreamQuery = 38 => HandleCall,
    EventSync = 39 => HandleCall,
    EventQuery = 40 => HandleCall,
    EventElapsed = 41 => EventElapsed,
    CtxSync = 42 => CallHdr,
    /// Waits until every earlier command of this client on this GPU has been handled by
    /// the server (not by the GPU); answers pending asynchronous errors.
    Ping = 43 => CallHdr,
    FuncSetAttribute = 44 => FuncSetAttribute,
    /// Questions for the driver that take a few numbers: occupancy, limits, cache config.
    Query = 45 => Query,
    /// Copies between device memory and the client's pinned host memory: DMA, no staging.
    CopyHtoDPinned = 15 => PinnedCopy,
    CopyDtoHPinned = 16 => PinnedCopy,
    /// Host to device of a few bytes carried in the record (see [`InlineCopy`]).
    CopyHtoDInline = 17 => InlineCopy,
    /// Virtual memory management: reservations, physical handles, mappings, and memory
    /// shared between clients as physical handles or pools (see [`vmm`]).
    Vmm = 46 => Vmm,
    /// Encodes a TMA descriptor with the driver; the answer is its 128 bytes.
    TensorMap = 47 => TensorMap,
    /// JIT-links the [`link`] container uploaded into this channel's blob; the answer is
    /// a [`LinkReply`], the output stays in the server for BlobFetch.
    Link = 48 => ModuleLoad,
    /// Loads the PTX of the [`link`] container uploaded into this channel's blob (value
    /// options, one PTX input) as cuModuleLoadDataEx compiles it: the function table in
    /// chunk 0 as for ModuleLoad, the answer a [`LinkReply`] with the logs' lengths (on
    /// failure too); the logs stay in the server for BlobFetch.
    ModuleLoadJit = 63 => ModuleLoad,
    /// Copies `len` bytes of this channel's link output from offset `dev` into a chunk.
    BlobFetch = 18 => ChunkCopy,
    /// Graphs (see [`graph`]): launches and releases are fire-and-forget, like kernels.
    GraphLaunch = 19 => GraphLaunch,
    GraphUpload = 20 => GraphLaunch,
    GraphDestroy = 21 => Handle,
    GraphExecDestroy = 22 => Handle,
    /// A host function in stream order, through host-function slot `slot` (see
    /// [`crate::segment::HostFnSlot`]).
    HostFunc = 23 => HostFunc,
    /// CU_EVENT_RECORD_EXTERNAL and CU_EVENT_WAIT_EXTERNAL: inside a capture, an event
    /// record or wait node rather than an edge.
    EventRecordExternal = 24 => EventRecord,
    StreamWaitEventExternal = 25 => EventRecord,
    /// A host node of the graph being captured on `stream`, through host-function slot
    /// `slot`, which the graph keeps for the client's life (`seq` unused): on every replay
    /// the GPU writes `done = 1`, waits for `ack == 1`, then writes `ack = 0`.
    HostNode = 26 => HostFunc,
    /// A host node as [`Op::HostNode`] whose two words (`done`, then `ack`) lie at
    /// `words` in the client's pinned memory instead of a host-function slot: the graphs
    /// that stage pageable copies hold one each, as many as they like.
    HostNodeAt = 64 => HostNodeAt,
    /// Stream capture begins, or ends with the graph's id as a [`U64Reply`].
    CaptureBegin = 49 => CaptureCall,
    CaptureEnd = 50 => CaptureCall,
    /// A stream's capture status, as a [`CaptureInfo`].
    CaptureStatus = 51 => HandleCall,
    /// Instantiates graph `id` (`flags`: CUgraphInstantiate_flags); the executable
    /// graph's id as a [`U64Reply`].
    GraphInstantiate = 52 => GraphInstantiate,
    /// A question about a graph ([`graph::NODE_COUNT`], [`graph::NODE_TYPE`]): a
    /// [`U64Reply`].
    GraphQuery = 53 => GraphQuery,
    /// IPC (see [`ipc`]): an [`IpcHandle`] for an allocation of the caller's.
    IpcGetMemHandle = 54 => IpcCall,
    /// Opens an [`IpcHandle`] another client exported: the pointer as a [`U64Reply`].
    IpcOpenMemHandle = 55 => IpcOpen,
    IpcCloseMemHandle = 56 => IpcCall,
    /// An [`IpcHandle`] for event `id` of the caller's (made interprocess).
    IpcGetEventHandle = 57 => HandleCall,
    /// Opens another client's exported event as this client's event `id`.
    IpcOpenEventHandle = 58 => IpcOpenEvent,
    /// CUDA arrays and mipmapped arrays (see [`array`]): made, given a level, destroyed.
    Array = 59 => ArrayCall,
    /// A copy with a CUDA array on one side or both, in stream order.
    ArrayCopy = 27 => ArrayCopy,
    /// Texture and surface objects (see [`tex`]): made over a resource, destroyed.
    TexObject = 60 => TexCall,
    /// Conditional graph nodes and captures into a given graph (see [`graph`]'s COND_*).
    GraphCond = 61 => GraphCond,
    /// Green contexts (see [`green`]): the GPU's SM granularity, a green context made or
    /// destroyed, a stream made in one. Answered.
    Green = 90 => GreenCall,
}

/// Where an answer goes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct CallHdr {
    pub channel: u32,
    pub seq: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Handle {
    pub id: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HandleCall {
    pub call: CallHdr,
    pub id: u32,
    pub _pad: u32,
}

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
pub struct Memset {
    pub dst: u64,
    /// Elements, not bytes.
    pub count: u64,
    pub value: u32,
    /// 1, 2 or 4.
    pub elem_size: u32,
    pub stream: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct CopyDtoD {
    pub dst: u64,
    pub src: u64,
    pub len: u64,
    pub stream: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct PeerAccess {
    pub call: CallHdr,
    /// The device to reach, in the client's numbering.
    pub peer: u32,
    pub _pad: u32,
}

/// A copy between this GPU's memory and the memory of the client's device `peer` (its
/// own numbering); `far_is_src` says which end lies there.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct CopyPeer {
    pub dst: u64,
    pub src: u64,
    pub len: u64,
    pub stream: u32,
    pub peer: u32,
    pub far_is_src: u32,
    pub _pad: u32,
}

/// One staged piece of a host copy or of an upload. `dev` is the device address for
/// copies and unused for blob appends. When the chunk is free again, the chunk's
/// `chunk_done` word becomes `seq`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ChunkCopy {
    pub dev: u64,
    pub channel: u32,
    pub chunk: u32,
    pub len: u32,
    pub seq: u32,
    pub stream: u32,
    pub _pad: u32,
}

/// Followed by `len` bytes for device address `dev`: a multiple of 4, at most
/// [`INLINE_COPY_MAX`], `dev` 4-byte aligned. The GPU writes them in stream order as
/// 32-bit values, so a small pageable copy needs no staging chunk and no copy engine.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct InlineCopy {
    pub dev: u64,
    pub stream: u32,
    pub len: u32,
}

/// Largest inline copy: each 4 bytes cost the server a driver call (about 1.3 us).
pub const INLINE_COPY_MAX: usize = 8;

/// `host` lies in one of the client's pinned allocations, mapped at the same address in
/// the client and the server.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct PinnedCopy {
    pub dev: u64,
    pub host: u64,
    pub len: u64,
    pub stream: u32,
    pub _pad: u32,
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

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct MemFree {
    pub ptr: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct MemAlloc {
    pub call: CallHdr,
    pub size: u64,
}

/// Loads the image uploaded into this channel's blob with BlobAppend records.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ModuleLoad {
    pub call: CallHdr,
    pub blob_len: u64,
}

/// Followed by `name_len` bytes of symbol name (no NUL).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ModuleGetGlobal {
    pub call: CallHdr,
    pub module: u32,
    pub name_len: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct FuncGetAttribute {
    pub call: CallHdr,
    pub func: u32,
    pub attr: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct FuncSetAttribute {
    pub call: CallHdr,
    pub func: u32,
    pub attr: i32,
    pub value: i32,
    pub _pad: u32,
}

/// Followed, for the cluster queries, by `num_attrs` launch attributes. The answer is a
/// [`U64Reply`] holding an i64.
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

/// A virtual memory call; the answer is a [`U64Reply`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Vmm {
    pub call: CallHdr,
    pub kind: u32,
    /// A physical allocation handle id the server gave out, for CREATE's followers.
    pub handle: u32,
    pub args: [u64; 3],
}

/// [`Vmm::kind`] values and their `args`.
pub mod vmm {
    /// (size, alignment, address hint) -> address of a new reservation.
    pub const RESERVE: u32 = 1;
    /// (address, size) of a whole reservation with nothing mapped in it.
    pub const ADDRESS_FREE: u32 = 2;
    /// (size, CUmemAllocationCompType: 0 none, 1 generic) -> [handle id, granted
    /// compression type] (two u64) of new physical memory on this GPU.
    pub const CREATE: u32 = 3;
    /// handle.
    pub const RELEASE: u32 = 4;
    /// (address, size, offset into the handle's memory) for handle.
    pub const MAP: u32 = 5;
    /// (address, size) of a whole mapping.
    pub const UNMAP: u32 = 6;
    /// (address, size) inside mappings: read-write access from this GPU.
    pub const SET_ACCESS: u32 = 7;
    /// (recommended?, compression type) -> the allocation granularity in bytes.
    pub const GRANULARITY: u32 = 8;
    /// handle -> a 16-byte token another client of this server can import it by.
    pub const EXPORT: u32 = 9;
    /// (token as two words) -> [handle id, size, compression type] (three u64) of another
    /// client's exported physical memory, now this client's too.
    pub const IMPORT: u32 = 10;
    /// Memory pools shared between clients (cuMemPoolExportToShareableHandle and the rest):
    /// a pool is the client's number for it in `handle`, an imported pool the key the
    /// server answered. Pool `handle` -> [token (16 bytes), key] of the client's pool.
    pub const POOL_EXPORT: u32 = 11;
    /// (token as two words) -> key of another client's exported pool, now imported.
    pub const POOL_IMPORT: u32 = 12;
    /// (key): the client is done with a pool it exported or imported.
    pub const POOL_RELEASE: u32 = 13;
    /// (pointer) of pool `handle`: [token (16 bytes), size] naming the allocation that
    /// starts there, which an importer of the pool may open.
    pub const POOL_EXPORT_PTR: u32 = 14;
    /// (key of an imported pool, token as two words) -> [pointer, size] of the exporter's
    /// allocation, opened as an IPC handle is (closed by IpcCloseMemHandle).
    pub const POOL_IMPORT_PTR: u32 = 15;
}

/// cuTensorMapEncode{Tiled,Im2col,Im2colWide} and cuTensorMapReplaceAddress, their
/// arguments flattened; ReplaceAddress is followed by the 128-byte descriptor it edits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct TensorMap {
    pub call: CallHdr,
    pub kind: u32,
    pub dtype: u32,
    pub rank: u32,
    pub interleave: u32,
    pub swizzle: u32,
    pub l2_promotion: u32,
    pub oob_fill: u32,
    pub wide_mode: u32,
    pub channels_per_pixel: u32,
    pub pixels_per_column: u32,
    pub lower_w: i32,
    pub upper_w: i32,
    pub global_address: u64,
    pub global_dim: [u64; 5],
    pub global_strides: [u64; 4],
    pub box_dim: [u32; 5],
    pub element_strides: [u32; 5],
    pub lower: [i32; 3],
    pub upper: [i32; 3],
}

/// The answer to [`Op::Link`]: the linked image, then the info log, then the error log,
/// fetched with BlobFetch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct LinkReply {
    pub image_len: u64,
    pub info_len: u64,
    pub error_len: u64,
}

/// The container a JIT link uploads: a [`link::Header`], `num_options` [`link::Opt`],
/// then per input a [`link::Input`] followed by its name and data bytes.
pub mod link {
    use bytemuck::{Pod, Zeroable};

    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
    pub struct Header {
        pub num_options: u32,
        pub num_inputs: u32,
    }

    /// A CUjit_option that carries a value (never a pointer) and its value.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
    pub struct Opt {
        pub option: u32,
        pub _pad: u32,
        pub value: u64,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
    pub struct Input {
        /// CUjitInputType.
        pub kind: u32,
        pub name_len: u32,
        pub data_len: u64,
    }

    /// A container of value `options` and (kind, name, bytes) `inputs`, as the shim sends
    /// it and the server reads it.
    pub fn encode<'a>(
        options: &[Opt],
        inputs: impl IntoIterator<Item = (u32, &'a str, &'a [u8])>,
    ) -> Vec<u8> {
        let inputs: Vec<_> = inputs.into_iter().collect();
        let mut v = bytemuck::bytes_of(&Header {
            num_options: options.len() as u32,
            num_inputs: inputs.len() as u32,
        })
        .to_vec();
        for o in options {
            v.extend_from_slice(bytemuck::bytes_of(o));
        }
        for (kind, name, data) in inputs {
            let i = Input {
                kind,
                name_len: name.len() as u32,
                data_len: data.len() as u64,
            };
            v.extend_from_slice(bytemuck::bytes_of(&i));
            v.extend_from_slice(name.as_bytes());
            v.extend_from_slice(data);
        }
        v
    }

    /// Options that take a plain value: max registers, threads per block, optimization
    /// level, target from context, target, fallback, debug info, verbose log, line info,
    /// cache mode, position independent code, min CTAs, max threads, override directives.
    pub fn value_option(o: u32) -> bool {
        matches!(o, 0 | 1 | 7..=14 | 30..=33)
    }
}

/// [`TensorMap::kind`] values.
pub mod tensor_map {
    pub const TILED: u32 = 1;
    pub const IM2COL: u32 = 2;
    pub const IM2COL_WIDE: u32 = 3;
    pub const REPLACE_ADDRESS: u32 = 4;
    /// Bytes of a CUtensorMap.
    pub const BYTES: usize = 128;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct EventElapsed {
    pub call: CallHdr,
    pub start: u32,
    pub end: u32,
}

// ---- replies (in the channel's reply area) ----

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct U64Reply {
    pub value: u64,
}

/// CUDA graphs. A graph a client captures holds only that client's work: capture runs in
/// the server on the client stream's own work stream. Graph and executable-graph ids are
/// the server's, per client.
/// A CUDA array call: [`ArrayCall::kind`] says what, `id` names an array or mipmapped
/// array of the caller's, `args` carry the rest.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ArrayCall {
    pub call: CallHdr,
    pub kind: u32,
    pub id: u32,
    pub args: [u64; 7],
}

/// [`ArrayCall::kind`] values and their `args`.
pub mod array {
    /// (width, height, depth, format, channels, flags) -> array id ([`super::U64Reply`]).
    pub const CREATE: u32 = 1;
    /// (width, height, depth, format, channels, flags, levels) -> mipmapped array id.
    pub const CREATE_MIPMAPPED: u32 = 2;
    /// Level (args[0]) of mipmapped array `id` -> an array id, owned by the mipmapped array.
    pub const LEVEL: u32 = 3;
    /// Destroys array `id` (after the client's queued work).
    pub const DESTROY: u32 = 4;
    pub const DESTROY_MIPMAPPED: u32 = 5;

    /// Bytes per channel of the CUarray_format values whose size omps knows (None for
    /// the others, which the driver checks): the shim checks copies and the server charges
    /// memory by it.
    pub fn format_bytes(format: u32) -> Option<u64> {
        match format {
            0x01 | 0x08 => Some(1),        // unsigned, signed int 8
            0x02 | 0x09 | 0x10 => Some(2), // int 16, half
            0x03 | 0x0a | 0x20 => Some(4), // int 32, float
            _ => None,
        }
    }
}

/// One side of an [`ArrayCopy`]: an array of the client's (`array` non-zero: its id, x in
/// bytes) or device memory at `dev` with a pitch and a height.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct CopySide {
    pub array: u32,
    pub _pad: u32,
    pub x: u64,
    pub y: u64,
    pub z: u64,
    pub dev: u64,
    pub pitch: u64,
    pub height: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ArrayCopy {
    pub stream: u32,
    pub _pad: u32,
    pub src: CopySide,
    pub dst: CopySide,
    /// Bytes per row, rows, slices.
    pub width: u64,
    pub height: u64,
    pub depth: u64,
}

/// A texture or surface object call. Create: the resource (an array or mipmapped array
/// of the caller's by id, or its device memory), and for textures the texture and view
/// descriptors as cuda.h lays them out; the object's value as a [`U64Reply`]. Destroy:
/// `object`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct TexCall {
    pub call: CallHdr,
    pub kind: u32,
    /// CUresourcetype: array, mipmapped array, linear, pitch 2D.
    pub res_type: u32,
    pub array: u32,
    pub format: u32,
    pub channels: u32,
    pub has_view: u32,
    pub dev: u64,
    pub size: u64,
    pub width: u64,
    pub height: u64,
    pub pitch: u64,
    pub object: u64,
    /// CUDA_TEXTURE_DESC (104 bytes).
    pub tex: [u32; 26],
    /// CUDA_RESOURCE_VIEW_DESC (112 bytes).
    pub view: [u32; 28],
}

/// [`TexCall::kind`] values.
pub mod tex {
    pub const CREATE_TEXTURE: u32 = 1;
    pub const CREATE_SURFACE: u32 = 2;
    pub const DESTROY_TEXTURE: u32 = 3;
    pub const DESTROY_SURFACE: u32 = 4;
}

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

/// CUipcMemHandle's 64 bytes as omps fills them: a magic, an unguessable token naming
/// the allocation in the server, its size, and the server's PID.
pub mod ipc {
    pub const MAGIC: [u8; 8] = *b"omps-ipc";
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct IpcHandle {
    pub bytes: [u8; 64],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct IpcCall {
    pub call: CallHdr,
    pub ptr: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct IpcOpen {
    pub call: CallHdr,
    pub handle: IpcHandle,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct IpcOpenEvent {
    pub call: CallHdr,
    pub id: u32,
    pub _pad: u32,
    pub handle: IpcHandle,
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

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct GraphLaunch {
    pub exec: u32,
    pub stream: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct MemInfoReply {
    pub free: u64,
    pub total: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct GlobalReply {
    pub ptr: u64,
    pub size: u64,
}

/// ModuleLoad's answer, written at the start of chunk 0 of the channel: this header,
/// then `num_functions` [`FunctionDesc`], then the parameter table, then the names.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ModuleReply {
    pub module: u32,
    pub num_functions: u32,
    pub total_len: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct FunctionDesc {
    pub func: u32,
    pub max_threads_per_block: i32,
    pub static_shared: i32,
    pub max_dynamic_shared: i32,
    /// Byte offset of this function's name within the reply, and its length.
    pub name_offset: u32,
    pub name_len: u32,
    /// Index of its first parameter in the parameter table, and how many it has.
    pub first_param: u32,
    pub num_params: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ParamDesc {
    pub offset: u32,
    pub size: u32,
}

// ---- socket handshake ----

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

pub mod kind {
    pub const CLIENT: u32 = 0;
    pub const CONTROL: u32 = 1;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Hello {
    pub magic: u64,
    pub version: u32,
    pub kind: u32,
}

/// What a client's environment asks of the server, sent right after a client Hello.
/// Each field is [`ClientSettings::UNSET`] when the client did not say.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ClientSettings {
    /// 0 normal, 1 below normal (CUDA_MPS_CLIENT_PRIORITY), 2 latency-critical
    /// (OMPS_CLIENT_QOS).
    pub qos: u32,
    /// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, in thousandths of a percent (1..=100000).
    pub thread_milli_pct: u32,
    /// CUDA_MPS_SM_PARTITION, NUL-padded text.
    pub partition: [u8; 64],
    /// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT as the client gave it (checked by
    /// [`crate::memlimit::parse_limits`]), NUL-padded: the server resolves its devices.
    pub mem_limit: [u8; 512],
    /// The client's PID as it sees it (in its own PID namespace; the server learns the
    /// one in its namespace from the socket). 0: not said.
    pub ns_pid: u32,
    /// The devices it may see (CUDA_VISIBLE_DEVICES, else a container's
    /// NVIDIA_VISIBLE_DEVICES), NUL-padded; `all` or nothing: every device.
    pub visible: [u8; 256],
}

impl ClientSettings {
    pub const UNSET: u32 = u32::MAX;

    pub fn none() -> Self {
        ClientSettings {
            qos: Self::UNSET,
            thread_milli_pct: Self::UNSET,
            partition: [0; 64],
            mem_limit: [0; 512],
            ns_pid: 0,
            visible: [0; 256],
        }
    }

    /// The partition text, if any and valid UTF-8.
    pub fn partition_text(&self) -> Option<&str> {
        padded_text(&self.partition)
    }

    /// The devices it may see, if it said (`all` and nothing read as unsaid; the shim
    /// sends an empty list as `void`).
    pub fn visible_text(&self) -> Option<&str> {
        let t = std::str::from_utf8(
            &self.visible[..self
                .visible
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(self.visible.len())],
        )
        .ok()?;
        (!t.is_empty() && t != "all").then_some(t)
    }

    /// The memory limit list, if any and valid UTF-8.
    pub fn mem_limit_text(&self) -> Option<&str> {
        padded_text(&self.mem_limit)
    }
}

fn padded_text(b: &[u8]) -> Option<&str> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end])
        .ok()
        .filter(|s| !s.is_empty())
}

/// A thread percentage as MPS takes it ("25", "12.5"), in thousandths of a percent,
/// within (0, 100].
pub fn parse_percentage(v: &str) -> Option<u32> {
    let p: f64 = v.trim().parse().ok()?;
    (p > 0.0 && p <= 100.0 && p.is_finite()).then(|| ((p * 1000.0).round() as u32).max(1))
}

/// The server's answer to a client Hello; with status 0 it carries, as SCM_RIGHTS, the
/// segment memfd followed by one doorbell memfd per GPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Welcome {
    pub magic: u64,
    pub version: u32,
    /// CUresult: 0, or why the client is refused.
    pub status: i32,
    pub client_id: u32,
    pub num_devices: u32,
    pub layout: crate::segment::LayoutParams,
    pub segment_len: u64,
    /// The most streams and events the client may hold per GPU: the shim answers
    /// CUDA_ERROR_OUT_OF_MEMORY beyond, and the server disconnects a client that goes on.
    pub max_streams: u32,
    pub max_events: u32,
}

/// A request on the client's socket after the handshake. Pinned host memory: `PIN`
/// carries a memfd (SCM_RIGHTS) that the server maps at `addr` and registers; `UNPIN`
/// releases `addr` once the client's queued work is done. Device printf: `PRINTF_USE`
/// says the client loaded code that may call printf (`len`: a [`printf_use`] level);
/// `PRINTF_FLUSH` asks for the printf output of GPU `addr` so far, which follows the reply.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HostMemRequest {
    pub kind: u32,
    pub _pad: u32,
    pub addr: u64,
    pub len: u64,
}

pub mod hostmem {
    pub const PIN: u32 = 1;
    pub const UNPIN: u32 = 2;
    pub const PRINTF_USE: u32 = 3;
    pub const PRINTF_FLUSH: u32 = 4;
}

/// How sure the shim is that a client's code calls device printf, weakest first.
pub mod printf_use {
    pub const NONE: u64 = 0;
    /// The code references `__assertfail` only: text comes with a failed kernel.
    pub const ASSERT: u64 = 1;
    /// Its images hold code the shim cannot look into; treated as ASSERT.
    pub const MAYBE: u64 = 2;
    /// The code the GPU runs references `vprintf`.
    pub const YES: u64 = 3;
}

/// The answer: a CUresult, and how many bytes of text follow it on the socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct HostMemReply {
    pub status: i32,
    pub text_len: u32,
}

/// Most text one `PRINTF_FLUSH` reply carries; the rest waits for the next flush.
pub const PRINTF_REPLY_MAX: usize = 4 << 20;

/// The text of a PRINTF_FLUSH answer: the length of the printf text (u32), the printf
/// text (for the client's fd 1), then the assert messages (for its fd 2).
pub fn printf_reply(out: &[u8], err: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + out.len() + err.len());
    v.extend_from_slice(&(out.len() as u32).to_le_bytes());
    v.extend_from_slice(out);
    v.extend_from_slice(err);
    v
}

/// Splits a PRINTF_FLUSH answer into (printf text, assert messages); None if malformed.
pub fn split_printf_reply(text: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = u32::from_le_bytes(text.get(..4)?.try_into().ok()?) as usize;
    let rest = &text[4..];
    (n <= rest.len()).then(|| rest.split_at(n))
}

/// Size of the per-GPU doorbell page shared by all clients of that GPU.
pub const DOORBELL_PAGE: usize = 4096;

/// Appends a Pod value's bytes.
pub fn put<T: Pod>(out: &mut Vec<u8>, v: &T) {
    out.extend_from_slice(bytemuck::bytes_of(v));
}

/// Reads a Pod value from the front of `bytes`, tolerating any alignment.
pub fn get<T: Pod>(bytes: &[u8]) -> Option<T> {
    bytes
        .get(..core::mem::size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printf_reply_splits_into_its_two_streams() {
        let r = printf_reply(b"printed\n", b"assert\n");
        assert_eq!(
            split_printf_reply(&r),
            Some((&b"printed\n"[..], &b"assert\n"[..]))
        );
        assert_eq!(split_printf_reply(&r[..3]), None);
        let mut lie = r.clone();
        lie[0] = 200;
        assert_eq!(split_printf_reply(&lie), None);
    }

    #[test]
    fn every_op_round_trips_through_its_tag() {
        for tag in 0..64 {
            if let Some(op) = Op::from_tag(tag) {
                assert_eq!(op as u32, tag);
                assert!(op.fixed_len() >= 8, "{op:?}");
                assert_eq!(op.fixed_len() % 8, 0, "{op:?} not 8-byte sized");
            }
        }
        assert_eq!(Op::from_tag(0), None);
        assert_eq!(Op::from_tag(u32::MAX), None);
    }

    #[test]
    fn get_rejects_short_input() {
        assert_eq!(get::<Launch>(&[0u8; 10]), None);
        let l = Launch {
            func: 7,
            args_len: 3,
            ..Default::default()
        };
        let mut v = vec![1u8];
        put(&mut v, &l);
        assert_eq!(get::<Launch>(&v[1..]), Some(l));
    }
}
