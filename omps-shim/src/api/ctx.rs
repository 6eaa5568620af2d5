//! Contexts are bookkeeping in the client: all of a client's work on a GPU runs in the
//! server's one context for that GPU. The shim keeps CUDA's per-thread context stack and
//! the primary contexts' reference counts so programs see the behaviour they expect.

use super::device::device;
use crate::state::entry::{entry, live, out};
use crate::cuda::*;
use crate::handles::{leak, resolve, retire, Ctx, CTX_MAGIC};
use omps_ring::segment::MAX_DEVICES;
use omps_ring::wire::{CallHdr, Op};
use std::cell::RefCell;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

pub type CUcontext = *mut Ctx;

thread_local! {
    static STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

struct Primary {
    ctx: &'static Ctx,
    refs: AtomicU32,
    flags: AtomicU32,
}

fn primaries() -> &'static [Primary] {
    static P: OnceLock<Vec<Primary>> = OnceLock::new();
    P.get_or_init(|| {
        (0..MAX_DEVICES)
            .map(|dev| Primary {
                // SAFETY: a freshly leaked box is valid forever.
                ctx: unsafe {
                    &*leak(Ctx {
                        magic: AtomicU32::new(CTX_MAGIC),
                        dev,
                        primary: true,
                    })
                },
                refs: AtomicU32::new(0),
                flags: AtomicU32::new(0),
            })
            .collect()
    })
}

fn primary(dev: CUdevice) -> Result<&'static Primary, CUresult> {
    device(dev)?;
    Ok(&primaries()[dev as usize])
}

/// The context most recently made current by any thread. Static destructors run after
/// the thread's locals are gone (glibc's exit runs TLS destructors first), and libraries
/// such as cuBLAS still call the driver from them: they get this context, as a driver that
/// keeps its own thread state would still answer.
static LAST_CURRENT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn current() -> Option<CUcontext> {
    STACK
        .try_with(|s| s.borrow().last().map(|&p| p as CUcontext))
        .unwrap_or_else(|_| {
            let c = LAST_CURRENT.load(std::sync::atomic::Ordering::Relaxed);
            (c != 0).then_some(c as CUcontext)
        })
}

/// Changes this thread's context stack; after its locals are gone, only the fallback.
fn with_stack(f: impl FnOnce(&mut Vec<usize>)) {
    let _ = STACK.try_with(|s| {
        let mut s = s.borrow_mut();
        f(&mut s);
        if let Some(&top) = s.last() {
            LAST_CURRENT.store(top, std::sync::atomic::Ordering::Relaxed);
        }
    });
}

/// The device of the calling thread's current context.
/// The current context's handle, or CUDA_ERROR_INVALID_CONTEXT.
pub(crate) fn current_ctx_checked() -> Result<CUcontext, CUresult> {
    live()?;
    current().ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

pub(crate) fn current_dev() -> Result<usize, CUresult> {
    live()?;
    let c = current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    // SAFETY: the stack only holds handles this shim made.
    let ctx = unsafe { resolve(c, CTX_MAGIC) }.map_err(|_| CUDA_ERROR_INVALID_CONTEXT)?;
    Ok(ctx.dev)
}

fn set_top(c: Option<CUcontext>) {
    with_stack(|s| {
        s.pop();
        if let Some(c) = c {
            s.push(c as usize);
        }
    });
}

/// # Safety
/// `pctx` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    entry(|| {
        let p = primary(dev)?;
        p.refs.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's pointer.
        unsafe { out(pctx, p.ctx as *const Ctx as CUcontext) }
    })
}

fn release_primary(dev: CUdevice) -> Result<(), CUresult> {
    let p = primary(dev)?;
    p.refs
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1))
        .map(drop)
        .map_err(|_| CUDA_ERROR_INVALID_CONTEXT)
}

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
        crate::dark::cls_reset(p.ctx as *const Ctx as *mut c_void);
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

pub(crate) fn create(pctx: *mut CUcontext, dev: CUdevice) -> Result<(), CUresult> {
    device(dev)?;
    let c = leak(Ctx {
        magic: AtomicU32::new(CTX_MAGIC),
        dev: dev as usize,
        primary: false,
    });
    // SAFETY: the caller's pointer (checked for null by out).
    unsafe { out(pctx, c)? };
    with_stack(|s| s.push(c as usize));
    Ok(())
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
/// `ctx` is a context handle from this shim.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    entry(|| {
        // SAFETY: the caller's handle.
        unsafe { resolve(ctx, CTX_MAGIC) }.map_err(|_| CUDA_ERROR_INVALID_CONTEXT)?;
        with_stack(|s| s.push(ctx as usize));
        Ok(())
    })
}

/// # Safety
/// `pctx` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    entry(|| {
        let c = STACK
            .try_with(|s| s.borrow_mut().pop())
            .ok()
            .flatten()
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if !pctx.is_null() {
            // SAFETY: the caller's pointer, non-null.
            unsafe { pctx.write(c as CUcontext) };
        }
        Ok(())
    })
}

/// # Safety
/// `d` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(d: *mut CUdevice) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(d, current_dev()? as CUdevice) })
}

/// Waits for everything this client queued on `dev`, and reports pending errors.
pub(crate) fn sync_device(dev: usize) -> Result<(), CUresult> {
    let c = live()?;
    let before = crate::printf::before_sync(dev);
    let mut ch = c.channel();
    let r = ch.call(dev, Op::CtxSync, |call: CallHdr| {
        bytemuck::bytes_of(&call).to_vec()
    });
    drop(ch);
    crate::printf::deliver(dev, r.is_err(), crate::printf::Covers::All, before);
    r
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    entry(|| sync_device(current_dev()?))
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

/// The primary context handle of `dev`, for pointer attributes.
pub(crate) fn primary_handle(dev: usize) -> *mut c_void {
    primaries()
        .get(dev)
        .map_or(std::ptr::null_mut(), |p| p.ctx as *const Ctx as *mut c_void)
}

/// The calling thread's current context handle, or null.
pub(crate) fn current_ctx() -> *mut c_void {
    current().map_or(std::ptr::null_mut(), |c| c as *mut c_void)
}

/// The context a call names: `ctx`, or the current one when it is null.
fn ctx_or_current(ctx: CUcontext) -> Result<&'static Ctx, CUresult> {
    let c = if ctx.is_null() {
        current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?
    } else {
        ctx
    };
    // SAFETY: a handle from this shim, as the API requires.
    unsafe { resolve(c, CTX_MAGIC) }.map_err(|_| CUDA_ERROR_INVALID_CONTEXT)
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
    entry(|| sync_device(ctx_or_current(ctx)?.dev))
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
/// `id` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetId(ctx: CUcontext, id: *mut u64) -> CUresult {
    // SAFETY: the caller's pointer; a context's id is its handle's address, unique for life.
    entry(|| unsafe { out(id, ctx_or_current(ctx)? as *const Ctx as u64) })
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
