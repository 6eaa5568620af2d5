//! CUDA arrays, texture and surface objects on the real driver: the descriptors as
//! cuda.h lays them out, filled from what the session checked.

use crate::gpu::{ArrayShape, CopyPlace, CuError, GpuResult, Resource};
use cudarc::driver::sys as cu;

fn ck(r: cu::CUresult) -> GpuResult<()> {
    match r {
        cu::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(CuError(e as i32)),
    }
}

/// CUDA_ARRAY3D_DESCRIPTOR.
#[repr(C)]
struct Array3DDesc {
    width: usize,
    height: usize,
    depth: usize,
    format: u32,
    channels: u32,
    flags: u32,
}

/// CUDA_MEMCPY3D: each side's x, y, z, level, memory type, host, device, array, a
/// reserved pointer, pitch and height; then the extent.
#[repr(C)]
#[derive(Default)]
struct Copy3D {
    src: Side,
    dst: Side,
    width: usize,
    height: usize,
    depth: usize,
}

#[repr(C)]
#[derive(Default)]
struct Side {
    x: usize,
    y: usize,
    z: usize,
    lod: usize,
    memory_type: u32,
    host: usize,
    dev: u64,
    array: usize,
    reserved: usize,
    pitch: usize,
    height: usize,
}

/// CUDA_RESOURCE_DESC: the type, a 128-byte union, flags.
#[repr(C)]
struct ResDesc {
    ty: u32,
    res: [u64; 16],
    flags: u32,
}

const _: () = assert!(
    std::mem::size_of::<Array3DDesc>() == std::mem::size_of::<cu::CUDA_ARRAY3D_DESCRIPTOR>()
);
const _: () = assert!(std::mem::size_of::<Copy3D>() == std::mem::size_of::<cu::CUDA_MEMCPY3D>());
const _: () =
    assert!(std::mem::size_of::<ResDesc>() == std::mem::size_of::<cu::CUDA_RESOURCE_DESC>());
const _: () =
    assert!(std::mem::size_of::<[u32; 26]>() == std::mem::size_of::<cu::CUDA_TEXTURE_DESC>());
const _: () =
    assert!(std::mem::size_of::<[u32; 28]>() == std::mem::size_of::<cu::CUDA_RESOURCE_VIEW_DESC>());

fn desc(s: &ArrayShape) -> Array3DDesc {
    Array3DDesc {
        width: s.width as usize,
        height: s.height as usize,
        depth: s.depth as usize,
        format: s.format,
        channels: s.channels,
        flags: s.flags,
    }
}

pub fn array_create(s: &ArrayShape) -> GpuResult<(u64, u64)> {
    let mut a: cu::CUarray = std::ptr::null_mut();
    let d = desc(s);
    // SAFETY: a descriptor laid out as the driver's; valid out-pointer.
    ck(unsafe { cu::cuArray3DCreate_v2(&mut a, &d as *const Array3DDesc as *const _) })?;
    Ok((a as u64, crate::gpu::shape_bytes(s, 0)))
}

pub fn mipmap_create(s: &ArrayShape, levels: u32) -> GpuResult<(u64, u64)> {
    let mut m: cu::CUmipmappedArray = std::ptr::null_mut();
    let d = desc(s);
    // SAFETY: as array_create.
    ck(unsafe {
        cu::cuMipmappedArrayCreate(&mut m, &d as *const Array3DDesc as *const _, levels)
    })?;
    Ok((m as u64, crate::gpu::shape_bytes(s, levels)))
}

pub fn mipmap_level(mip: u64, level: u32) -> GpuResult<u64> {
    let mut a: cu::CUarray = std::ptr::null_mut();
    // SAFETY: one of the client's mipmapped arrays (the session checked); out-pointer.
    ck(unsafe { cu::cuMipmappedArrayGetLevel(&mut a, mip as cu::CUmipmappedArray, level) })?;
    Ok(a as u64)
}

