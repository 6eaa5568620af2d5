//! Modules: images are uploaded through the staging chunks, loaded in the server, and come
//! back with every function's parameter layout, so launches need no further round trip.

use crate::cuda::*;
use crate::handles::{retire, Function, LibraryState, Module, FUNC_MAGIC, MODULE_MAGIC};
use crate::state::ctx::current_dev;
use crate::state::entry::{entry, live, out};
use crate::state::modules::*;
use crate::state::ranges::add_range;
use crate::state::streams::{function, CUfunction};
use omps_ring::wire::{self, FuncGetAttribute, ModuleGetGlobal, Op};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::Ordering;

/// The handle types of this family, named where the program sees them.
pub use crate::state::modules::CUmodule;

fn load(image: &[u8]) -> Result<CUmodule, CUresult> {
    load_on(current_dev()?, image)
}

/// # Safety
/// `m` is null or writable; `image` is a module image.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(m: *mut CUmodule, image: *const c_void) -> CUresult {
    entry(|| {
        if m.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes a module image.
        let img = unsafe { crate::image::image_slice(image as *const u8) }
            .ok_or(CUDA_ERROR_INVALID_IMAGE)?;
        let h = load(img)?;
        // SAFETY: checked non-null.
        unsafe { out(m, h) }
    })
}

/// PTX with options is compiled by the server's driver with those options (its own
/// cuModuleLoadDataEx, api/link.rs `jit_load`), so the info and error logs, their sizes
/// and the wall time are the compiler's own. Other images need no compiling; their output options are answered as
/// the driver does when nothing was compiled: empty logs, size 0, the load's wall time.
///
/// # Safety
/// As cuModuleLoadData; `opts` and `vals` hold `n` entries as cuModuleLoadDataEx requires.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    m: *mut CUmodule,
    image: *const c_void,
    n: c_uint,
    opts: *mut c_int,
    vals: *mut *mut c_void,
) -> CUresult {
    const WALL_TIME: c_int = 2;
    const INFO_LOG_BUFFER: c_int = 3;
    const INFO_LOG_SIZE: c_int = 4;
    const ERROR_LOG_BUFFER: c_int = 5;
    const ERROR_LOG_SIZE: c_int = 6;
    if n > 0 && !opts.is_null() && !vals.is_null() && !m.is_null() {
        // SAFETY: the caller passes a module image.
        if let Some(img) = unsafe { crate::image::image_slice(image as *const u8) } {
            if crate::image::is_ptx(img) {
                return entry(|| {
                    let dev = current_dev()?;
                    let prints = crate::printf::note_image(live()?, dev, img);
                    // SAFETY: forwarded contract.
                    let h = unsafe {
                        super::link::jit_load(dev, img, n, opts as *mut u32, vals, |table| {
                            parse_module(table, dev, prints)
                        })?
                    };
                    // SAFETY: checked non-null.
                    unsafe { out(m, h) }
                });
            }
        }
    }
    let t = std::time::Instant::now();
    // SAFETY: forwarded contract.
    let r = unsafe { cuModuleLoadData(m, image) };
    let ms = t.elapsed().as_secs_f32() * 1e3;
    if opts.is_null() || vals.is_null() {
        return r;
    }
    for i in 0..n as usize {
        // SAFETY: opts and vals hold n entries; output values are written in place as the
        // driver does (sizes and times in the value slot itself, logs into the buffer).
        unsafe {
            let v = vals.add(i);
            match *opts.add(i) {
                WALL_TIME => *(v as *mut f32) = ms,
                INFO_LOG_SIZE | ERROR_LOG_SIZE => *(v as *mut usize) = 0,
                INFO_LOG_BUFFER | ERROR_LOG_BUFFER if !(*v).is_null() => *(*v as *mut u8) = 0,
                _ => {}
            }
        }
    }
    r
}

/// # Safety
/// As cuModuleLoadData.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(m: *mut CUmodule, image: *const c_void) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuModuleLoadData(m, image) }
}

/// # Safety
/// `m` is null or writable; `path` is a NUL-terminated file name.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(m: *mut CUmodule, path: *const c_char) -> CUresult {
    entry(|| {
        if m.is_null() || path.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's NUL-terminated path.
        let p = unsafe { CStr::from_ptr(path) }
            .to_string_lossy()
            .into_owned();
        let mut img = std::fs::read(&p).map_err(|_| CUDA_ERROR_NOT_FOUND)?;
        img.push(0); // PTX files carry no NUL of their own
        let h = load(&img)?;
        // SAFETY: checked non-null.
        unsafe { out(m, h) }
    })
}

/// # Safety
/// `f` is null or writable; `name` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut CUfunction,
    m: CUmodule,
    name: *const c_char,
) -> CUresult {
    entry(|| {
        let md = module(m)?;
        if name.is_null() || f.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's NUL-terminated name.
        let name = unsafe { CStr::from_ptr(name) };
        let func = md
            .functions
            .iter()
            .find(|x| x.name.as_c_str() == name)
            .ok_or(CUDA_ERROR_NOT_FOUND)?;
        // SAFETY: checked non-null.
        unsafe { out(f, *func as *const Function as CUfunction) }
    })
}

