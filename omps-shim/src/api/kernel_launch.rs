//! Kernel launches (cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel): the
//! checks the driver makes before it queues one, the packed arguments, and the record
//! pushed to the server. Apart from the streams and events they run on (exec.rs).

use crate::cuda::*;
use crate::handles::Function;
use crate::state::entry::{entry, live};
use crate::state::launch::*;
use crate::state::profile::{self, Work};
use crate::state::streams::*;
use omps_ring::wire::{self, Launch, Op};
use std::ffi::{c_int, c_uint, c_void};

thread_local! {
    static ARGS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

const LAUNCH_PARAM_END: usize = 0;
const LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
const LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

/// The packed parameter buffer a launch carries, from `kernelParams` or from `extra`.
///
/// # Safety
/// `params` and `extra` follow cuLaunchKernel's contract for function `f`.
pub(crate) unsafe fn pack_args(
    f: &Function,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    buf: &mut [u8],
) -> Result<(), CUresult> {
    if !params.is_null() {
        for (i, &(off, size)) in f.params.iter().enumerate() {
            // SAFETY: kernelParams holds one pointer per parameter, each to `size` bytes.
            let src = unsafe { *params.add(i) } as *const u8;
            if src.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: as above; buf is args_size long, which covers off + size.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src,
                    buf.as_mut_ptr().add(off as usize),
                    size as usize,
                )
            };
        }
        return Ok(());
    }
    if extra.is_null() {
        return if f.args_size == 0 {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        };
    }
    let (mut ptr, mut size): (*const u8, Option<usize>) = (std::ptr::null(), None);
    let mut i = 0;
    loop {
        // SAFETY: extra is a key/value list ended by CU_LAUNCH_PARAM_END.
        let key = unsafe { *extra.add(i) } as usize;
        match key {
            LAUNCH_PARAM_END => break,
            // SAFETY: the value follows its key.
            LAUNCH_PARAM_BUFFER_POINTER => ptr = unsafe { *extra.add(i + 1) } as *const u8,
            LAUNCH_PARAM_BUFFER_SIZE => {
                // SAFETY: the value is a pointer to a size_t.
                size = Some(unsafe { *(*extra.add(i + 1) as *const usize) })
            }
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        i += 2;
    }
    match size {
        // A buffer shorter than the parameters is taken as the driver takes it: NCCL's
        // kernels declare a 4 KiB argument struct and pass only the bytes in use. The
        // rest stays zero (buf comes zeroed).
        Some(n) if !ptr.is_null() => {
            let n = n.min(f.args_size);
            // SAFETY: the caller's buffer holds n bytes; buf holds args_size >= n.
            unsafe { std::ptr::copy_nonoverlapping(ptr, buf.as_mut_ptr(), n) };
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// The launch attributes the driver checks before queueing: cluster dimensions must
/// divide the grid, and a cooperative grid must fit on the GPU at once. The latter needs
/// the function's occupancy, one round trip, paid only by cooperative launches.
fn check_attrs(
    f: CUfunction,
    func: &Function,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    attrs: &[u8],
) -> Result<(), CUresult> {
    const COOPERATIVE: u32 = 2;
    const CLUSTER_DIMENSION: u32 = 4;
    const INVALID_CLUSTER_SIZE: CUresult = 912;
    const COOPERATIVE_LAUNCH_TOO_LARGE: CUresult = 720;
    const MULTIPROCESSOR_COUNT: usize = 16;
    let word = |a: &[u8], i: usize| {
        u32::from_le_bytes(a[8 + 4 * i..12 + 4 * i].try_into().expect("4 bytes"))
    };
    // A GPU without clusters (before compute capability 9.0) refuses the cluster
    // attributes at the launch, as the driver does, rather than at the next sync.
    const CLUSTER_LAUNCH: usize = 120;
    let clusters =
        crate::state::device::device(func.dev as CUdevice)?.attribute(CLUSTER_LAUNCH) != Some(0);
    for a in attrs.chunks_exact(wire::LAUNCH_ATTR_BYTES) {
        match u32::from_le_bytes(a[..4].try_into().expect("4 bytes")) {
            // Cluster dimension, cluster scheduling policy, preferred cluster dimension.
            4 | 5 | 11 if !clusters => return Err(CUDA_ERROR_NOT_SUPPORTED),
            CLUSTER_DIMENSION => {
                let cluster = [word(a, 0), word(a, 1), word(a, 2)];
                if (0..3).any(|i| cluster[i] == 0 || !grid[i].is_multiple_of(cluster[i])) {
                    return Err(INVALID_CLUSTER_SIZE);
                }
            }
            COOPERATIVE if word(a, 0) != 0 => {
                let threads = block.iter().product::<u32>() as i64;
                let per_sm =
                    crate::state::answers::occupancy(f, threads as c_int, shared as usize, 0)?;
                let sms = crate::state::device::device(func.dev as CUdevice)?
                    .attribute(MULTIPROCESSOR_COUNT)
                    .unwrap_or(0) as i64;
                if grid.iter().map(|&g| g as i64).product::<i64>() > per_sm * sms {
                    return Err(COOPERATIVE_LAUNCH_TOO_LARGE);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The checks the driver makes before it queues a launch, from the snapshot's limits.
fn check_config(
    f: &Function,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
) -> Result<(), CUresult> {
    let d = crate::state::device::device(f.dev as CUdevice)?;
    let attr = |a: usize| d.attribute(a).unwrap_or(i32::MAX) as u64;
    const MAX_BLOCK_DIM: [usize; 3] = [2, 3, 4];
    const MAX_GRID_DIM: [usize; 3] = [5, 6, 7];
    for i in 0..3 {
        if block[i] == 0
            || grid[i] == 0
            || block[i] as u64 > attr(MAX_BLOCK_DIM[i])
            || grid[i] as u64 > attr(MAX_GRID_DIM[i])
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    let threads = block.iter().map(|&b| b as u64).product::<u64>();
    if threads > f.max_threads_per_block.max(0) as u64 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if shared as u64
        > f.max_dynamic_shared
            .load(std::sync::atomic::Ordering::Relaxed)
            .max(0) as u64
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// Queues a launch: checks what the driver checks synchronously, packs the arguments,
/// and pushes one record (header, attributes, arguments).
///
/// # Safety
/// `params` and `extra` follow cuLaunchKernel's contract for `f`.
#[allow(clippy::too_many_arguments)]
unsafe fn launch(
    f: CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    s: CUstream,
    attrs: &[u8],
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    cbid: u32,
) -> Result<(), CUresult> {
    crate::state::capture::launch_allowed(s)?;
    let target = resolve_stream(s)?;
    // A library's kernel runs on the stream's device (the current one for the default
    // stream), loaded there if it is not yet.
    let func = match target {
        Some(st) => crate::state::modules::function_on(f, st.dev)?,
        None => crate::state::modules::function_here(f)?,
    };
    let f = func as *const Function as CUfunction;
    check_config(func, grid, block, shared)?;
    check_attrs(f, func, grid, block, shared, attrs)?;
    let stream = match target {
        Some(st) if st.dev != func.dev => return Err(CUDA_ERROR_INVALID_HANDLE),
        Some(st) => st.id,
        None => wire::STREAM_DEFAULT,
    };
    let num_attrs = (attrs.len() / wire::LAUNCH_ATTR_BYTES) as u32;
    let hdr = Launch {
        func: func.id,
        stream,
        grid,
        block,
        shared_mem: shared,
        args_len: func.args_size as u32,
        num_attrs,
        _pad: 0,
    };
    // Packed before anything is queued, so a bad argument list queues nothing.
    ARGS.with(|a| {
        let mut a = a.borrow_mut();
        a.clear();
        a.resize(func.args_size, 0);
        // SAFETY: the caller's params/extra, per cuLaunchKernel's contract.
        unsafe { pack_args(func, params, extra, &mut a) }?;
        let work = || Work::Kernel {
            func,
            grid,
            block,
            dynamic_shared: shared,
            cbid,
        };
        profile::around(s, func.dev, work, || {
            live()?.push(func.dev, Op::Launch, &[bytemuck::bytes_of(&hdr), attrs, &a])
        })
    })?;
    // SAFETY: a live function's module is a leaked box, never freed.
    if unsafe { (*func.module).prints } {
        crate::printf::note_launch(func.dev, stream);
    }
    Ok(())
}

/// # Safety
/// Arguments follow cuLaunchKernel's contract.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    s: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe {
        launch(
            f,
            [gx, gy, gz],
            [bx, by, bz],
            shared,
            s,
            &[],
            params,
            extra,
            profile::CBID_LAUNCH_KERNEL,
        )
    })
}

/// Launch attributes are forwarded to the server's cuLaunchKernelEx; those that carry
/// handles (events, graph nodes) are refused with CUDA_ERROR_NOT_SUPPORTED, not dropped.
///
/// # Safety
/// Arguments follow cuLaunchKernelEx's contract.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's config.
        let (c, attrs) = unsafe { config_parts(config) }?;
        // SAFETY: forwarded contract.
        unsafe {
            launch(
                f,
                c.grid,
                c.block,
                c.shared_mem,
                c.stream,
                attrs,
                params,
                extra,
                profile::CBID_LAUNCH_KERNEL_EX,
            )
        }
    })
}

/// # Safety
/// Arguments follow cuLaunchCooperativeKernel's contract.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    s: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    const COOPERATIVE: u32 = 2;
    let mut attr = [0u8; wire::LAUNCH_ATTR_BYTES];
    attr[..4].copy_from_slice(&COOPERATIVE.to_le_bytes());
    attr[8..12].copy_from_slice(&1u32.to_le_bytes());
    // SAFETY: forwarded contract.
    entry(|| unsafe {
        launch(
            f,
            [gx, gy, gz],
            [bx, by, bz],
            shared,
            s,
            &attr,
            params,
            std::ptr::null_mut(),
            profile::CBID_LAUNCH_COOPERATIVE_KERNEL,
        )
    })
}
