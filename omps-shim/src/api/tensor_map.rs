//! TMA descriptors (cuTensorMapEncode*, cuTensorMapReplaceAddress). The 128 bytes are
//! the driver's own: the server encodes them with the real driver and the shim copies
//! them out, so a kernel receives exactly what it would natively.

use super::ctx::current_dev;
use super::{entry, live};
use crate::cuda::*;
use omps_ring::wire::{self, tensor_map as k, Op};
use std::ffi::{c_int, c_void};

/// Copies `n` values from a caller's array (null is allowed when `n` is 0).
///
/// # Safety
/// `p` is null or valid for `n` reads.
unsafe fn array<T: Copy + Default, const N: usize>(
    p: *const T,
    n: usize,
) -> Result<[T; N], CUresult> {
    let mut a = [T::default(); N];
    if n > N || (n > 0 && p.is_null()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for (i, v) in a.iter_mut().enumerate().take(n) {
        // SAFETY: i < n, per the contract.
        *v = unsafe { p.add(i).read() };
    }
    Ok(a)
}

fn encode(out: *mut [u8; 128], t: wire::TensorMap, old: Option<[u8; 128]>) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = current_dev()?;
    let c = live()?;
    let mut ch = c.channel();
    ch.call(dev, Op::TensorMap, |call| {
        let mut v = bytemuck::bytes_of(&wire::TensorMap { call, ..t }).to_vec();
        if let Some(d) = old {
            v.extend_from_slice(&d);
        }
        v
    })?;
    let d = ch.reply::<[u8; 128]>();
    // SAFETY: checked non-null; the caller's 128-byte CUtensorMap.
    unsafe { out.write(d) };
    Ok(())
}

fn rank_ok(rank: u32, min: u32) -> Result<usize, CUresult> {
    if (min..=5).contains(&rank) {
        Ok(rank as usize)
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// # Safety
/// As cuTensorMapEncodeTiled's contract: arrays of `rank` (strides `rank - 1`) entries.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuTensorMapEncodeTiled(
    out: *mut [u8; 128],
    dtype: u32,
    rank: u32,
    addr: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    box_dim: *const u32,
    element_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2: u32,
    oob: u32,
) -> CUresult {
    entry(|| {
        let n = rank_ok(rank, 1)?;
        // SAFETY: the caller's arrays, of the lengths the rank gives.
        let t = unsafe {
            wire::TensorMap {
                kind: k::TILED,
                dtype,
                rank,
                interleave,
                swizzle,
                l2_promotion: l2,
                oob_fill: oob,
                global_address: addr as u64,
                global_dim: array(dims, n)?,
                global_strides: array(strides, n - 1)?,
                box_dim: array(box_dim, n)?,
                element_strides: array(element_strides, n)?,
                ..Default::default()
            }
        };
        encode(out, t, None)
    })
}

/// # Safety
/// As cuTensorMapEncodeIm2col's contract.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuTensorMapEncodeIm2col(
    out: *mut [u8; 128],
    dtype: u32,
    rank: u32,
    addr: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    lower: *const c_int,
    upper: *const c_int,
    channels: u32,
    pixels: u32,
    element_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2: u32,
    oob: u32,
) -> CUresult {
    entry(|| {
        let n = rank_ok(rank, 3)?;
        // SAFETY: the caller's arrays, of the lengths the rank gives.
        let t = unsafe {
            wire::TensorMap {
                kind: k::IM2COL,
                dtype,
                rank,
                interleave,
                swizzle,
                l2_promotion: l2,
                oob_fill: oob,
                channels_per_pixel: channels,
                pixels_per_column: pixels,
                global_address: addr as u64,
                global_dim: array(dims, n)?,
                global_strides: array(strides, n - 1)?,
                element_strides: array(element_strides, n)?,
                lower: array(lower, n - 2)?,
                upper: array(upper, n - 2)?,
                ..Default::default()
            }
        };
        encode(out, t, None)
    })
}

/// # Safety
/// As cuTensorMapEncodeIm2colWide's contract.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuTensorMapEncodeIm2colWide(
    out: *mut [u8; 128],
    dtype: u32,
    rank: u32,
    addr: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    lower_w: c_int,
    upper_w: c_int,
    channels: u32,
    pixels: u32,
    element_strides: *const u32,
    interleave: u32,
    mode: u32,
    swizzle: u32,
    l2: u32,
    oob: u32,
) -> CUresult {
    entry(|| {
        let n = rank_ok(rank, 3)?;
        // SAFETY: the caller's arrays, of the lengths the rank gives.
        let t = unsafe {
            wire::TensorMap {
                kind: k::IM2COL_WIDE,
                dtype,
                rank,
                interleave,
                swizzle,
                l2_promotion: l2,
                oob_fill: oob,
                wide_mode: mode,
                channels_per_pixel: channels,
                pixels_per_column: pixels,
                lower_w,
                upper_w,
                global_address: addr as u64,
                global_dim: array(dims, n)?,
                global_strides: array(strides, n - 1)?,
                element_strides: array(element_strides, n)?,
                ..Default::default()
            }
        };
        encode(out, t, None)
    })
}

/// # Safety
/// `map` is null or a CUtensorMap the driver (here, the server) encoded.
#[no_mangle]
pub unsafe extern "C" fn cuTensorMapReplaceAddress(
    map: *mut [u8; 128],
    addr: *mut c_void,
) -> CUresult {
    entry(|| {
        if map.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-null; the caller's descriptor.
        let old = unsafe { map.read() };
        let t = wire::TensorMap {
            kind: k::REPLACE_ADDRESS,
            rank: 1,
            global_address: addr as u64,
            ..Default::default()
        };
        encode(map, t, Some(old))
    })
}
