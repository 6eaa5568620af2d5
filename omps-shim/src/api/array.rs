//! CUDA arrays and mipmapped arrays, copies to and from them, and texture and surface
//! objects. The arrays live in the server (omps-server/src/session/arrays.rs), named here
//! by handles that carry the server's id and the descriptor, which the descriptor queries
//! answer from. A copy between an array and host memory goes through a device buffer of
//! the client's: the host side is an ordinary copy, the array side a copy in the server.
//! Texture and surface objects are the driver's values (kernels read them as they are);
//! the descriptors they were made from are kept here for the queries.

use super::copy_any::{copy_linear_3d, Memcpy3D};
/// The texture and surface object entry points, under the path they always had.
pub use super::tex_object::{
    cuSurfObjectCreate, cuSurfObjectDestroy, cuSurfObjectGetResourceDesc, cuTexObjectCreate,
    cuTexObjectDestroy, cuTexObjectGetResourceDesc, cuTexObjectGetResourceViewDesc,
    cuTexObjectGetTextureDesc, ResourceDesc,
};
use crate::cuda::*;
use crate::handles::{leak, resolve, retire};
use crate::state::blocks::{alloc, free_block};
use crate::state::entry::{entry, live, out};
use crate::state::ranges::range_info;
use crate::state::streams::CUstream;
use omps_ring::wire::{self, array, Op};
use std::collections::HashMap;
use std::ffi::{c_uint, c_void};
use std::sync::atomic::AtomicU32;
use std::sync::{LazyLock, Mutex};

pub const ARRAY_MAGIC: u32 = 0x6172_7221;
pub const MIPMAP_MAGIC: u32 = 0x6d69_7021;

/// CUDA_ARRAY3D_DESCRIPTOR.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Array3DDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

/// CUDA_ARRAY_DESCRIPTOR.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

#[repr(C)]
pub struct ArrayHandle {
    magic: AtomicU32,
    pub(crate) id: u32,
    pub(crate) dev: usize,
    desc: Array3DDesc,
}

pub type CUarray = *mut ArrayHandle;
pub type CUmipmappedArray = *mut ArrayHandle;

pub(crate) fn handle(a: CUarray, magic: u32) -> Result<&'static ArrayHandle, CUresult> {
    // SAFETY: the caller passed an array handle, as the API requires; handles are never
    // freed.
    unsafe { resolve(a as *const ArrayHandle, magic) }
}

/// Bytes per row of an array, for the formats whose size omps knows (None: the driver
/// checks the copy).
fn row_bytes(d: &Array3DDesc) -> Option<usize> {
    let channel = array::format_bytes(d.format)? as usize;
    d.width.checked_mul(d.channels as usize * channel)
}

/// An array side of a copy must lie inside the array: refused at once, as the driver
/// refuses it.
fn check_inside(a: *mut c_void, xyz: [usize; 3], extent: [usize; 3]) -> Result<(), CUresult> {
    let h = handle(a as CUarray, ARRAY_MAGIC)?;
    let fits =
        |at: usize, n: usize, size: usize| at.checked_add(n).is_some_and(|e| e <= size.max(1));
    let rows_fit = fits(xyz[1], extent[1], h.desc.height) && fits(xyz[2], extent[2], h.desc.depth);
    let width_fits = row_bytes(&h.desc).is_none_or(|rb| fits(xyz[0], extent[0], rb));
    if rows_fit && width_fits {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

fn call(dev: usize, kind: u32, id: u32, args: [u64; 7]) -> Result<u64, CUresult> {
    let c = live()?;
    let mut ch = c.channel();
    ch.call(dev, Op::Array, |call| {
        bytemuck::bytes_of(&wire::ArrayCall {
            call,
            kind,
            id,
            args,
        })
        .to_vec()
    })?;
    Ok(ch.reply::<wire::U64Reply>().value)
}

fn create(d: &Array3DDesc, levels: Option<c_uint>) -> Result<*mut ArrayHandle, CUresult> {
    let dev = crate::state::ctx::current_dev()?;
    let args = [
        d.width as u64,
        d.height as u64,
        d.depth as u64,
        d.format as u64,
        d.channels as u64,
        d.flags as u64,
        levels.unwrap_or(0) as u64,
    ];
    let (kind, magic) = match levels {
        None => (array::CREATE, ARRAY_MAGIC),
        Some(_) => (array::CREATE_MIPMAPPED, MIPMAP_MAGIC),
    };
    let id = call(dev, kind, 0, args)? as u32;
    Ok(leak(ArrayHandle {
        magic: AtomicU32::new(magic),
        id,
        dev,
        desc: *d,
    }))
}

/// # Safety
/// `p` is null or writable; `d` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(p: *mut CUarray, d: *const Array3DDesc) -> CUresult {
    entry(|| {
        // SAFETY: the caller's descriptor.
        let d = unsafe { d.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let h = create(d, None)?;
        // SAFETY: the caller's pointer.
        unsafe { out(p, h) }
    })
}

/// # Safety
/// `p` is null or writable; `d` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(p: *mut CUarray, d: *const ArrayDesc) -> CUresult {
    entry(|| {
        // SAFETY: the caller's descriptor.
        let d = unsafe { d.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let d3 = Array3DDesc {
            width: d.width,
            height: d.height,
            depth: 0,
            format: d.format,
            channels: d.channels,
            flags: 0,
        };
        let h = create(&d3, None)?;
        // SAFETY: the caller's pointer.
        unsafe { out(p, h) }
    })
}

/// # Safety
/// `p` is null or writable; `d` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    p: *mut CUmipmappedArray,
    d: *const Array3DDesc,
    levels: c_uint,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's descriptor.
        let d = unsafe { d.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let h = create(d, Some(levels))?;
        // SAFETY: the caller's pointer.
        unsafe { out(p, h) }
    })
}