pub fn array_destroy(a: u64) -> GpuResult<()> {
    // SAFETY: an array of a client's, given up by it, its work done.
    ck(unsafe { cu::cuArrayDestroy(a as cu::CUarray) })
}

pub fn mipmap_destroy(m: u64) -> GpuResult<()> {
    // SAFETY: as array_destroy.
    ck(unsafe { cu::cuMipmappedArrayDestroy(m as cu::CUmipmappedArray) })
}

fn side(p: &CopyPlace) -> Side {
    const DEVICE: u32 = 2;
    const ARRAY: u32 = 3;
    let mut s = Side {
        x: p.x as usize,
        y: p.y as usize,
        z: p.z as usize,
        ..Default::default()
    };
    match p.array {
        Some(a) => {
            s.memory_type = ARRAY;
            s.array = a as usize;
        }
        None => {
            s.memory_type = DEVICE;
            s.dev = p.dev;
            s.pitch = p.pitch as usize;
            s.height = p.height as usize;
        }
    }
    s
}

/// `s`: a work stream of the context, as its address.
pub fn array_copy(src: &CopyPlace, dst: &CopyPlace, extent: [u64; 3], s: usize) -> GpuResult<()> {
    let c = Copy3D {
        src: side(src),
        dst: side(dst),
        width: extent[0] as usize,
        height: extent[1] as usize,
        depth: extent[2] as usize,
    };
    // SAFETY: the session checked the arrays are the client's and the device ranges lie
    // in its memory; the driver checks the rest.
    ck(unsafe { cu::cuMemcpy3DAsync_v2(&c as *const Copy3D as *const _, s as cu::CUstream) })
}

fn res_desc(r: &Resource) -> ResDesc {
    let mut d = ResDesc {
        ty: 0,
        res: [0; 16],
        flags: 0,
    };
    let fmt = |format: u32, channels: u32| format as u64 | (channels as u64) << 32;
    match *r {
        Resource::Array(a) => {
            d.ty = 0;
            d.res[0] = a;
        }
        Resource::Mipmapped(m) => {
            d.ty = 1;
            d.res[0] = m;
        }
        Resource::Linear {
            dev,
            format,
            channels,
            size,
        } => {
            d.ty = 2;
            d.res[..3].copy_from_slice(&[dev, fmt(format, channels), size]);
        }
        Resource::Pitch2D {
            dev,
            format,
            channels,
            width,
            height,
            pitch,
        } => {
            d.ty = 3;
            d.res[..5].copy_from_slice(&[dev, fmt(format, channels), width, height, pitch]);
        }
    }
    d
}

pub fn tex_create(r: &Resource, tex: &[u32; 26], view: Option<&[u32; 28]>) -> GpuResult<u64> {
    let d = res_desc(r);
    let mut t: cu::CUtexObject = 0;
    let view = view.map_or(std::ptr::null(), |v| v as *const [u32; 28] as *const _);
    // SAFETY: descriptors laid out as the driver's; the resource was checked to be the
    // client's; the driver checks the descriptors' fields.
    ck(unsafe {
        cu::cuTexObjectCreate(
            &mut t,
            &d as *const ResDesc as *const _,
            tex as *const [u32; 26] as *const _,
            view,
        )
    })?;
    Ok(t)
}

pub fn tex_destroy(t: u64) -> GpuResult<()> {
    // SAFETY: a texture object of a client's, given up by it.
    ck(unsafe { cu::cuTexObjectDestroy(t) })
}

pub fn surf_create(a: u64) -> GpuResult<u64> {
    let d = res_desc(&Resource::Array(a));
    let mut o: cu::CUsurfObject = 0;
    // SAFETY: as tex_create.
    ck(unsafe { cu::cuSurfObjectCreate(&mut o, &d as *const ResDesc as *const _) })?;
    Ok(o)
}

pub fn surf_destroy(o: u64) -> GpuResult<()> {
    // SAFETY: a surface object of a client's, given up by it.
    ck(unsafe { cu::cuSurfObjectDestroy(o) })
}
