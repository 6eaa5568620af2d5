//! Texture and surface objects: the driver's values (kernels read them as they are), made
//! in the server from an array or linear memory; the descriptors they were made from are
//! kept here for the queries. Apart from the arrays themselves (array.rs), which they name.

use super::array::{handle, Array3DDesc, CUarray, CUmipmappedArray, ARRAY_MAGIC, MIPMAP_MAGIC};
use crate::cuda::*;
use crate::state::entry::{entry, live, out};
use crate::state::ranges::range_info;
use omps_ring::wire::{self, array, tex, Op};
use std::collections::HashMap;
use std::ffi::c_uint;
use std::sync::{LazyLock, Mutex};

/// CUDA_RESOURCE_DESC: the type, a 128-byte union, flags.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ResourceDesc {
    pub ty: c_uint,
    pub res: [u64; 16],
    pub flags: c_uint,
}

const _: () = assert!(std::mem::size_of::<ResourceDesc>() == 144);
const _: () = assert!(std::mem::size_of::<Array3DDesc>() == 40);

/// What an object was made from, for the queries.
#[derive(Clone, Copy)]
struct Made {
    res: ResourceDesc,
    tex: [u32; 26],
    view: Option<[u32; 28]>,
    dev: usize,
}

/// Texture and surface object value -> what it was made from.
static TEXTURES: LazyLock<Mutex<HashMap<u64, Made>>> = LazyLock::new(Default::default);
static SURFACES: LazyLock<Mutex<HashMap<u64, Made>>> = LazyLock::new(Default::default);

fn objects(surface: bool) -> std::sync::MutexGuard<'static, HashMap<u64, Made>> {
    if surface { &SURFACES } else { &TEXTURES }
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// How much of a linear texture's size the server is asked for, given the `room` left in
/// the allocation it starts in. The driver does not hold the size to the allocation
/// (convolutionFFT2D makes a texture larger than its buffer and fetches only inside it);
/// in the shared context the bytes past it may be another client's, so the texture ends
/// with the allocation, in whole elements: a fetch past it reads 0, not what lies there.
/// The descriptor queries still answer the size the program gave.
fn linear_room(room: u64, format: c_uint, channels: c_uint) -> u64 {
    let elem = array::format_bytes(format).map_or(1, |b| b * u64::from(channels.max(1)));
    room - room % elem
}

