//! Green contexts. A client's green context is a shim context (as cuCtxCreate's) marked
//! with its SM count; the server confines the work of its streams (those made while it is
//! current, by cuGreenCtxStreamCreate, and its own legacy default stream) to the
//! confinement slot of that many SMs, rounded up to whole chunks and never wider than the
//! client's own share (omps-server/src/session/green.rs). The resources it is made of are
//! answered in the shim (api/green_res.rs).
//!
//! Its legacy default stream is a stream of its own: stream 0 while its context is current
//! names it, and it orders against the green context's blocking streams only, as a
//! context's NULL stream does natively (not against the primary context's).

use super::green_res::{answer, share, ResourceDesc, DESC_MAGIC};
use crate::cuda::*;
use crate::handles::{leak, next_id, resolve, retire, Ctx, Stream, CTX_MAGIC, STREAM_MAGIC};
use crate::state::entry::{entry, live, out};
use crate::state::green::*;
use crate::state::streams::{event, resolve_stream, CUevent, CUstream};
use omps_ring::wire::{self, EventCreate, EventRecord, Handle, Op};
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

const CU_GREEN_CTX_DEFAULT_STREAM: c_uint = 1;
const NON_BLOCKING: c_uint = 1;

fn green(g: *mut GreenCtx) -> Result<&'static GreenCtx, CUresult> {
    // SAFETY: a handle from this shim, as the API requires.
    unsafe { resolve(g as *const GreenCtx, GREEN_MAGIC) }.map_err(|_| CUDA_ERROR_INVALID_CONTEXT)
}

/// # Safety
/// `ph` is null or writable; `desc` is null or a descriptor from this shim.
#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxCreate(
    ph: *mut *mut GreenCtx,
    desc: *mut ResourceDesc,
    dev: CUdevice,
    flags: c_uint,
) -> CUresult {
    static IDS: AtomicU32 = AtomicU32::new(1);
    static UIDS: AtomicU64 = AtomicU64::new(1);
    entry(|| {
        if ph.is_null() || flags != CU_GREEN_CTX_DEFAULT_STREAM {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::state::device::device(dev)?;
        // SAFETY: a descriptor from this shim, as the API requires.
        let d = unsafe { resolve(desc as *const ResourceDesc, DESC_MAGIC) }
            .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if d.dev != dev as usize {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        let dev = dev as usize;
        super::green_res::granularity(dev)?.ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
        let (id, legacy) = (IDS.fetch_add(1, Ordering::Relaxed), next_id());
        let c = live()?;
        c.streams.take()?;
        let rec = wire::GreenCall {
            kind: wire::green::CREATE,
            green: id,
            sms: d.sms,
            stream: legacy,
            ..Default::default()
        };
        if let Err(e) = call(dev, rec) {
            c.streams.give_back();
            return Err(e);
        }
        // The driver retains the primary context for the green context's life.
        let mut primary = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { crate::state::ctx::primary_retain(&mut primary, dev as CUdevice) };
        // SAFETY: freshly leaked, never freed.
        let ctx = unsafe {
            &*leak(Ctx {
                magic: AtomicU32::new(CTX_MAGIC),
                dev,
                primary: false,
            })
        };
        // SAFETY: freshly leaked, never freed.
        let g: &'static GreenCtx = unsafe {
            &*leak(GreenCtx {
                magic: AtomicU32::new(GREEN_MAGIC),
                id,
                dev,
                sms: d.sms,
                ctx,
                legacy: new_handle(legacy, dev, 0, 0),
                uid: UIDS.fetch_add(1, Ordering::Relaxed),
                streams: Mutex::new(Vec::new()),
                join: Mutex::new(None),
            })
        };
        GREENS.write().unwrap_or_else(|e| e.into_inner()).push(g);
        ANY.store(true, Ordering::Release);
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(ph, g as *const GreenCtx as *mut GreenCtx) }
    })
}

