//! [`CudaGpu`]'s module family: loads, JIT compiles and links of images, globals and
//! function attributes; also the JIT and link helpers the image verifier child shares.

use super::device::{ck, raw_fn, CudaGpu};
use crate::gpu::{code, CuError, Gpu, GpuResult, LoadedModule};
use cudarc::driver::sys as cu;
use std::ffi::{c_char, c_int, c_void, CString};

/// cuModuleLoadDataEx of NUL-terminated `ptx` with value `options` in the current
/// context: the module or the error, and the info and error logs.
pub(super) fn load_jit_here(
    ptx: &[u8],
    options: &[(u32, u64)],
) -> (GpuResult<cu::CUmodule>, String, String) {
    type LoadEx = unsafe extern "C" fn(
        *mut cu::CUmodule,
        *const c_void,
        u32,
        *mut u32,
        *mut *mut c_void,
    ) -> c_int;
    let mut o = JitOptions::new(options);
    let load: LoadEx = match raw_fn(b"cuModuleLoadDataEx\0") {
        Ok(f) => f,
        Err(e) => return (Err(e), String::new(), String::new()),
    };
    let mut m = std::ptr::null_mut();
    // SAFETY: NUL-terminated PTX (the session checks), this process's copy; options and
    // values are parallel arrays of value options and our own log buffers.
    let r = unsafe {
        load(
            &mut m,
            ptx.as_ptr() as *const c_void,
            o.opts.len() as u32,
            o.opts.as_mut_ptr(),
            o.vals.as_mut_ptr(),
        )
    };
    let result = if r == 0 { Ok(m) } else { Err(CuError(r)) };
    let (i, e) = o.logs();
    (result, i, e)
}