/// Level arrays already handed out: (mipmapped array id, level) -> handle, so the same
/// level is the same handle.
static LEVELS: LazyLock<Mutex<HashMap<(u32, c_uint), usize>>> = LazyLock::new(Default::default);

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayGetLevel(
    p: *mut CUarray,
    m: CUmipmappedArray,
    level: c_uint,
) -> CUresult {
    entry(|| {
        let mip = handle(m, MIPMAP_MAGIC)?;
        let mut levels = LEVELS.lock().unwrap_or_else(|e| e.into_inner());
        let h = match levels.get(&(mip.id, level)) {
            Some(&h) => h as CUarray,
            None => {
                let id = call(
                    mip.dev,
                    array::LEVEL,
                    mip.id,
                    [level as u64, 0, 0, 0, 0, 0, 0],
                )?;
                let half = |v: usize| if v == 0 { 0 } else { (v >> level).max(1) };
                let h = leak(ArrayHandle {
                    magic: AtomicU32::new(ARRAY_MAGIC),
                    id: id as u32,
                    dev: mip.dev,
                    desc: Array3DDesc {
                        width: half(mip.desc.width),
                        height: half(mip.desc.height),
                        depth: half(mip.desc.depth),
                        ..mip.desc
                    },
                });
                levels.insert((mip.id, level), h as usize);
                h
            }
        };
        // SAFETY: the caller's pointer.
        unsafe { out(p, h) }
    })
}

#[no_mangle]
pub extern "C" fn cuArrayDestroy(a: CUarray) -> CUresult {
    entry(|| {
        let h = handle(a, ARRAY_MAGIC)?;
        if LEVELS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .any(|&l| l == a as usize)
        {
            // A level goes with its mipmapped array.
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        retire(&h.magic, ARRAY_MAGIC)?;
        call(h.dev, array::DESTROY, h.id, [0; 7]).map(drop)
    })
}

#[no_mangle]
pub extern "C" fn cuMipmappedArrayDestroy(m: CUmipmappedArray) -> CUresult {
    entry(|| {
        let h = handle(m, MIPMAP_MAGIC)?;
        retire(&h.magic, MIPMAP_MAGIC)?;
        let mut levels = LEVELS.lock().unwrap_or_else(|e| e.into_inner());
        levels.retain(|&(id, _), &mut l| {
            if id == h.id {
                // SAFETY: a level handle made here, never freed.
                let _ = retire(&unsafe { &*(l as *const ArrayHandle) }.magic, ARRAY_MAGIC);
            }
            id != h.id
        });
        drop(levels);
        call(h.dev, array::DESTROY_MIPMAPPED, h.id, [0; 7]).map(drop)
    })
}

/// # Safety
/// `d` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DGetDescriptor_v2(d: *mut Array3DDesc, a: CUarray) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(d, handle(a, ARRAY_MAGIC)?.desc) })
}

/// # Safety
/// `d` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuArrayGetDescriptor_v2(d: *mut ArrayDesc, a: CUarray) -> CUresult {
    entry(|| {
        let h = handle(a, ARRAY_MAGIC)?;
        if h.desc.depth > 0 {
            // A 3D array's descriptor has no 2D form, natively either.
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = ArrayDesc {
            width: h.desc.width,
            height: h.desc.height,
            format: h.desc.format,
            channels: h.desc.channels,
        };
        // SAFETY: the caller's pointer.
        unsafe { out(d, v) }
    })
}