/// # Safety
/// `g` is a green context handle from this shim.
#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxDestroy(g: *mut GreenCtx) -> CUresult {
    entry(|| {
        let gc = green(g)?;
        retire(&gc.magic, GREEN_MAGIC).map_err(|_| CUDA_ERROR_INVALID_CONTEXT)?;
        GREENS
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|x| !std::ptr::eq(*x, gc));
        let c = live()?;
        // The server destroys every stream made in it; the program's handles of them are
        // detached (only cuStreamDestroy takes them, as the driver has it).
        let r = call(
            gc.dev,
            wire::GreenCall {
                kind: wire::green::DESTROY,
                green: gc.id,
                ..Default::default()
            },
        );
        c.streams.give_back();
        if gc.join.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            c.streams.give_back();
        }
        for s in gc.streams.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            if s.magic
                .compare_exchange(
                    STREAM_MAGIC,
                    DETACHED_MAGIC,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                c.streams.give_back();
            }
        }
        let _ = retire(&gc.ctx.magic, CTX_MAGIC);
        crate::state::entry::entry(|| crate::state::ctx::release_primary(gc.dev as CUdevice));
        r
    })
}

/// # Safety
/// `pctx` is null or writable; `g` is a green context handle from this shim.
#[no_mangle]
pub unsafe extern "C" fn cuCtxFromGreenCtx(pctx: *mut *mut Ctx, g: *mut GreenCtx) -> CUresult {
    entry(|| {
        let gc = green(g)?;
        // SAFETY: the caller's pointer.
        unsafe { out(pctx, gc.ctx as *const Ctx as *mut Ctx) }
    })
}

/// # Safety
/// `ph` is null or writable; `g` is a green context handle from this shim.
#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxStreamCreate(
    ph: *mut CUstream,
    g: *mut GreenCtx,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    entry(|| {
        let gc = green(g)?;
        if ph.is_null() || flags != NON_BLOCKING {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = make_stream(gc, flags, priority)?;
        gc.streams.lock().unwrap_or_else(|e| e.into_inner()).push(s);
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(ph, s as *const Stream as CUstream) }
    })
}

/// # Safety
/// `res` is null or writable for a CUdevResource; `g` a green context handle.
#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxGetDevResource(
    g: *mut GreenCtx,
    res: *mut super::green_res::CUdevResource,
    ty: c_int,
) -> CUresult {
    entry(|| {
        let gc = green(g)?;
        // SAFETY: forwarded contract.
        unsafe { answer(res, ty, gc.dev, gc.sms) }
    })
}

/// # Safety
/// `res` is null or writable for a CUdevResource; `ctx` a context handle.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevResource(
    ctx: *mut Ctx,
    res: *mut super::green_res::CUdevResource,
    ty: c_int,
) -> CUresult {
    entry(|| {
        // SAFETY: a handle from this shim, as the API requires.
        let c = unsafe { resolve(ctx as *const Ctx, CTX_MAGIC) }
            .map_err(|_| CUDA_ERROR_INVALID_CONTEXT)?;
        let sms = match green_of_ctx(c) {
            Some(g) => g.sms,
            None => share(c.dev)?,
        };
        // SAFETY: forwarded contract.
        unsafe { answer(res, ty, c.dev, sms) }
    })
}

/// # Safety
/// `pg` is null or writable; `s` a stream handle.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetGreenCtx(s: CUstream, pg: *mut *mut GreenCtx) -> CUresult {
    entry(|| {
        let g = resolve_stream(s)?
            .and_then(green_of_stream)
            .map_or(std::ptr::null_mut(), |g| {
                g as *const GreenCtx as *mut GreenCtx
            });
        // SAFETY: the caller's pointer.
        unsafe { out(pg, g) }
    })
}