/// JIT-links `inputs` with value `options` in the current context (the server's GPU, or
/// the verifier child's): the image or the error, and the info and error logs.
pub(super) fn link_here(
    options: &[(u32, u64)],
    inputs: &[(u32, &str, &[u8])],
) -> (GpuResult<Vec<u8>>, String, String) {
    type Create = unsafe extern "C" fn(u32, *mut u32, *mut *mut c_void, *mut *mut c_void) -> c_int;
    type Add = unsafe extern "C" fn(
        *mut c_void,
        u32,
        *const c_void,
        usize,
        *const c_char,
        u32,
        *mut u32,
        *mut *mut c_void,
    ) -> c_int;
    type Complete = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut usize) -> c_int;
    type Destroy = unsafe extern "C" fn(*mut c_void) -> c_int;
    let mut o = JitOptions::new(options);
    let fns = (|| -> GpuResult<(Create, Add, Complete, Destroy)> {
        Ok((
            raw_fn(b"cuLinkCreate_v2\0")?,
            raw_fn(b"cuLinkAddData_v2\0")?,
            raw_fn(b"cuLinkComplete\0")?,
            raw_fn(b"cuLinkDestroy\0")?,
        ))
    })();
    let (create, add, complete, destroy) = match fns {
        Ok(f) => f,
        Err(e) => return (Err(e), String::new(), String::new()),
    };
    let mut state = std::ptr::null_mut();
    // SAFETY: options and values are parallel arrays of value options (checked by the
    // session) and our own log buffers with their sizes; the state is destroyed below.
    let r = unsafe {
        create(
            o.opts.len() as u32,
            o.opts.as_mut_ptr(),
            o.vals.as_mut_ptr(),
            &mut state,
        )
    };
    if r != 0 {
        let (i, e) = o.logs();
        return (Err(CuError(r)), i, e);
    }
    let mut result = Ok(Vec::new());
    for (kind, name, data) in inputs {
        let name = CString::new(*name).unwrap_or_default();
        // SAFETY: data is a live slice of its length; the driver copies it.
        let r = unsafe {
            add(
                state,
                *kind,
                data.as_ptr() as *const c_void,
                data.len(),
                name.as_ptr(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if r != 0 {
            result = Err(CuError(r));
            break;
        }
    }
    if result.is_ok() {
        let (mut img, mut n) = (std::ptr::null_mut(), 0usize);
        // SAFETY: valid out-pointers; the image lives until destroy, copied before.
        let r = unsafe { complete(state, &mut img, &mut n) };
        result = if r != 0 || img.is_null() {
            Err(CuError(if r != 0 { r } else { code::UNKNOWN }))
        } else {
            // SAFETY: the driver's image of n bytes.
            Ok(unsafe { std::slice::from_raw_parts(img as *const u8, n) }.to_vec())
        };
    }
    // SAFETY: the state from create, destroyed once.
    unsafe { destroy(state) };
    let (i, e) = o.logs();
    (result, i, e)
}

/// A JIT compile's options: the client's value options, then our own info and error log
/// buffers and their sizes, which the driver fills.
pub(super) struct JitOptions {
    opts: Vec<u32>,
    vals: Vec<*mut c_void>,
    info: Vec<u8>,
    error: Vec<u8>,
}

impl JitOptions {
    const LOG: usize = 64 << 10;

    fn new(options: &[(u32, u64)]) -> Self {
        const INFO_BUF: u32 = 3;
        const INFO_SIZE: u32 = 4;
        const ERROR_BUF: u32 = 5;
        const ERROR_SIZE: u32 = 6;
        let (mut info, mut error) = (vec![0u8; Self::LOG], vec![0u8; Self::LOG]);
        let mut opts: Vec<u32> = options.iter().map(|o| o.0).collect();
        let mut vals: Vec<*mut c_void> = options.iter().map(|o| o.1 as *mut c_void).collect();
        for (o, v) in [
            (INFO_BUF, info.as_mut_ptr() as *mut c_void),
            (INFO_SIZE, Self::LOG as *mut c_void),
            (ERROR_BUF, error.as_mut_ptr() as *mut c_void),
            (ERROR_SIZE, Self::LOG as *mut c_void),
        ] {
            opts.push(o);
            vals.push(v);
        }
        JitOptions {
            opts,
            vals,
            info,
            error,
        }
    }

    /// The info and error logs as the driver left them (up to their NUL).
    fn logs(&self) -> (String, String) {
        let text = |b: &[u8]| {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            String::from_utf8_lossy(&b[..end]).into_owned()
        };
        (text(&self.info), text(&self.error))
    }
}

pub(super) fn link(
    gpu: &CudaGpu,
    options: &[(u32, u64)],
    inputs: &[(u32, &str, &[u8])],
) -> (GpuResult<Vec<u8>>, String, String) {
    gpu.bind();
    link_here(options, inputs)
}

pub(super) fn module_load(gpu: &CudaGpu, image: &[u8]) -> GpuResult<LoadedModule> {
    gpu.bind();
    let mut m = std::ptr::null_mut();
    // SAFETY: the image is a server-owned copy; the driver parses it (fatbin, cubin, or
    // NUL-terminated PTX, which the session checks).
    ck(unsafe { cu::cuModuleLoadData(&mut m, image.as_ptr() as *const c_void) })?;
    gpu.loaded(m)
}

pub(super) fn module_load_jit(
    gpu: &CudaGpu,
    ptx: &[u8],
    options: &[(u32, u64)],
) -> (GpuResult<LoadedModule>, String, String) {
    gpu.bind();
    let (r, i, e) = load_jit_here(ptx, options);
    (r.and_then(|m| gpu.loaded(m)), i, e)
}

pub(super) fn image_data_bytes(gpu: &CudaGpu, image: &[u8]) -> u64 {
    // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR.
    let a = &gpu.snapshot().attributes;
    crate::image::module_cache::data_bytes(image, (a[75] * 10 + a[76]) as u32)
}

pub(super) fn module_unload(gpu: &CudaGpu, module: u64) -> GpuResult<()> {
    gpu.bind();
    // Graphs kept for launch runs may name its functions (batch.rs).
    gpu.runs.destroy_all();
    // SAFETY: module is a handle from module_load, unloaded once.
    ck(unsafe { cu::cuModuleUnload(module as cu::CUmodule) })
}

pub(super) fn module_global(gpu: &CudaGpu, module: u64, name: &str) -> GpuResult<(u64, u64)> {
    gpu.bind();
    let name = CString::new(name).map_err(|_| CuError(code::INVALID_VALUE))?;
    let (mut p, mut n) = (0, 0usize);
    // SAFETY: valid module handle, NUL-terminated name, valid out-pointers.
    ck(unsafe { cu::cuModuleGetGlobal_v2(&mut p, &mut n, module as cu::CUmodule, name.as_ptr()) })?;
    Ok((p, n as u64))
}

pub(super) fn func_attribute(gpu: &CudaGpu, func: u64, attr: i32) -> GpuResult<i32> {
    gpu.bind();
    gpu.func_attr(func as cu::CUfunction, attr)
}

pub(super) fn func_set_attribute(gpu: &CudaGpu, func: u64, attr: i32, value: i32) -> GpuResult<()> {
    gpu.bind();
    // SAFETY: func is a live function handle; the driver validates attr and value.
    let r = unsafe { (gpu.func_set_attr_fn)(func as cu::CUfunction, attr, value) };
    if r == 0 {
        Ok(())
    } else {
        Err(CuError(r))
    }
}
