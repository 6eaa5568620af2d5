//! Records for CUDA arrays, copies to and from them, and texture and surface objects.

use bytemuck::{Pod, Zeroable};

use super::header::CallHdr;

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
    /// (width, height, depth, format, channels, flags) -> array id ([`U64Reply`](crate::wire::U64Reply)).
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
/// descriptors as cuda.h lays them out; the object's value as a [`U64Reply`](crate::wire::U64Reply). Destroy:
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