fn make_object(
    kind: u32,
    res: &ResourceDesc,
    texd: [u32; 26],
    view: Option<[u32; 28]>,
) -> Result<(u64, usize), CUresult> {
    const RES_ARRAY: c_uint = 0;
    const RES_MIPMAPPED: c_uint = 1;
    const RES_LINEAR: c_uint = 2;
    const RES_PITCH2D: c_uint = 3;
    if res.flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut t = wire::TexCall {
        kind,
        res_type: res.ty,
        tex: texd,
        view: view.unwrap_or([0; 28]),
        has_view: u32::from(view.is_some()),
        ..Default::default()
    };
    let fmt = |v: u64| (v as u32, (v >> 32) as u32);
    let dev = match res.ty {
        RES_ARRAY => {
            let h = handle(res.res[0] as CUarray, ARRAY_MAGIC)?;
            t.array = h.id;
            h.dev
        }
        RES_MIPMAPPED => {
            let h = handle(res.res[0] as CUmipmappedArray, MIPMAP_MAGIC)?;
            t.array = h.id;
            h.dev
        }
        RES_LINEAR | RES_PITCH2D => {
            t.dev = res.res[0];
            (t.format, t.channels) = fmt(res.res[1]);
            if res.ty == RES_LINEAR {
                t.size = res.res[2];
            } else {
                (t.width, t.height, t.pitch) = (res.res[2], res.res[3], res.res[4]);
            }
            match range_info(t.dev) {
                Some((start, n, dev)) => {
                    if res.ty == RES_LINEAR {
                        t.size = t
                            .size
                            .min(linear_room(start + n - t.dev, t.format, t.channels));
                    }
                    dev
                }
                // Mapped page-locked memory, which the server checks as the client's.
                None if crate::state::host_ranges::is_shared(t.dev, 1) => {
                    crate::state::ctx::current_dev()?
                }
                None => return Err(CUDA_ERROR_INVALID_VALUE),
            }
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let c = live()?;
    let mut ch = c.channel();
    ch.call(dev, Op::TexObject, |call| {
        t.call = call;
        bytemuck::bytes_of(&t).to_vec()
    })?;
    Ok((ch.reply::<wire::U64Reply>().value, dev))
}

/// # Safety
/// `p` is null or writable; the descriptors are null or valid (the view may be null).
#[no_mangle]
pub unsafe extern "C" fn cuTexObjectCreate(
    p: *mut u64,
    res: *const ResourceDesc,
    texd: *const [u32; 26],
    view: *const [u32; 28],
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's descriptors.
        let (res, texd, view) = unsafe { (res.as_ref(), texd.as_ref(), view.as_ref().copied()) };
        let (res, texd) = (
            res.ok_or(CUDA_ERROR_INVALID_VALUE)?,
            *texd.ok_or(CUDA_ERROR_INVALID_VALUE)?,
        );
        let (o, dev) = make_object(tex::CREATE_TEXTURE, res, texd, view)?;
        objects(false).insert(
            o,
            Made {
                res: *res,
                tex: texd,
                view,
                dev,
            },
        );
        // SAFETY: the caller's pointer.
        unsafe { out(p, o) }
    })
}

/// # Safety
/// `p` is null or writable; `res` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn cuSurfObjectCreate(p: *mut u64, res: *const ResourceDesc) -> CUresult {
    entry(|| {
        // SAFETY: the caller's descriptor.
        let res = unsafe { res.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if res.ty != 0 {
            // Surfaces are over arrays.
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (o, dev) = make_object(tex::CREATE_SURFACE, res, [0; 26], None)?;
        objects(true).insert(
            o,
            Made {
                res: *res,
                tex: [0; 26],
                view: None,
                dev,
            },
        );
        // SAFETY: the caller's pointer.
        unsafe { out(p, o) }
    })
}

fn destroy_object(o: u64, surface: bool) -> Result<(), CUresult> {
    let made = objects(surface)
        .remove(&o)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let kind = if surface {
        tex::DESTROY_SURFACE
    } else {
        tex::DESTROY_TEXTURE
    };
    let c = live()?;
    let mut ch = c.channel();
    ch.call(made.dev, Op::TexObject, |call| {
        bytemuck::bytes_of(&wire::TexCall {
            call,
            kind,
            object: o,
            ..Default::default()
        })
        .to_vec()
    })
}

#[no_mangle]
pub extern "C" fn cuTexObjectDestroy(o: u64) -> CUresult {
    entry(|| destroy_object(o, false))
}

#[no_mangle]
pub extern "C" fn cuSurfObjectDestroy(o: u64) -> CUresult {
    entry(|| destroy_object(o, true))
}

fn made(o: u64, surface: bool) -> Result<Made, CUresult> {
    objects(surface)
        .get(&o)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuTexObjectGetResourceDesc(p: *mut ResourceDesc, o: u64) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(p, made(o, false)?.res) })
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuSurfObjectGetResourceDesc(p: *mut ResourceDesc, o: u64) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(p, made(o, true)?.res) })
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuTexObjectGetTextureDesc(p: *mut [u32; 26], o: u64) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(p, made(o, false)?.tex) })
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuTexObjectGetResourceViewDesc(p: *mut [u32; 28], o: u64) -> CUresult {
    entry(|| {
        // Natively an object made without a view answers INVALID_VALUE.
        let v = made(o, false)?.view.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's pointer.
        unsafe { out(p, v) }
    })
}
