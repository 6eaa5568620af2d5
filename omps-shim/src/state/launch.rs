//! A launch's configuration as cuLaunchKernelEx takes it, read for launches, graph
//! kernel nodes and occupancy questions alike.

use crate::cuda::*;
use crate::state::streams::CUstream;
use omps_ring::wire;
use std::ffi::c_uint;

/// CUlaunchConfig, as cuda.h lays it out.
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem: c_uint,
    pub stream: CUstream,
    pub attrs: *const u8,
    pub num_attrs: c_uint,
}

/// A launch configuration and its attributes as wire bytes, checked: attributes that
/// carry handles (events, graph nodes) are refused with CUDA_ERROR_NOT_SUPPORTED.
///
/// # Safety
/// `config` is null or a valid CUlaunchConfig whose attrs hold num_attrs records.
pub(crate) unsafe fn config_parts<'a>(
    config: *const LaunchConfig,
) -> Result<(&'a LaunchConfig, &'a [u8]), CUresult> {
    if config.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's config, non-null.
    let c = unsafe { &*config };
    if c.num_attrs > wire::MAX_LAUNCH_ATTRS || (c.num_attrs > 0 && c.attrs.is_null()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let attrs: &[u8] = if c.num_attrs == 0 {
        &[]
    } else {
        // SAFETY: attrs holds num_attrs CUlaunchAttribute records.
        unsafe {
            std::slice::from_raw_parts(c.attrs, c.num_attrs as usize * wire::LAUNCH_ATTR_BYTES)
        }
    };
    let forwardable = |a: &[u8]| {
        wire::launch_attr_forwardable(u32::from_le_bytes(a[..4].try_into().expect("4 bytes")))
    };
    if !attrs.chunks_exact(wire::LAUNCH_ATTR_BYTES).all(forwardable) {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok((c, attrs))
}