/// # Safety
/// `dptr` and `bytes` are null or writable; `name` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    m: CUmodule,
    name: *const c_char,
) -> CUresult {
    entry(|| {
        let md = module(m)?;
        if name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's NUL-terminated name.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        let c = live()?;
        let mut ch = c.channel();
        ch.call(md.dev, Op::ModuleGetGlobal, |call| {
            let mut v = bytemuck::bytes_of(&ModuleGetGlobal {
                call,
                module: md.id,
                name_len: name.len() as u32,
            })
            .to_vec();
            v.extend_from_slice(name);
            v
        })?;
        let g = ch.reply::<wire::GlobalReply>();
        add_range(g.ptr, g.size, md.dev, false);
        // SAFETY: the caller's pointers; either may be null.
        unsafe {
            if !dptr.is_null() {
                dptr.write(g.ptr);
            }
            if !bytes.is_null() {
                bytes.write(g.size as usize);
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(m: CUmodule) -> CUresult {
    entry(|| {
        let md = module(m)?;
        retire(&md.magic, MODULE_MAGIC)?;
        for f in &md.functions {
            let _ = retire(&f.magic, FUNC_MAGIC);
        }
        live()?.push(
            md.dev,
            Op::ModuleUnload,
            &[bytemuck::bytes_of(&wire::Handle { id: md.id, _pad: 0 })],
        )
    })
}

/// # Safety
/// `pi` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    f: CUfunction,
) -> CUresult {
    const MAX_THREADS_PER_BLOCK: c_int = 0;
    const SHARED_SIZE_BYTES: c_int = 1;
    const MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;
    entry(|| {
        let func = function_here(f)?;
        let v = match attrib {
            MAX_THREADS_PER_BLOCK => func.max_threads_per_block,
            SHARED_SIZE_BYTES => func.static_shared,
            MAX_DYNAMIC_SHARED_SIZE_BYTES => func.max_dynamic_shared.load(Ordering::Relaxed),
            _ if func.attrs.known(attrib).is_some() => func.attrs.known(attrib).unwrap_or(0),
            _ => {
                let changes = func.attrs.changes();
                let c = live()?;
                let mut ch = c.channel();
                ch.call(func.dev, Op::FuncGetAttribute, |call| {
                    bytemuck::bytes_of(&FuncGetAttribute {
                        call,
                        func: func.id,
                        attr: attrib,
                    })
                    .to_vec()
                })?;
                let v = ch.reply::<wire::U64Reply>().value as u32 as i32;
                func.attrs.learn(attrib, v, changes);
                v
            }
        };
        // SAFETY: the caller's pointer.
        unsafe { out(pi, v) }
    })
}

/// # Safety
/// `f` is a function handle from this shim.
#[no_mangle]
pub unsafe extern "C" fn cuFuncSetAttribute(
    f: CUfunction,
    attrib: c_int,
    value: c_int,
) -> CUresult {
    const MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;
    entry(|| {
        let func = function_here(f)?;
        let _one_set_at_a_time = func.attrs.setting();
        let unchanged = if attrib == MAX_DYNAMIC_SHARED_SIZE_BYTES {
            func.max_dynamic_shared.load(Ordering::Relaxed) == value
        } else {
            func.attrs.already_set(attrib, value)
        };
        if unchanged {
            return Ok(());
        }
        let c = live()?;
        let mut ch = c.channel();
        ch.call(func.dev, Op::FuncSetAttribute, |call| {
            bytemuck::bytes_of(&wire::FuncSetAttribute {
                call,
                func: func.id,
                attr: attrib,
                value,
                _pad: 0,
            })
            .to_vec()
        })?;
        if attrib == MAX_DYNAMIC_SHARED_SIZE_BYTES {
            func.max_dynamic_shared.store(value, Ordering::Relaxed);
        }
        func.attrs.was_set(attrib, value);
        crate::state::answers::forget_answers();
        Ok(())
    })
}

/// # Safety
/// `off` and `size` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    f: CUfunction,
    index: usize,
    off: *mut usize,
    size: *mut usize,
) -> CUresult {
    entry(|| {
        let func = function_here(f)?;
        let &(o, s) = func.params.get(index).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's pointers.
        unsafe {
            out(off, o as usize)?;
            out(size, s as usize)
        }
    })
}

/// # Safety
/// `count` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetParamCount(f: CUfunction, count: *mut usize) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(count, function_here(f)?.params.len()) })
}

// ---- The library API: cudart registers every kernel this way. A library is loaded as a
// module on the device current at load time (device 0 if none is), and a CUkernel is that
// module's function handle, which cuLaunchKernel accepts as CUDA allows.

pub type CUlibrary = *mut Module;
pub type CUkernel = *mut Function;

/// # Safety
/// `lib` is null or writable; `code` is a module image; the option arrays hold the counts
/// given (they are not forwarded yet, as for cuModuleLoadDataEx).
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    lib: *mut CUlibrary,
    code: *const c_void,
    _jit_opts: *mut c_int,
    _jit_vals: *mut *mut c_void,
    _n_jit: c_uint,
    _lib_opts: *mut c_int,
    _lib_vals: *mut *mut c_void,
    _n_lib: c_uint,
) -> CUresult {
    entry(|| {
        if lib.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes a module image.
        let img = unsafe { crate::image::image_slice(code as *const u8) }
            .ok_or(CUDA_ERROR_INVALID_IMAGE)?;
        let dev = here(0)?;
        let h = load_on(dev, img)?;
        let devices = live()?.num_devices();
        if devices > 1 {
            // Other devices load it when they first use it: keep the image for them.
            let mut on = vec![0; devices];
            on[dev] = h as usize;
            let family = std::sync::Arc::new(crate::handles::Library {
                root: h as usize,
                state: std::sync::Mutex::new(LibraryState {
                    image: Some(img.to_vec()),
                    on,
                }),
            });
            // SAFETY: just made by parse_module, live.
            let _ = unsafe { &*h }.library.set(family);
        }
        // SAFETY: checked non-null.
        unsafe { out(lib, h) }
    })
}

/// Unloads the library's module on every device that loaded it.
#[no_mangle]
pub extern "C" fn cuLibraryUnload(lib: CUlibrary) -> CUresult {
    entry(|| {
        let md = module(lib)?;
        let Some(family) = md.library.get() else {
            return match cuModuleUnload(lib) {
                CUDA_SUCCESS => Ok(()),
                e => Err(e),
            };
        };
        if family.root != lib as usize {
            // A device's module of the family, not the library handle itself.
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let loaded = {
            let mut st = family.state.lock().unwrap_or_else(|e| e.into_inner());
            // The image goes with the library; a late use on another device is refused.
            st.image = None;
            std::mem::take(&mut st.on)
        };
        for m in loaded.into_iter().filter(|&m| m != 0) {
            let _ = cuModuleUnload(m as CUmodule);
        }
        Ok(())
    })
}

/// # Safety
/// `k` is null or writable; `name` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    k: *mut CUkernel,
    lib: CUlibrary,
    name: *const c_char,
) -> CUresult {
    // SAFETY: forwarded contract (a CUkernel is the function of the library's first
    // module; function_on finds it on other devices).
    unsafe { cuModuleGetFunction(k, lib, name) }
}

/// # Safety
/// `m` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetModule(m: *mut CUmodule, lib: CUlibrary) -> CUresult {
    entry(|| {
        let md = module(lib)?;
        let here = module_on(md, here(md.dev)?)?;
        // SAFETY: the caller's pointer.
        unsafe { out(m, here as *const Module as CUmodule) }
    })
}

