//! Records that move or manage memory: memsets and copies (staged, inline, pinned, peer),
//! allocation, virtual memory management ([`vmm`]) and IPC handles ([`ipc`]).

use bytemuck::{Pod, Zeroable};

use super::header::CallHdr;

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
pub struct MemFree {
    pub ptr: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct MemAlloc {
    pub call: CallHdr,
    pub size: u64,
}

/// A virtual memory call; the answer is a [`U64Reply`](crate::wire::U64Reply).
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
pub struct MemInfoReply {
    pub free: u64,
    pub total: u64,
}
