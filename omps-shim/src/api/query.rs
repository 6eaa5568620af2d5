//! Questions only the server's driver can answer: occupancy, context limits, a function's
//! cache preference. Each is one round trip, except a stable question asked before.

use crate::cuda::*;
use crate::state::answers::*;
use crate::state::ctx::current_dev;
use crate::state::entry::{entry, out};
use crate::state::launch::{config_parts, LaunchConfig};
use crate::state::streams::CUfunction;
use omps_ring::wire::query;
use std::ffi::{c_int, c_uint};

/// # Safety
/// `n` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    n: *mut c_int,
    f: CUfunction,
    block: c_int,
    smem: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(n, occupancy(f, block, smem, flags)? as c_int) })
}

/// # Safety
/// `n` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut c_int,
    f: CUfunction,
    block: c_int,
    smem: usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, f, block, smem, 0) }
}

/// # Safety
/// `size` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    size: *mut usize,
    f: CUfunction,
    blocks: c_int,
    block: c_int,
) -> CUresult {
    entry(|| {
        let func = crate::state::modules::function_here(f)?;
        let v = ask(
            func.dev,
            query::OCC_DYN_SMEM,
            func.id,
            [blocks as i64, block as i64, 0, 0, 0, 0, 0],
            &[],
        )?;
        // SAFETY: the caller's pointer.
        unsafe { out(size, v as usize) }
    })
}

type SmemForBlock = Option<unsafe extern "C" fn(c_int) -> usize>;

/// The block size with the highest occupancy, computed here from the server's occupancy
/// answers, since the callback lives in this process.
///
/// # Safety
/// `min_grid` and `block` are null or writable; `cb`, if given, is callable.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: CUfunction,
    cb: SmemForBlock,
    smem: usize,
    limit: c_int,
    flags: c_uint,
) -> CUresult {
    entry(|| {
        let func = crate::state::modules::function_here(f)?;
        let d = crate::state::device::device(func.dev as CUdevice)?;
        const WARP_SIZE: usize = 10;
        const MULTIPROCESSOR_COUNT: usize = 16;
        let warp = d.attribute(WARP_SIZE).unwrap_or(32).max(1);
        let mut max = func.max_threads_per_block;
        if limit > 0 {
            max = max.min(limit);
        }
        let (mut best, mut best_bs, mut best_blocks) = (0i64, 0, 0i64);
        let mut bs = max - max % warp;
        while bs > 0 {
            // SAFETY: the caller's callback.
            let s = cb.map_or(smem, |cb| unsafe { cb(bs) });
            let blocks = occupancy(f, bs, s, flags)?;
            if blocks * bs as i64 > best {
                (best, best_bs, best_blocks) = (blocks * bs as i64, bs, blocks);
            }
            bs -= warp;
        }
        let sms = d.attribute(MULTIPROCESSOR_COUNT).unwrap_or(1) as i64;
        // SAFETY: the caller's pointers.
        unsafe {
            out(min_grid, (best_blocks * sms) as c_int)?;
            out(block, best_bs)
        }
    })
}

/// # Safety
/// As cuOccupancyMaxPotentialBlockSizeWithFlags.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialBlockSize(
    min_grid: *mut c_int,
    block: *mut c_int,
    f: CUfunction,
    cb: SmemForBlock,
    smem: usize,
    limit: c_int,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block, f, cb, smem, limit, 0) }
}

/// # Safety
/// `config` is a valid launch configuration.
unsafe fn cluster_query(
    kind: u32,
    f: CUfunction,
    config: *const LaunchConfig,
) -> Result<i64, CUresult> {
    let func = crate::state::modules::function_here(f)?;
    // SAFETY: the caller's config.
    let (c, attrs) = unsafe { config_parts(config) }?;
    let g = |x: c_uint| x as i64;
    let args = [
        g(c.grid[0]),
        g(c.grid[1]),
        g(c.grid[2]),
        g(c.block[0]),
        g(c.block[1]),
        g(c.block[2]),
        g(c.shared_mem),
    ];
    ask(func.dev, kind, func.id, args, attrs)
}

/// # Safety
/// `n` is null or writable; `config` is a valid launch configuration.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveClusters(
    n: *mut c_int,
    f: CUfunction,
    config: *const LaunchConfig,
) -> CUresult {
    // SAFETY: the caller's pointers.
    entry(|| unsafe {
        out(
            n,
            cluster_query(query::OCC_MAX_CLUSTERS, f, config)? as c_int,
        )
    })
}

/// # Safety
/// `n` is null or writable; `config` is a valid launch configuration.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxPotentialClusterSize(
    n: *mut c_int,
    f: CUfunction,
    config: *const LaunchConfig,
) -> CUresult {
    // SAFETY: the caller's pointers.
    entry(|| unsafe {
        out(
            n,
            cluster_query(query::OCC_MAX_CLUSTER_SIZE, f, config)? as c_int,
        )
    })
}

/// Limits belong to the server's context, which every client of the GPU shares, as
/// under MPS.
///
/// # Safety
/// `v` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetLimit(v: *mut usize, limit: c_int) -> CUresult {
    entry(|| {
        let x = ask(
            current_dev()?,
            query::CTX_GET_LIMIT,
            0,
            [limit as i64, 0, 0, 0, 0, 0, 0],
            &[],
        )?;
        // SAFETY: the caller's pointer.
        unsafe { out(v, x as usize) }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    entry(|| {
        ask(
            current_dev()?,
            query::CTX_SET_LIMIT,
            0,
            [limit as i64, value as i64, 0, 0, 0, 0, 0],
            &[],
        )
        .map(drop)
    })
}

/// Persisting L2 lines go back to normal. The server's context does it: the lines are
/// the GPU's L2, which every client of the GPU shares (under MPS too), and the reset
/// changes only what stays cached, never what a kernel reads.
#[no_mangle]
pub extern "C" fn cuCtxResetPersistingL2Cache() -> CUresult {
    entry(|| {
        ask(
            current_dev()?,
            query::CTX_RESET_PERSISTING_L2,
            0,
            [0; 7],
            &[],
        )
        .map(drop)
    })
}

#[no_mangle]
pub extern "C" fn cuFuncSetCacheConfig(f: CUfunction, config: c_int) -> CUresult {
    entry(|| {
        let func = crate::state::modules::function_here(f)?;
        forget_answers();
        // The cache preference and the shared memory carveout are two views of one setting.
        const PREFERRED_SHARED_MEMORY_CARVEOUT: c_int = 9;
        func.attrs.forget(PREFERRED_SHARED_MEMORY_CARVEOUT);
        ask(
            func.dev,
            query::FUNC_CACHE_CONFIG,
            func.id,
            [config as i64, 0, 0, 0, 0, 0, 0],
            &[],
        )
        .map(drop)
    })
}

#[no_mangle]
pub extern "C" fn cuKernelSetCacheConfig(k: CUfunction, config: c_int, _dev: CUdevice) -> CUresult {
    cuFuncSetCacheConfig(k, config)
}
