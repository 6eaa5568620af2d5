//! TMA descriptors (cuTensorMapEncode*, cuTensorMapReplaceAddress). The 128 bytes are
//! the driver's own: the server encodes them with the real driver and the shim copies
//! them out, so a kernel receives exactly what it would natively.

use crate::cuda::*;
use crate::state::ctx::current_dev;
use crate::state::entry::{entry, live};
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

/// The arguments every encoding shares: the tensor's type, shape and memory behaviour.
struct Tensor {
    dtype: u32,
    rank: u32,
    addr: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    element_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2: u32,
    oob: u32,
}

impl Tensor {
    /// The record with the shared fields filled; `min_rank` is the encoding's smallest.
    ///
    /// # Safety
    /// The arrays hold `rank` (strides `rank - 1`) entries, as the API requires.
    unsafe fn record(
        &self,
        kind: u32,
        min_rank: u32,
    ) -> Result<(wire::TensorMap, usize), CUresult> {
        if !(min_rank..=5).contains(&self.rank) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let n = self.rank as usize;
        // SAFETY: the caller's arrays, of the lengths the rank gives.
        let t = unsafe {
            wire::TensorMap {
                kind,
                dtype: self.dtype,
                rank: self.rank,
                interleave: self.interleave,
                swizzle: self.swizzle,
                l2_promotion: self.l2,
                oob_fill: self.oob,
                global_address: self.addr as u64,
                global_dim: array(self.dims, n)?,
                global_strides: array(self.strides, n - 1)?,
                element_strides: array(self.element_strides, n)?,
                ..Default::default()
            }
        };
        Ok((t, n))
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
    let tensor = Tensor {
        dtype,
        rank,
        addr,
        dims,
        strides,
        element_strides,
        interleave,
        swizzle,
        l2,
        oob,
    };
    entry(|| {
        // SAFETY: the caller's arrays, of the lengths the rank gives.
        let (t, n) = unsafe { tensor.record(k::TILED, 1)? };
        // SAFETY: as above.
        let box_dim = unsafe { array(box_dim, n)? };
        encode(out, wire::TensorMap { box_dim, ..t }, None)
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
    let tensor = Tensor {
        dtype,
        rank,
        addr,
        dims,
        strides,
        element_strides,
        interleave,
        swizzle,
        l2,
        oob,
    };
    entry(|| {
        // SAFETY: the caller's arrays, of the lengths the rank gives.
        let (t, n) = unsafe { tensor.record(k::IM2COL, 3)? };
        // SAFETY: as above: the corners have rank - 2 entries.
        let (lower, upper) = unsafe { (array(lower, n - 2)?, array(upper, n - 2)?) };
        let t = wire::TensorMap {
            channels_per_pixel: channels,
            pixels_per_column: pixels,
            lower,
            upper,
            ..t
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
    let tensor = Tensor {
        dtype,
        rank,
        addr,
        dims,
        strides,
        element_strides,
        interleave,
        swizzle,
        l2,
        oob,
    };
    entry(|| {
        // SAFETY: the caller's arrays, of the lengths the rank gives.
        let (t, _) = unsafe { tensor.record(k::IM2COL_WIDE, 3)? };
        let t = wire::TensorMap {
            wide_mode: mode,
            channels_per_pixel: channels,
            pixels_per_column: pixels,
            lower_w,
            upper_w,
            ..t
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
