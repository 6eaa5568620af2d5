//! Records that load code: module images, globals and function attributes, JIT links
//! ([`link`]) and their answers, and TMA descriptors ([`tensor_map`]).

use bytemuck::{Pod, Zeroable};

use super::header::CallHdr;

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

/// The answer to [`Op::Link`](crate::wire::Op::Link): the linked image, then the info log, then the error log,
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
