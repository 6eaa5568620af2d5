//! The exported driver entry points. Each is a thin `extern "C"` wrapper that turns a
//! `Result` into a CUresult and keeps panics from unwinding into C.

pub mod array;
pub mod capture;
pub mod ctx;
pub mod ctx_params;
pub mod device;
pub mod exec;
pub mod graph;
pub mod graph_build;
pub mod graph_mem;
pub mod green;
pub mod green_res;
pub mod host_mirror;
pub mod hostmem;
pub mod ipc;
pub mod link;
pub mod managed;
pub mod mem;
pub mod module;
pub mod peer;
pub mod pool;
pub mod pool_share;
pub mod proc;
pub mod ptds;
pub mod query;
pub mod staged;
pub mod stream_info;
pub mod tensor_map;
pub mod user_object;
pub mod vmm;
pub mod vmm_share;

use crate::cuda::*;
use std::sync::atomic::{AtomicBool, Ordering};

static INITIALIZED: AtomicBool = AtomicBool::new(false);

pub(crate) fn mark_initialized() {
    INITIALIZED.store(true, Ordering::Release);
}

/// Runs an entry point's body: Ok becomes CUDA_SUCCESS, a panic CUDA_ERROR_UNKNOWN.
/// Under OMPS_TRACE every error is named with the entry point's source line, which is how
/// a library's vague "internal error" is traced back to the call that failed.
#[track_caller]
pub(crate) fn entry(f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    // Registered pieces the server cannot map: the GPU's writes and the program's meet
    // around every call (api/host_mirror.rs).
    if host_mirror::any() {
        host_mirror::merge_all();
    }
    let r = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => 999,
    };
    if host_mirror::any() {
        host_mirror::merge_all();
    }
    if r != CUDA_SUCCESS && crate::trace_enabled() {
        let at = std::panic::Location::caller();
        eprintln!("omps trace: {}:{} returned {r}", at.file(), at.line());
    }
    r
}

/// The connection, once cuInit has run.
pub(crate) fn live() -> Result<&'static crate::conn::Conn, CUresult> {
    if !INITIALIZED.load(Ordering::Acquire) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    crate::conn::conn()
}

/// Writes through an out-pointer the caller gave, refusing null.
///
/// # Safety
/// `p` is null or valid for a write of T.
pub(crate) unsafe fn out<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and, per the caller, valid for writes.
    unsafe { p.write(v) };
    Ok(())
}
