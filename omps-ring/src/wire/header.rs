//! What every record and answer shares: where an answer goes ([`CallHdr`]), a handle
//! argument, the one-number answer, and the helpers that put and get plain-old-data
//! values. The bottom of the wire format: the op families use it, it uses none of them.

use bytemuck::{Pod, Zeroable};

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

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct U64Reply {
    pub value: u64,
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
