//! Context-local storage, which the CUDA runtime keeps through an export table
//! (dark/tables.rs): values stored per context and key, and their destructors, run when
//! a primary context is reset (api/ctx.rs). `get` runs on every runtime call, so a thread
//! caches its last answer until a put or delete changes the generation.

use crate::cuda::*;
use crate::state::ctx::current_ctx;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

type Dtor = Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void)>;

struct Slot {
    ctx: usize,
    key: usize,
    value: usize,
    dtor: Dtor,
}

static STORE: RwLock<Vec<Slot>> = RwLock::new(Vec::new());
static GENERATION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// (generation, ctx, key, value) of this thread's last successful get.
    static LAST_GET: std::cell::Cell<(u64, usize, usize, usize)> = const { std::cell::Cell::new((0, 0, 0, 0)) };
}

pub(crate) fn ctx_or_current(ctx: *mut c_void) -> Result<usize, CUresult> {
    let c = if ctx.is_null() { current_ctx() } else { ctx };
    if c.is_null() {
        Err(CUDA_ERROR_INVALID_CONTEXT)
    } else {
        Ok(c as usize)
    }
}

pub(crate) unsafe extern "C" fn cls_put(
    ctx: *mut c_void,
    key: *mut c_void,
    value: *mut c_void,
    dtor: Dtor,
) -> CUresult {
    let ctx = match ctx_or_current(ctx) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let mut s = STORE.write().unwrap_or_else(|e| e.into_inner());
    match s.iter_mut().find(|x| x.ctx == ctx && x.key == key as usize) {
        Some(x) => {
            x.value = value as usize;
            x.dtor = dtor;
        }
        None => s.push(Slot {
            ctx,
            key: key as usize,
            value: value as usize,
            dtor,
        }),
    }
    GENERATION.fetch_add(1, Ordering::Release);
    CUDA_SUCCESS
}

pub(crate) unsafe extern "C" fn cls_delete(ctx: *mut c_void, key: *mut c_void) -> CUresult {
    let ctx = match ctx_or_current(ctx) {
        Ok(c) => c,
        Err(e) => return e,
    };
    STORE
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|x| !(x.ctx == ctx && x.key == key as usize));
    GENERATION.fetch_add(1, Ordering::Release);
    CUDA_SUCCESS
}

pub(crate) unsafe extern "C" fn cls_get(
    value: *mut *mut c_void,
    ctx: *mut c_void,
    key: *mut c_void,
) -> CUresult {
    let ctx = match ctx_or_current(ctx) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let gen = GENERATION.load(Ordering::Acquire);
    let (g, c, k, v) = LAST_GET.get();
    let found = if g == gen && c == ctx && k == key as usize {
        Some(v)
    } else {
        let s = STORE.read().unwrap_or_else(|e| e.into_inner());
        let v = s
            .iter()
            .find(|x| x.ctx == ctx && x.key == key as usize)
            .map(|x| x.value);
        if let Some(v) = v {
            LAST_GET.set((gen, ctx, key as usize, v));
        }
        v
    };
    match found {
        Some(v) if !value.is_null() => {
            // SAFETY: cudart's out-pointer, checked non-null.
            unsafe { value.write(v as *mut c_void) };
            CUDA_SUCCESS
        }
        Some(_) => CUDA_ERROR_INVALID_VALUE,
        None => CUDA_ERROR_INVALID_HANDLE,
    }
}

/// Runs the destructors of everything stored for `ctx` (its primary context was reset).
pub(crate) fn cls_reset(ctx: *mut c_void) {
    let gone: Vec<Slot> = {
        let mut s = STORE.write().unwrap_or_else(|e| e.into_inner());
        let (gone, keep) = std::mem::take(&mut *s)
            .into_iter()
            .partition(|x| x.ctx == ctx as usize);
        *s = keep;
        gone
    };
    GENERATION.fetch_add(1, Ordering::Release);
    for x in gone {
        if let Some(d) = x.dtor {
            // SAFETY: the destructor and arguments cudart stored with cls_put.
            unsafe {
                d(
                    x.ctx as *mut c_void,
                    x.key as *mut c_void,
                    x.value as *mut c_void,
                )
            };
        }
    }
}