// ------------------------------------------------------------------ copies

const HOST: c_uint = 1;
const DEVICE: c_uint = 2;
const ARRAY: c_uint = 3;
const UNIFIED: c_uint = 4;

/// Whether copy `c` has an array on either side (then [`copy`] does it).
pub(crate) fn involves_array(c: &Memcpy3D) -> bool {
    c.src_type == ARRAY || c.dst_type == ARRAY
}

/// The server's side of an array copy: an array by id, or device memory.
fn server_side(
    ty: c_uint,
    arr: *mut c_void,
    dev: u64,
    xyz: [usize; 3],
    pitch: usize,
    height: usize,
) -> Result<wire::CopySide, CUresult> {
    let [x, y, z] = xyz;
    let mut side = wire::CopySide {
        x: x as u64,
        y: y as u64,
        z: z as u64,
        ..Default::default()
    };
    if ty == ARRAY {
        side.array = handle(arr as CUarray, ARRAY_MAGIC)?.id;
    } else {
        side.dev = dev;
        side.pitch = pitch as u64;
        side.height = height as u64;
    }
    Ok(side)
}

fn push_copy(
    dev: usize,
    s: CUstream,
    src: wire::CopySide,
    dst: wire::CopySide,
    extent: [usize; 3],
) -> Result<(), CUresult> {
    let (stream, wait) = crate::state::capture::stream_for(dev, s)?;
    let rec = wire::ArrayCopy {
        stream,
        _pad: 0,
        src,
        dst,
        width: extent[0] as u64,
        height: extent[1] as u64,
        depth: extent[2] as u64,
    };
    live()?.push(dev, Op::ArrayCopy, &[bytemuck::bytes_of(&rec)])?;
    if wait {
        crate::state::copies::wait_stream(dev, stream)?;
    }
    Ok(())
}

/// A copy with an array on one side or both. Host memory goes through a device buffer:
/// host to buffer then buffer to array, or array to buffer then buffer to host.
pub(crate) fn copy(c: &Memcpy3D, s: CUstream, sync: bool) -> Result<(), CUresult> {
    if c.src_lod != 0 || c.dst_lod != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let host = |ty: c_uint, dev: u64| ty == HOST || (ty == UNIFIED && range_info(dev).is_none());
    // A unified side names its memory in the device field (the host field is ignored).
    let src_host = host(c.src_type, c.src_device);
    let dst_host = host(c.dst_type, c.dst_device);
    let dev = [c.src_array, c.dst_array]
        .iter()
        .zip([c.src_type, c.dst_type])
        .find(|&(_, t)| t == ARRAY)
        .map(|(&a, _)| handle(a as CUarray, ARRAY_MAGIC).map(|h| h.dev))
        .ok_or(CUDA_ERROR_INVALID_VALUE)??;
    let extent = [c.width, c.height.max(1), c.depth.max(1)];
    if c.width == 0 {
        return Ok(());
    }
    if c.src_type == ARRAY {
        check_inside(c.src_array, [c.src_x, c.src_y, c.src_z], extent)?;
    }
    if c.dst_type == ARRAY {
        check_inside(c.dst_array, [c.dst_x, c.dst_y, c.dst_z], extent)?;
    }
    // One side of the copy as the server takes it: the device buffer standing in for host
    // memory, or the side as described.
    let side = |buf: Option<u64>, src: bool| {
        if let Some(b) = buf {
            return server_side(
                DEVICE,
                std::ptr::null_mut(),
                b,
                [0; 3],
                extent[0],
                extent[1],
            );
        }
        let (ty, arr, dev, xyz, pitch, height) = if src {
            let at = [c.src_x, c.src_y, c.src_z];
            (
                c.src_type,
                c.src_array,
                c.src_device,
                at,
                c.src_pitch,
                c.src_height,
            )
        } else {
            let at = [c.dst_x, c.dst_y, c.dst_z];
            (
                c.dst_type,
                c.dst_array,
                c.dst_device,
                at,
                c.dst_pitch,
                c.dst_height,
            )
        };
        server_side(ty, arr, dev, xyz, pitch, height)
    };
    let src = |buf: Option<u64>| side(buf, true);
    let dst = |buf: Option<u64>| side(buf, false);
    // The host side's part of the copy, as a plain 3D copy with the buffer.
    let staged = |buf: u64, to_buffer: bool| -> Result<(), CUresult> {
        let mut h: Memcpy3D = *c;
        if to_buffer {
            h.dst_type = DEVICE;
            h.dst_device = buf;
            (h.dst_x, h.dst_y, h.dst_z, h.dst_pitch, h.dst_height) =
                (0, 0, 0, extent[0], extent[1]);
        } else {
            h.src_type = DEVICE;
            h.src_device = buf;
            (h.src_x, h.src_y, h.src_z, h.src_pitch, h.src_height) =
                (0, 0, 0, extent[0], extent[1]);
        }
        copy_linear_3d(&h, s, sync)
    };
    let r = if src_host || dst_host {
        let n = extent[0] * extent[1] * extent[2];
        let buf = alloc(dev, n)?;
        let r = if src_host {
            staged(buf, true).and_then(|()| push_copy(dev, s, src(Some(buf))?, dst(None)?, extent))
        } else {
            push_copy(dev, s, src(None)?, dst(Some(buf))?, extent).and_then(|()| staged(buf, false))
        };
        // Freed after the client's queued work, the copies included.
        let _ = free_block(buf);
        r
    } else {
        push_copy(dev, s, src(None)?, dst(None)?, extent)
    };
    r?;
    if sync {
        crate::state::streams::stream_sync(s)
    } else {
        Ok(())
    }
}

