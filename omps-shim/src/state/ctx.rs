//! The client's contexts, which are bookkeeping only: all of a client's work on a GPU runs
//! in the server's one context for that GPU. Here are CUDA's per-thread context stack, the
//! primary contexts and their reference counts, and the calls every family makes on them
//! (the current device, a device-wide synchronization).

use super::device::device;
use super::entry::{entry, live, out};
use crate::cuda::*;
use crate::handles::{leak, resolve, Ctx, CTX_MAGIC};
use omps_ring::segment::MAX_DEVICES;
use omps_ring::wire::{CallHdr, Op};
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

pub type CUcontext = *mut Ctx;

thread_local! {
    static STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

pub(crate) struct Primary {
    pub(crate) ctx: &'static Ctx,
    pub(crate) refs: AtomicU32,
    pub(crate) flags: AtomicU32,
}

pub(crate) fn primaries() -> &'static [Primary] {
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

pub(crate) fn primary(dev: CUdevice) -> Result<&'static Primary, CUresult> {
    device(dev)?;
    Ok(&primaries()[dev as usize])
}

/// The context most recently made current by any thread. Static destructors run after
/// the thread's locals are gone (glibc's exit runs TLS destructors first), and libraries
/// such as cuBLAS still call the driver from them: they get this context, as a driver that
/// keeps its own thread state would still answer.
static LAST_CURRENT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub(crate) fn current() -> Option<CUcontext> {
    STACK
        .try_with(|s| s.borrow().last().map(|&p| p as CUcontext))
        .unwrap_or_else(|_| {
            let c = LAST_CURRENT.load(std::sync::atomic::Ordering::Relaxed);
            (c != 0).then_some(c as CUcontext)
        })
}

/// Changes this thread's context stack; after its locals are gone, only the fallback.
pub(crate) fn with_stack(f: impl FnOnce(&mut Vec<usize>)) {
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

pub(crate) fn set_top(c: Option<CUcontext>) {
    with_stack(|s| {
        s.pop();
        if let Some(c) = c {
            s.push(c as usize);
        }
    });
}

/// # Safety
/// `pctx` is null or writable.
pub(crate) unsafe fn primary_retain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    entry(|| {
        let p = primary(dev)?;
        p.refs.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's pointer.
        unsafe { out(pctx, p.ctx as *const Ctx as CUcontext) }
    })
}

pub(crate) fn release_primary(dev: CUdevice) -> Result<(), CUresult> {
    let p = primary(dev)?;
    p.refs
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1))
        .map(drop)
        .map_err(|_| CUDA_ERROR_INVALID_CONTEXT)
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
pub(crate) unsafe fn push_current(ctx: CUcontext) -> CUresult {
    entry(|| {
        // SAFETY: the caller's handle.
        unsafe { resolve(ctx, CTX_MAGIC) }.map_err(|_| CUDA_ERROR_INVALID_CONTEXT)?;
        with_stack(|s| s.push(ctx as usize));
        Ok(())
    })
}

/// # Safety
/// `pctx` is null or writable.
pub(crate) unsafe fn pop_current(pctx: *mut CUcontext) -> CUresult {
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
pub(crate) fn ctx_or_current(ctx: CUcontext) -> Result<&'static Ctx, CUresult> {
    let c = if ctx.is_null() {
        current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?
    } else {
        ctx
    };
    // SAFETY: a handle from this shim, as the API requires.
    unsafe { resolve(c, CTX_MAGIC) }.map_err(|_| CUDA_ERROR_INVALID_CONTEXT)
}

/// # Safety
/// `id` is null or writable.
pub(crate) unsafe fn ctx_id(ctx: CUcontext, id: *mut u64) -> CUresult {
    // SAFETY: the caller's pointer; a context's id is its handle's address, unique for life.
    entry(|| unsafe { out(id, ctx_or_current(ctx)? as *const Ctx as u64) })
}
