//! [`CudaGpu`]'s launch family: kernel launches with their attributes, the wire's
//! queries (occupancy, limits, cache configs) and tensor map encoding.

use super::device::{ck, raw_fn, CudaGpu};
use crate::gpu::{code, CuError, GpuResult};
use cudarc::driver::sys as cu;
use std::ffi::{c_int, c_void};

/// One launch attribute as the client sent it: CUlaunchAttribute's bytes, aligned as it
/// is. Kept as bytes, never as cudarc's type, whose id enum lacks ids newer than its
/// headers (17, 18 are forwarded): only the driver reads them.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub(super) struct LaunchAttrBytes([u8; omps_ring::wire::LAUNCH_ATTR_BYTES]);

const _: () = assert!(
    std::mem::align_of::<LaunchAttrBytes>() == std::mem::align_of::<cu::CUlaunchAttribute>()
        && std::mem::size_of::<LaunchAttrBytes>() == std::mem::size_of::<cu::CUlaunchAttribute>()
);

/// Launch attributes from the wire (whole CUlaunchAttribute records) in an aligned list,
/// for the driver (`as_mut_ptr().cast()`).
pub(super) fn attr_list(attrs: &[u8]) -> Vec<LaunchAttrBytes> {
    attrs
        .chunks_exact(omps_ring::wire::LAUNCH_ATTR_BYTES)
        .map(|c| LaunchAttrBytes(c.try_into().expect("chunks of the size")))
        .collect()
}

pub(super) type Desc = *mut [u8; 128];
pub(super) type RawTiledFn = unsafe extern "C" fn(
    Desc,
    u32,
    u32,
    u64,
    *const u64,
    *const u64,
    *const u32,
    *const u32,
    u32,
    u32,
    u32,
    u32,
) -> c_int;
pub(super) type RawIm2colFn = unsafe extern "C" fn(
    Desc,
    u32,
    u32,
    u64,
    *const u64,
    *const u64,
    *const i32,
    *const i32,
    u32,
    u32,
    *const u32,
    u32,
    u32,
    u32,
    u32,
) -> c_int;
pub(super) type RawIm2colWideFn = unsafe extern "C" fn(
    Desc,
    u32,
    u32,
    u64,
    *const u64,
    *const u64,
    i32,
    i32,
    u32,
    u32,
    *const u32,
    u32,
    u32,
    u32,
    u32,
    u32,
) -> c_int;
pub(super) type RawReplaceFn = unsafe extern "C" fn(Desc, u64) -> c_int;

/// `extra` keys of cuLaunchKernel (cuda.h: CU_LAUNCH_PARAM_*).
pub(super) const LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
pub(super) const LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

/// The priority of work stream `s`'s QoS class (its launches run at it; a kernel may ask
/// for less, never more).
pub(super) fn class_priority(gpu: &CudaGpu, s: usize) -> i32 {
    let (least, greatest) = gpu.priorities;
    let class = gpu
        .layout
        .class_at(s)
        .unwrap_or(crate::sched::placement::NORMAL);
    crate::sched::placement::class_priority(class, least, greatest)
}

pub(super) fn tensor_map(
    gpu: &CudaGpu,
    t: &omps_ring::wire::TensorMap,
    old: Option<&[u8; 128]>,
) -> GpuResult<[u8; 128]> {
    use omps_ring::wire::tensor_map as k;
    // A device address is checked against the current context.
    gpu.bind();
    // The descriptor is the driver's own bytes; enums pass as plain integers (the
    // driver checks them), arrays are the record's, of the sizes cuda.h gives.
    let mut d = old.copied().unwrap_or([0; 128]);
    // SAFETY: each symbol has the signature declared above (cuda.h, CUDA 13); every
    // pointer argument is into `t` or `d`, with room for rank 5.
    let r = unsafe {
        match t.kind {
            k::TILED => raw_fn::<RawTiledFn>(b"cuTensorMapEncodeTiled\0")?(
                &mut d,
                t.dtype,
                t.rank,
                t.global_address,
                t.global_dim.as_ptr(),
                t.global_strides.as_ptr(),
                t.box_dim.as_ptr(),
                t.element_strides.as_ptr(),
                t.interleave,
                t.swizzle,
                t.l2_promotion,
                t.oob_fill,
            ),
            k::IM2COL => raw_fn::<RawIm2colFn>(b"cuTensorMapEncodeIm2col\0")?(
                &mut d,
                t.dtype,
                t.rank,
                t.global_address,
                t.global_dim.as_ptr(),
                t.global_strides.as_ptr(),
                t.lower.as_ptr(),
                t.upper.as_ptr(),
                t.channels_per_pixel,
                t.pixels_per_column,
                t.element_strides.as_ptr(),
                t.interleave,
                t.swizzle,
                t.l2_promotion,
                t.oob_fill,
            ),
            k::IM2COL_WIDE => raw_fn::<RawIm2colWideFn>(b"cuTensorMapEncodeIm2colWide\0")?(
                &mut d,
                t.dtype,
                t.rank,
                t.global_address,
                t.global_dim.as_ptr(),
                t.global_strides.as_ptr(),
                t.lower_w,
                t.upper_w,
                t.channels_per_pixel,
                t.pixels_per_column,
                t.element_strides.as_ptr(),
                t.interleave,
                t.wide_mode,
                t.swizzle,
                t.l2_promotion,
                t.oob_fill,
            ),
            k::REPLACE_ADDRESS => {
                raw_fn::<RawReplaceFn>(b"cuTensorMapReplaceAddress\0")?(&mut d, t.global_address)
            }
            _ => return Err(CuError(code::INVALID_VALUE)),
        }
    };
    if r != 0 {
        return Err(CuError(r));
    }
    Ok(d)
}