/// The 1D copies: `offset` bytes into the array's first row.
fn copy_1d(
    src: (c_uint, *mut c_void, u64, usize),
    dst: (c_uint, *mut c_void, u64, usize),
    n: usize,
    s: CUstream,
    sync: bool,
) -> Result<(), CUresult> {
    // SAFETY: an all-zero copy description is valid; the fields that matter are set.
    let mut c: Memcpy3D = unsafe { std::mem::zeroed() };
    (c.src_type, c.src_array, c.src_x) = (src.0, src.1, src.3);
    (c.dst_type, c.dst_array, c.dst_x) = (dst.0, dst.1, dst.3);
    if src.0 == HOST {
        c.src_host = src.2 as *const c_void;
    } else {
        c.src_device = src.2;
    }
    if dst.0 == HOST {
        c.dst_host = dst.2 as *mut c_void;
    } else {
        c.dst_device = dst.2;
    }
    (c.width, c.height, c.depth) = (n, 1, 1);
    copy(&c, s, sync)
}

/// The 1D copies: (memory type, array, address, offset) of each side, then the byte
/// count; a synchronous one waits for its copy, an asynchronous one takes a stream.
macro_rules! copies_1d {
    ($($name:ident($($arg:ident: $ty:ty),*) => $src:expr, $dst:expr, $n:expr, $s:expr;)*) => {$(
        #[no_mangle]
        pub extern "C" fn $name($($arg: $ty),*) -> CUresult {
            let (s, sync): (CUstream, bool) = $s;
            entry(|| copy_1d($src, $dst, $n, s, sync))
        }
    )*};
}

const NOWHERE: *mut c_void = std::ptr::null_mut();
const SYNC: (CUstream, bool) = (std::ptr::null_mut(), true);

copies_1d! {
    cuMemcpyHtoA_v2(a: CUarray, off: usize, src: *const c_void, n: usize)
        => (HOST, NOWHERE, src as u64, 0), (ARRAY, a as *mut c_void, 0, off), n, SYNC;
    cuMemcpyHtoAAsync_v2(a: CUarray, off: usize, src: *const c_void, n: usize, st: CUstream)
        => (HOST, NOWHERE, src as u64, 0), (ARRAY, a as *mut c_void, 0, off), n, (st, false);
    cuMemcpyAtoH_v2(dst: *mut c_void, a: CUarray, off: usize, n: usize)
        => (ARRAY, a as *mut c_void, 0, off), (HOST, NOWHERE, dst as u64, 0), n, SYNC;
    cuMemcpyAtoHAsync_v2(dst: *mut c_void, a: CUarray, off: usize, n: usize, st: CUstream)
        => (ARRAY, a as *mut c_void, 0, off), (HOST, NOWHERE, dst as u64, 0), n, (st, false);
    cuMemcpyDtoA_v2(a: CUarray, off: usize, src: u64, n: usize)
        => (DEVICE, NOWHERE, src, 0), (ARRAY, a as *mut c_void, 0, off), n, SYNC;
    cuMemcpyAtoD_v2(dst: u64, a: CUarray, off: usize, n: usize)
        => (ARRAY, a as *mut c_void, 0, off), (DEVICE, NOWHERE, dst, 0), n, SYNC;
    cuMemcpyAtoA_v2(dst: CUarray, doff: usize, src: CUarray, soff: usize, n: usize)
        => (ARRAY, src as *mut c_void, 0, soff), (ARRAY, dst as *mut c_void, 0, doff), n, SYNC;
}
