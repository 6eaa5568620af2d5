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
//!
//! This file holds the op table; the records live beside it by family (exec, memory,
//! module, arrays, graphs), over `header` (what all records share), and `handshake` holds
//! the socket's side. Everything is re-exported here, so users name `wire::X` alone.

mod arrays;
mod exec;
mod graphs;
mod handshake;
mod header;
mod memory;
mod module;

pub use arrays::*;
pub use exec::*;
pub use graphs::*;
pub use handshake::*;
pub use header::*;
pub use memory::*;
pub use module::*;

pub const PROTOCOL_VERSION: u32 = 12;
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
    /// Followed by event id pairs: see [`EventTimes`].
    EventTimes = 65 => EventTimes,
    GraphProfileInfo = 66 => GraphProfileInfo,
    /// Followed by event ids: see [`GraphLaunchProfiled`].
    GraphLaunchProfiled = 67 => GraphLaunchProfiled,
    Profiling = 68 => Profiling,
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
        for tag in 0..256 {
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
