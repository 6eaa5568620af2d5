//! The image verifier child's loads, links and JIT compiles (crate::image::verifier):
//! run in a process of their own on a GPU's primary context, as the server would run them.

use super::device::init;
use super::modules::{link_here, load_jit_here};
use cudarc::driver::sys as cu;
use std::ffi::{c_int, c_void};

/// The image verifier's load (crate::image::verifier, in its own process): `image` loaded on GPU
/// `ordinal` in that GPU's primary context, then unloaded; the CUresult, or
/// [`crate::image::verifier::NO_CONTEXT`] when the GPU cannot be opened.
pub fn verify_load(ordinal: usize, image: &[u8]) -> i32 {
    if let Err(e) = verify_context(ordinal) {
        return e;
    }
    let mut m = std::ptr::null_mut();
    // SAFETY: the current context is one this process retained; the image is this
    // process's copy, whole per check_image (the server checked it before sending).
    unsafe {
        let r = cu::cuModuleLoadData(&mut m, image.as_ptr() as *const c_void);
        if r == cu::CUresult::CUDA_SUCCESS {
            cu::cuModuleUnload(m);
        }
        r as i32
    }
}

/// The verifier child's link of a container, as the server's would link it: the
/// CUresult of the whole link.
pub fn verify_link(ordinal: usize, container: &[u8]) -> i32 {
    if let Err(e) = verify_context(ordinal) {
        return e;
    }
    crate::session::link_verdict(container, |o, i| link_here(o, i).0.map(drop))
}

/// Makes GPU `ordinal`'s primary context current in the verifier child (retained once);
/// Err(NO_CONTEXT) when it cannot be had.
pub(super) fn verify_context(ordinal: usize) -> Result<(), i32> {
    use std::sync::OnceLock;
    static INIT: OnceLock<bool> = OnceLock::new();
    static CONTEXTS: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());
    if !*INIT.get_or_init(|| init().is_ok()) {
        return Err(crate::image::verifier::NO_CONTEXT);
    }
    let mut ctxs = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    let ctx = match ctxs.iter().find(|c| c.0 == ordinal) {
        Some(&(_, c)) => c as cu::CUcontext,
        None => {
            let (mut dev, mut ctx) = (0, std::ptr::null_mut());
            // SAFETY: valid out-pointers; a bad ordinal is the driver's to refuse.
            let r = unsafe {
                match cu::cuDeviceGet(&mut dev, ordinal as c_int) {
                    cu::CUresult::CUDA_SUCCESS => cu::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                    e => e,
                }
            };
            if r != cu::CUresult::CUDA_SUCCESS {
                return Err(crate::image::verifier::NO_CONTEXT);
            }
            ctxs.push((ordinal, ctx as usize));
            ctx
        }
    };
    // SAFETY: a context this process retained.
    if unsafe { cu::cuCtxSetCurrent(ctx) } != cu::CUresult::CUDA_SUCCESS {
        return Err(crate::image::verifier::NO_CONTEXT);
    }
    Ok(())
}

/// The verifier child's compile of a JIT load's container (value options and one PTX
/// input, as the server's handle_jit_load reads it): the CUresult.
pub fn verify_jit(ordinal: usize, container: &[u8]) -> i32 {
    if let Err(e) = verify_context(ordinal) {
        return e;
    }
    crate::session::jit_verdict(container, |ptx, o| {
        load_jit_here(ptx, o).0.map(|m| {
            // SAFETY: the module just loaded here, unloaded once.
            unsafe { cu::cuModuleUnload(m) };
        })
    })
}
