//! The host GPU's arrays, mipmaps, texture and surface objects, kept as byte vectors.

use super::state::{HostGpu, State};
use crate::gpu::{code, ArrayShape, CopyPlace, CuError, Gpu, GpuResult, Resource};

/// Bytes per row of an array of `s`: unknown formats count 4 bytes a channel.
pub(super) fn row_bytes(s: &ArrayShape) -> u64 {
    s.width
        .saturating_mul(s.channels as u64 * crate::gpu::format_bytes(s.format).unwrap_or(4))
}

pub(super) fn array_bytes(s: &ArrayShape) -> u64 {
    crate::gpu::shape_bytes(s, 0)
}

pub(super) fn array_create(gpu: &HostGpu, shape: &ArrayShape) -> GpuResult<(u64, u64)> {
    // The driver's checks the model needs: a known format, 1, 2 or 4 channels.
    if crate::gpu::format_bytes(shape.format).is_none()
        || !matches!(shape.channels, 1 | 2 | 4)
        || shape.width == 0
        || array_bytes(shape) > 1 << 32
    {
        return Err(CuError(code::INVALID_VALUE));
    }
    let mut st = gpu.state.lock().unwrap();
    let h = st.next_handle;
    st.next_handle += 1;
    let n = array_bytes(shape);
    st.arrays.insert(h, (*shape, vec![0; n as usize]));
    Ok((h, n))
}

pub(super) fn mipmap_create(
    gpu: &HostGpu,
    shape: &ArrayShape,
    levels: u32,
) -> GpuResult<(u64, u64)> {
    if levels == 0 || levels > 16 {
        return Err(CuError(code::INVALID_VALUE));
    }
    let mut arrays = Vec::new();
    let mut total = 0;
    for l in 0..levels {
        let half = |v: u64| if v == 0 { 0 } else { (v >> l).max(1) };
        let s = ArrayShape {
            width: half(shape.width),
            height: half(shape.height),
            depth: half(shape.depth),
            ..*shape
        };
        let (a, n) = gpu.array_create(&s)?;
        arrays.push(a);
        total += n;
    }
    let mut st = gpu.state.lock().unwrap();
    let h = st.next_handle;
    st.next_handle += 1;
    st.mipmaps.insert(h, arrays);
    Ok((h, total))
}

pub(super) fn mipmap_level(gpu: &HostGpu, mip: u64, level: u32) -> GpuResult<u64> {
    let st = gpu.state.lock().unwrap();
    st.mipmaps
        .get(&mip)
        .and_then(|v| v.get(level as usize).copied())
        .ok_or(CuError(code::INVALID_VALUE))
}

pub(super) fn array_destroy(gpu: &HostGpu, array: u64) -> GpuResult<()> {
    let mut st = gpu.state.lock().unwrap();
    st.arrays
        .remove(&array)
        .map(drop)
        .ok_or(CuError(code::INVALID_HANDLE))
}

pub(super) fn mipmap_destroy(gpu: &HostGpu, mip: u64) -> GpuResult<()> {
    let mut st = gpu.state.lock().unwrap();
    let levels = st
        .mipmaps
        .remove(&mip)
        .ok_or(CuError(code::INVALID_HANDLE))?;
    for a in levels {
        st.arrays.remove(&a);
    }
    Ok(())
}

pub(super) fn array_copy(
    gpu: &HostGpu,
    src: &CopyPlace,
    dst: &CopyPlace,
    extent: [u64; 3],
    _s: usize,
) -> GpuResult<()> {
    let mut st = gpu.state.lock().unwrap();
    st.check()?;
    let [w, h, d] = [extent[0], extent[1].max(1), extent[2].max(1)];
    // Where row (y, z) of a side starts, checked to hold `w` bytes.
    let start = |st: &State, p: &CopyPlace, y: u64, z: u64| -> GpuResult<(Option<u64>, u64)> {
        match p.array {
            Some(a) => {
                let (s, buf) = st.arrays.get(&a).ok_or(CuError(code::INVALID_HANDLE))?;
                let rb = row_bytes(s);
                let (yy, zz) = (p.y.saturating_add(y), p.z.saturating_add(z));
                if p.x.saturating_add(w) > rb || yy >= s.height.max(1) || zz >= s.depth.max(1) {
                    return Err(CuError(code::INVALID_VALUE));
                }
                let off = p.x + (yy + zz * s.height.max(1)) * rb;
                debug_assert!(off + w <= buf.len() as u64);
                Ok((Some(a), off))
            }
            None => Ok((
                None,
                // The session checked the device side lies in the client's memory.
                p.dev + p.x + (p.y + y + (p.z + z) * p.height) * p.pitch,
            )),
        }
    };
    for z in 0..d {
        for y in 0..h {
            let (sa, so) = start(&st, src, y, z)?;
            let (da, doff) = start(&st, dst, y, z)?;
            let row = match sa {
                Some(a) => st.arrays[&a].1[so as usize..(so + w) as usize].to_vec(),
                None => st.range(so, w as usize)?.to_vec(),
            };
            match da {
                Some(a) => st.arrays.get_mut(&a).expect("checked").1
                    [doff as usize..(doff + w) as usize]
                    .copy_from_slice(&row),
                None => st.range(doff, w as usize)?.copy_from_slice(&row),
            }
        }
    }
    Ok(())
}

pub(super) fn tex_create(
    gpu: &HostGpu,
    res: &Resource,
    _tex: &[u32; 26],
    _view: Option<&[u32; 28]>,
) -> GpuResult<u64> {
    let mut st = gpu.state.lock().unwrap();
    let known = match *res {
        Resource::Array(a) => st.arrays.contains_key(&a),
        Resource::Mipmapped(m) => st.mipmaps.contains_key(&m),
        Resource::Linear { dev, size, .. } => st.range(dev, size as usize).is_ok(),
        Resource::Pitch2D {
            dev, pitch, height, ..
        } => st.range(dev, pitch.saturating_mul(height) as usize).is_ok(),
    };
    if !known {
        return Err(CuError(code::INVALID_VALUE));
    }
    let h = st.next_handle;
    st.next_handle += 1;
    st.textures.insert(h, *res);
    Ok(h)
}

pub(super) fn tex_destroy(gpu: &HostGpu, tex: u64) -> GpuResult<()> {
    let mut st = gpu.state.lock().unwrap();
    st.textures
        .remove(&tex)
        .map(drop)
        .ok_or(CuError(code::INVALID_VALUE))
}

pub(super) fn surf_create(gpu: &HostGpu, array: u64) -> GpuResult<u64> {
    let mut st = gpu.state.lock().unwrap();
    if !st.arrays.contains_key(&array) {
        return Err(CuError(code::INVALID_VALUE));
    }
    let h = st.next_handle;
    st.next_handle += 1;
    st.surfaces.insert(h, array);
    Ok(h)
}

pub(super) fn surf_destroy(gpu: &HostGpu, surf: u64) -> GpuResult<()> {
    let mut st = gpu.state.lock().unwrap();
    st.surfaces
        .remove(&surf)
        .map(drop)
        .ok_or(CuError(code::INVALID_VALUE))
}