/// # Safety
/// As cuModuleGetGlobal_v2.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    lib: CUlibrary,
    name: *const c_char,
) -> CUresult {
    let md = match module(lib).and_then(|md| module_on(md, here(md.dev)?)) {
        Ok(md) => md as *const Module as CUmodule,
        Err(e) => return e,
    };
    // SAFETY: forwarded contract.
    unsafe { cuModuleGetGlobal_v2(dptr, bytes, md, name) }
}

/// # Safety
/// `f` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(f: *mut CUfunction, k: CUkernel) -> CUresult {
    entry(|| {
        let func = function_here(k)?;
        // SAFETY: the caller's pointer.
        unsafe { out(f, func as *const Function as CUfunction) }
    })
}

/// # Safety
/// As cuFuncGetAttribute.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    k: CUkernel,
    dev: CUdevice,
) -> CUresult {
    let f = match usize::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_DEVICE) {
        Ok(d) => function_on(k, d),
        Err(e) => Err(e),
    };
    match f {
        // SAFETY: forwarded contract.
        Ok(f) => unsafe { cuFuncGetAttribute(pi, attrib, f as *const Function as CUfunction) },
        Err(e) => e,
    }
}

/// # Safety
/// As cuFuncSetAttribute.
#[no_mangle]
pub unsafe extern "C" fn cuKernelSetAttribute(
    attrib: c_int,
    value: c_int,
    k: CUkernel,
    dev: CUdevice,
) -> CUresult {
    let f = match usize::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_DEVICE) {
        Ok(d) => function_on(k, d),
        Err(e) => Err(e),
    };
    match f {
        // SAFETY: forwarded contract.
        Ok(f) => unsafe { cuFuncSetAttribute(f as *const Function as CUfunction, attrib, value) },
        Err(e) => e,
    }
}

/// # Safety
/// `name` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetName(name: *mut *const c_char, k: CUkernel) -> CUresult {
    // SAFETY: the caller's pointer; the name lives as long as the (never freed) handle.
    entry(|| unsafe { out(name, function(k)?.name.as_ptr()) })
}

/// # Safety
/// `name` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuKernelGetName(name, f) }
}

/// # Safety
/// As cuFuncGetParamInfo.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    k: CUkernel,
    index: usize,
    off: *mut usize,
    size: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuFuncGetParamInfo(k, index, off, size) }
}

/// # Safety
/// `mode` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut c_int) -> CUresult {
    // The server's driver loads lazily unless CUDA_MODULE_LOADING says otherwise.
    const LAZY: c_int = 2;
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(mode, LAZY) })
}