pub(super) fn query(
    gpu: &CudaGpu,
    kind: u32,
    func: u64,
    a: [i64; 7],
    attrs: &[u8],
) -> GpuResult<i64> {
    use omps_ring::wire::query;
    gpu.bind();
    let f = func as cu::CUfunction;
    let raw = |r: c_int| if r == 0 { Ok(()) } else { Err(CuError(r)) };
    match kind {
        query::OCC_MAX_BLOCKS => {
            let mut n = 0;
            // SAFETY: f is a live function; valid out-pointer.
            ck(unsafe {
                cu::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
                    &mut n,
                    f,
                    a[0] as c_int,
                    a[1] as usize,
                    a[2] as u32,
                )
            })?;
            Ok(n as i64)
        }
        query::OCC_DYN_SMEM => {
            let mut n = 0usize;
            // SAFETY: f is a live function; valid out-pointer.
            ck(unsafe {
                cu::cuOccupancyAvailableDynamicSMemPerBlock(&mut n, f, a[0] as c_int, a[1] as c_int)
            })?;
            Ok(n as i64)
        }
        query::OCC_MAX_CLUSTERS | query::OCC_MAX_CLUSTER_SIZE => {
            let mut list = attr_list(attrs);
            let n = list.len();
            let config = cu::CUlaunchConfig {
                gridDimX: a[0] as u32,
                gridDimY: a[1] as u32,
                gridDimZ: a[2] as u32,
                blockDimX: a[3] as u32,
                blockDimY: a[4] as u32,
                blockDimZ: a[5] as u32,
                sharedMemBytes: a[6] as u32,
                hStream: std::ptr::null_mut(),
                attrs: list.as_mut_ptr().cast(),
                numAttrs: n as u32,
            };
            let mut r = 0;
            // SAFETY: f is a live function; config and list outlive the call.
            ck(unsafe {
                if kind == query::OCC_MAX_CLUSTERS {
                    cu::cuOccupancyMaxActiveClusters(&mut r, f, &config)
                } else {
                    cu::cuOccupancyMaxPotentialClusterSize(&mut r, f, &config)
                }
            })?;
            Ok(r as i64)
        }
        query::CTX_GET_LIMIT => {
            let mut v = 0usize;
            // SAFETY: valid out-pointer; the driver checks the limit number.
            raw(unsafe { (gpu.get_limit_fn)(&mut v, a[0] as c_int) })?;
            Ok(v as i64)
        }
        query::CTX_SET_LIMIT => {
            // SAFETY: the driver checks the limit number and value.
            raw(unsafe { (gpu.set_limit_fn)(a[0] as c_int, a[1] as usize) }).map(|_| 0)
        }
        query::CTX_RESET_PERSISTING_L2 => {
            // SAFETY: no arguments; acts on the bound context.
            ck(unsafe { cu::cuCtxResetPersistingL2Cache() }).map(|_| 0)
        }
        query::FUNC_CACHE_CONFIG => {
            // SAFETY: f is a live function; the driver checks the config.
            raw(unsafe { (gpu.cache_config_fn)(f, a[0] as c_int) }).map(|_| 0)
        }
        _ => Err(CuError(code::NOT_SUPPORTED)),
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn launch(
    gpu: &CudaGpu,
    func: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    s: usize,
    attrs: &[u8],
    args: &[u8],
) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    let mut size = args.len();
    // The packed buffer form: the session checked its size against the function's
    // parameter layout, so the driver reads exactly what is there.
    let mut extra = [
        LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
        args.as_ptr() as *mut c_void,
        LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
        &mut size as *mut usize as *mut c_void,
        std::ptr::null_mut(), // CU_LAUNCH_PARAM_END
    ];
    let extra_ptr = if args.is_empty() {
        std::ptr::null_mut()
    } else {
        extra.as_mut_ptr()
    };
    if attrs.is_empty() {
        // SAFETY: func is a live function handle; extra points at locals alive for the call.
        return ck(unsafe {
            cu::cuLaunchKernel(
                func as cu::CUfunction,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared,
                st,
                std::ptr::null_mut(),
                extra_ptr,
            )
        });
    }
    let floor = class_priority(gpu, s);
    let attrs = crate::sched::placement::hold_launch_priority(attrs, floor, gpu.priorities.0);
    let mut list = attr_list(&attrs);
    let n = list.len();
    let config = cu::CUlaunchConfig {
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: block[0],
        blockDimY: block[1],
        blockDimZ: block[2],
        sharedMemBytes: shared,
        hStream: st,
        attrs: list.as_mut_ptr().cast(),
        numAttrs: n as u32,
    };
    // SAFETY: as above; config and list outlive the call.
    ck(unsafe {
        cu::cuLaunchKernelEx(
            &config,
            func as cu::CUfunction,
            std::ptr::null_mut(),
            extra_ptr,
        )
    })
}
