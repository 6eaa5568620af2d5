//! Contexts are bookkeeping in the client: all of a client's work on a GPU runs in the
//! server's one context for that GPU. The shim keeps CUDA's per-thread context stack and
//! the primary contexts' reference counts so programs see the behaviour they expect.

use crate::cuda::*;
use crate::handles::{resolve, retire, Ctx, CTX_MAGIC};
use crate::state::ctx::{
    self, create, ctx_or_current, current, current_dev, primaries, primary, release_primary,
    set_top, sync_device, with_stack,
};
use crate::state::device::device;
use crate::state::entry::{entry, live, out};
use std::ffi::c_void;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::Ordering;

/// The handle types of this family, named where the program sees them.
pub use crate::state::ctx::CUcontext;

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    entry(|| release_primary(dev))
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    entry(|| {
        let p = primary(dev)?;
        // Resetting tears down the context's work and memory; the server keeps the GPU's
        // context, so wait for this client's work and forget the reference count.
        sync_device(dev as usize)?;
        p.refs.store(0, Ordering::Relaxed);
        crate::state::cls::cls_reset(p.ctx as *const Ctx as *mut c_void);
        Ok(())
    })
}

/// # Safety
/// `flags` and `active` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    entry(|| {
        let p = primary(dev)?;
        // SAFETY: the caller's pointers.
        unsafe {
            out(flags, p.flags.load(Ordering::Relaxed))?;
            out(active, c_int::from(p.refs.load(Ordering::Relaxed) > 0))
        }
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    entry(|| {
        primary(dev)?.flags.store(flags, Ordering::Relaxed);
        Ok(())
    })
}

/// # Safety
/// `pctx` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry(|| create(pctx, dev))
}

/// # Safety
/// `ctx` is a context handle from this shim.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    entry(|| {
        // SAFETY: the caller's handle.
        let c = unsafe { resolve(ctx, CTX_MAGIC) }.map_err(|_| CUDA_ERROR_INVALID_CONTEXT)?;
        if c.primary {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        // Destroying a context waits for its work, as the driver does.
        sync_device(c.dev)?;
        retire(&c.magic, CTX_MAGIC)?;
        with_stack(|s| s.retain(|&p| p != ctx as usize));
        Ok(())
    })
}

/// # Safety
/// `ctx` is null or a context handle from this shim.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    entry(|| {
        if ctx.is_null() {
            set_top(None);
            return Ok(());
        }
        // SAFETY: the caller's handle.
        unsafe { resolve(ctx, CTX_MAGIC) }.map_err(|_| CUDA_ERROR_INVALID_CONTEXT)?;
        set_top(Some(ctx));
        Ok(())
    })
}

/// # Safety
/// `pctx` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    entry(|| {
        live()?;
        // SAFETY: the caller's pointer.
        unsafe { out(pctx, current().unwrap_or(std::ptr::null_mut())) }
    })
}

/// # Safety
/// `d` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(d: *mut CUdevice) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(d, current_dev()? as CUdevice) })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    crate::state::profile::waiting(crate::state::profile::Wait::Context, || {
        entry(|| sync_device(current_dev()?))
    })
}

/// # Safety
/// `least` and `greatest` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    entry(|| {
        let [l, g] = device(current_dev()? as CUdevice)?.stream_priority;
        // SAFETY: the caller's pointers; either may be null.
        unsafe {
            if !least.is_null() {
                least.write(l);
            }
            if !greatest.is_null() {
                greatest.write(g);
            }
        }
        Ok(())
    })
}

/// # Safety
/// `d` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice_v2(d: *mut CUdevice, ctx: CUcontext) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(d, ctx_or_current(ctx)?.dev as CUdevice) })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    // CUDA 13's cudaDeviceSynchronize comes here: a profiler records its wait too.
    crate::state::profile::waiting(crate::state::profile::Wait::Context, || {
        entry(|| sync_device(ctx_or_current(ctx)?.dev))
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    cuDevicePrimaryCtxRelease_v2(dev)
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    cuDevicePrimaryCtxReset_v2(dev)
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) -> CUresult {
    cuDevicePrimaryCtxSetFlags_v2(dev, flags)
}

/// # Safety
/// `flags` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    entry(|| {
        let c = ctx_or_current(std::ptr::null_mut())?;
        // Host memory is always mappable under unified addressing: CU_CTX_MAP_HOST is set.
        const MAP_HOST: c_uint = 0x08;
        let f = MAP_HOST
            | if c.primary {
                primaries()[c.dev].flags.load(Ordering::Relaxed)
            } else {
                0
            };
        // SAFETY: the caller's pointer.
        unsafe { out(flags, f) }
    })
}

/// # Safety
/// `v` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: CUcontext, v: *mut c_uint) -> CUresult {
    entry(|| {
        ctx_or_current(ctx)?;
        // SAFETY: the caller's pointer. Contexts are created at the 3.2+ ABI.
        unsafe { out(v, 3020) }
    })
}

/// The CUDA 3.x names of the context calls, from before `_v2`; the same contract.
///
/// # Safety
/// As [`cuCtxCreate_v2`].
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuCtxCreate_v2(pctx, flags, dev) }
}

/// # Safety
/// As [`cuCtxDestroy_v2`].
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuCtxDestroy_v2(ctx) }
}

/// # Safety
/// As [`cuCtxPushCurrent_v2`].
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent(ctx: CUcontext) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuCtxPushCurrent_v2(ctx) }
}

/// # Safety
/// As [`cuCtxPopCurrent_v2`].
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent(pctx: *mut CUcontext) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuCtxPopCurrent_v2(pctx) }
}

/// # Safety
/// `pctx` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { ctx::primary_retain(pctx, dev) }
}

/// # Safety
/// `ctx` is a context handle from this shim.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { ctx::push_current(ctx) }
}

/// # Safety
/// `pctx` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { ctx::pop_current(pctx) }
}

/// # Safety
/// `id` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetId(ctx: CUcontext, id: *mut u64) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { ctx::ctx_id(ctx, id) }
}
