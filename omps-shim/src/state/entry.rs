//! How an entry point runs: `entry` turns a body's `Result` into a CUresult and keeps
//! panics from unwinding into C, `live` is the connection once cuInit has run, and `out`
//! writes through a caller's out-pointer. Every API family wraps its bodies in these.

use super::host_mirror;
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
    // around every call (state/host_mirror.rs).
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
