//! Copies between linear memory of any kinds, as unified addressing tells them apart:
//! cuMemcpy's dispatch (copy_any) and 2D/3D copies of linear memory, below the families
//! that use them (hostmem's entry points, arrays' host legs, mem's direction-named copies).

use super::staged::{copy_dtoh, copy_htod};
use crate::cuda::*;
use crate::state::copies::copy_dtod;
use crate::state::ranges::range_info;
use crate::state::streams::CUstream;
use std::ffi::{c_uint, c_void};

pub(crate) const MEMORYTYPE_HOST: c_uint = 1;
pub(crate) const MEMORYTYPE_DEVICE: c_uint = 2;
pub(crate) const MEMORYTYPE_UNIFIED: c_uint = 4;

/// CUDA_MEMCPY3D as cuda.h lays it out; CUDA_MEMCPY2D is read into the same shape.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memcpy3D {
    pub src_x: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub reserved0: *mut c_void,
    pub src_pitch: usize,
    pub src_height: usize,
    pub dst_x: usize,
    pub dst_y: usize,
    pub dst_z: usize,
    pub dst_lod: usize,
    pub dst_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub reserved1: *mut c_void,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// With unified addressing a pointer says what it is: the client's device ranges, or host.
fn is_device(p: u64) -> bool {
    range_info(p).is_some()
}

pub(crate) fn copy_any(
    dst: u64,
    src: u64,
    len: usize,
    s: CUstream,
    sync: bool,
) -> Result<(), CUresult> {
    match (is_device(dst), is_device(src)) {
        (true, true) => {
            copy_dtod(dst, src, len, s)?;
            if sync {
                // Managed memory the CPU touches next: done before the return.
                crate::state::copies::finish_if_host(dst, src)?;
            }
            Ok(())
        }
        (true, false) => copy_htod(dst, src as *const u8, len, s, sync),
        (false, true) => copy_dtoh(dst as *mut u8, src, len, s, sync),
        (false, false) => {
            if !sync && len > 0 {
                if let Some(id) = super::staged::capturing(s)? {
                    // In a capture: a host node copying on every replay.
                    return super::staged::capture_copy(
                        None,
                        0,
                        dst as usize,
                        src as usize,
                        len,
                        s,
                        id,
                    );
                }
            }
            if len > 0 && !sync {
                // In stream order: what the stream's earlier work writes to either buffer
                // (page-locked memory kernels reach) lands before the bytes move.
                crate::state::streams::stream_sync(s)?;
            }
            if len > 0 {
                // SAFETY: both are host memory of len bytes, per cuMemcpy's contract.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
            }
            Ok(())
        }
    }
}

fn base(kind: c_uint, host: usize, dev: u64) -> Result<u64, CUresult> {
    match kind {
        MEMORYTYPE_HOST => Ok(host as u64),
        MEMORYTYPE_DEVICE | MEMORYTYPE_UNIFIED => Ok(dev),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// A pitched copy as rows of plain copies; one copy when both sides are contiguous. A
/// copy with an array goes to api/array.rs.
/// A 2D or 3D copy between linear memory of any kinds (no array on either side).
pub(crate) fn copy_linear_3d(c: &Memcpy3D, s: CUstream, sync: bool) -> Result<(), CUresult> {
    if c.src_lod != 0 || c.dst_lod != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let src = base(c.src_type, c.src_host as usize, c.src_device)?;
    let dst = base(c.dst_type, c.dst_host as usize, c.dst_device)?;
    let (sp, dp) = (c.src_pitch.max(c.width), c.dst_pitch.max(c.width));
    let (sh, dh) = (c.src_height.max(c.height), c.dst_height.max(c.height));
    let depth = c.depth.max(1);
    let at = |b: u64, x: usize, y: usize, z: usize, pitch: usize, h: usize| {
        b + (x + (y + z * h) * pitch) as u64
    };
    if c.width == sp
        && c.width == dp
        && c.src_x == 0
        && c.dst_x == 0
        && sh == c.height
        && dh == c.height
    {
        let n = c.width * c.height * depth;
        return copy_any(
            at(dst, 0, c.dst_y, c.dst_z, dp, dh),
            at(src, 0, c.src_y, c.src_z, sp, sh),
            n,
            s,
            sync,
        );
    }
    for z in 0..depth {
        for y in 0..c.height {
            copy_any(
                at(dst, c.dst_x, c.dst_y + y, c.dst_z + z, dp, dh),
                at(src, c.src_x, c.src_y + y, c.src_z + z, sp, sh),
                c.width,
                s,
                sync,
            )?;
        }
    }
    Ok(())
}