/// # Safety
/// `id` is null or writable; `g` null or a green context handle.
#[no_mangle]
pub unsafe extern "C" fn cuGreenCtxGetId(g: *mut GreenCtx, id: *mut u64) -> CUresult {
    entry(|| {
        let gc = if g.is_null() {
            current_green().ok_or(CUDA_ERROR_INVALID_CONTEXT)?
        } else {
            green(g)?
        };
        // SAFETY: the caller's pointer.
        unsafe { out(id, gc.uid) }
    })
}

/// Every stream of `g` still live, its legacy stream first.
fn streams_of(g: &GreenCtx) -> Vec<u32> {
    let mut v = vec![g.legacy.id];
    v.extend(
        g.streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|s| s.magic.load(Ordering::Acquire) == STREAM_MAGIC)
            .map(|s| s.id),
    );
    v
}

/// Records `e` after all work queued so far in green context `g`: each of its streams'
/// work is joined in a stream of its own (so that none of them waits for another, which
/// they would natively not), and `e` recorded there.
#[no_mangle]
pub extern "C" fn cuGreenCtxRecordEvent(g: *mut GreenCtx, e: CUevent) -> CUresult {
    entry(|| {
        let gc = green(g)?;
        let ev = event(e)?;
        if ev.dev != gc.dev {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let c = live()?;
        let join = {
            let mut j = gc.join.lock().unwrap_or_else(|e| e.into_inner());
            match *j {
                Some(id) => id,
                None => {
                    let id = next_id();
                    c.streams.take()?;
                    let rec = wire::GreenCall {
                        kind: wire::green::STREAM,
                        green: gc.id,
                        stream: id,
                        flags: NON_BLOCKING,
                        ..Default::default()
                    };
                    if let Err(e) = call(gc.dev, rec) {
                        c.streams.give_back();
                        return Err(e);
                    }
                    *j.insert(id)
                }
            }
        };
        // A timing-free event per stream, destroyed once waited for (the server defers a
        // recorded event's release until it completes, as the driver does).
        const DISABLE_TIMING: u32 = 2;
        for s in streams_of(gc) {
            let tmp = next_id();
            c.events.take()?;
            let r = EventRecord {
                event: tmp,
                stream: s,
            };
            let w = EventRecord {
                event: tmp,
                stream: join,
            };
            let created = EventCreate {
                id: tmp,
                flags: DISABLE_TIMING,
            };
            c.push(gc.dev, Op::EventCreate, &[bytemuck::bytes_of(&created)])
                .and_then(|_| c.push(gc.dev, Op::EventRecord, &[bytemuck::bytes_of(&r)]))
                .and_then(|_| c.push(gc.dev, Op::StreamWaitEvent, &[bytemuck::bytes_of(&w)]))
                .and_then(|_| {
                    c.push(
                        gc.dev,
                        Op::EventDestroy,
                        &[bytemuck::bytes_of(&Handle { id: tmp, _pad: 0 })],
                    )
                })?;
            c.events.give_back();
        }
        let r = EventRecord {
            event: ev.id,
            stream: join,
        };
        c.push(gc.dev, Op::EventRecord, &[bytemuck::bytes_of(&r)])
    })
}

/// Makes later work of green context `g` wait for `e`: every stream of it waits (as
/// cuStreamWaitEvent, so an event of another device works as it does there).
#[no_mangle]
pub extern "C" fn cuGreenCtxWaitEvent(g: *mut GreenCtx, e: CUevent) -> CUresult {
    entry(|| {
        let gc = green(g)?;
        event(e)?;
        let mut all = vec![gc.legacy];
        all.extend(gc.streams.lock().unwrap_or_else(|e| e.into_inner()).iter());
        for s in all {
            if s.magic.load(Ordering::Acquire) != STREAM_MAGIC {
                continue;
            }
            let r = super::exec::cuStreamWaitEvent(s as *const Stream as CUstream, e, 0);
            if r != CUDA_SUCCESS {
                return Err(r);
            }
        }
        Ok(())
    })
}
