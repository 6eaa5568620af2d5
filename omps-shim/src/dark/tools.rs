//! Export tables that cuBLAS, cuBLASLt and cuFFT ask for beyond cudart's: tools context
//! (21318c60), cluster support (1734dc26) and tools module (6e163fbe); and f8cff951,
//! which every CUDA 13 runtime asks for first. What each called entry does was read off
//! driver 580 with `scripts/probe/darktrace.c` (arguments and results under PyTorch) and
//! matches the names public tool headers give them; the code is ours.
//!
//! Every other slot is a stub that returns CUDA_ERROR_NOT_SUPPORTED and names its table and
//! index once, so a library that reaches a new entry fails loudly.

use super::table::Table;
use crate::api::exec::cuStreamGetId;
use crate::cuda::*;
use crate::state::ctx::ctx_id;
use crate::state::streams::CUstream;
use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::Mutex;

const TABLE_NAMES: [&str; 4] = [
    "tools context 21318c60",
    "cluster 1734dc26",
    "tools module 6e163fbe",
    "f8cff951",
];

extern "C" fn unknown_slot<const T: usize, const S: usize>() -> CUresult {
    static SEEN: Mutex<Option<HashSet<(usize, usize)>>> = Mutex::new(None);
    let first = SEEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert((T, S));
    if first || crate::trace_enabled() {
        eprintln!(
            "omps: export table {}[{S}] called; not supported yet",
            TABLE_NAMES[T]
        );
    }
    CUDA_ERROR_NOT_SUPPORTED
}

/// A table of `$n` stubs named after table `$t`, with slot 0 holding the size in bytes.
macro_rules! stub_table {
    ($t:literal; $($i:literal)*) => {{
        let mut slots = [$(unknown_slot::<$t, $i> as *const c_void),*];
        slots[0] = (slots.len() * 8) as *const c_void;
        slots
    }};
}

// ---- 21318c60: tools context. [4] is the context's unique id (cuBLASLt keys its kernel
// cache by it: 372 calls in a PyTorch run), [39] a stream's.

unsafe extern "C" fn context_id(ctx: *mut c_void, id: *mut u64) -> CUresult {
    // SAFETY: forwarded contract: a context handle (or null for the current) and an
    // out-pointer.
    unsafe { ctx_id(ctx as _, id) }
}

unsafe extern "C" fn stream_id(_ctx: *mut c_void, s: CUstream, id: *mut u64) -> CUresult {
    // SAFETY: forwarded contract: a stream handle of this shim and an out-pointer.
    unsafe { cuStreamGetId(s, id) }
}

/// [51]: the tools handle of a stream (what [39] and [16] take): the shim's own handle,
/// with the per-thread default stream resolved when the flag asks for it.
unsafe extern "C" fn stream_tools_handle(
    _ctx: *mut c_void,
    s: CUstream,
    out: *mut CUstream,
    per_thread: u8,
) -> CUresult {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let resolved = if per_thread != 0 && s.is_null() {
        crate::state::streams::per_thread(|| crate::state::streams::resolve_stream(s))
    } else {
        crate::state::streams::resolve_stream(s)
    };
    match resolved {
        Ok(st) => {
            let h = st.map_or(s, |st| st as *const _ as CUstream);
            // SAFETY: checked non-null; the caller's out-pointer.
            unsafe { out.write(h) };
            CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

/// [16]: the public stream handle of a tools handle; they are the same here.
unsafe extern "C" fn stream_public_handle(s: CUstream, out: *mut CUstream) -> CUresult {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller's out-pointer.
    unsafe { out.write(s) };
    CUDA_SUCCESS
}

/// [20]: the context of a stream (tools handle).
unsafe extern "C" fn stream_context(s: CUstream, out: *mut *mut c_void) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { crate::api::exec::cuStreamGetCtx(s, out) }
}

pub static TOOLS_CONTEXT: Table<93> = Table({
    let mut t = stub_table!(0; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24
        25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53
        54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82
        83 84 85 86 87 88 89 90 91 92);
    t[4] = context_id as *const c_void;
    t[16] = stream_public_handle as *const c_void;
    t[20] = stream_context as *const c_void;
    t[39] = stream_id as *const c_void;
    t[51] = stream_tools_handle as *const c_void;
    t
});

// ---- 1734dc26: cluster support. [4] hands out the TPC maps (two malloc'd byte arrays),
// [13] frees them. The server read the driver's maps into the snapshot.

unsafe extern "C" fn tpc_maps(vgpc: *mut *mut u8, mtpc: *mut *mut u8) -> CUresult {
    if vgpc.is_null() || mtpc.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let dev = match crate::state::ctx::current_dev() {
        Ok(d) => d,
        Err(e) => return e,
    };
    let snap = match crate::state::device::device(dev as CUdevice) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let [nv, nm] = snap.tpc_map_len.map(|n| n as usize);
    if nv == 0 || nm == 0 {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    let copy = |src: &[u8]| -> *mut u8 {
        // SAFETY: a fresh allocation of src.len() bytes, filled before it is handed out;
        // the caller gives it back through tpc_maps_free, which frees with libc.
        unsafe {
            let p = libc::malloc(src.len()) as *mut u8;
            if !p.is_null() {
                std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len());
            }
            p
        }
    };
    let (v, m) = (copy(&snap.tpc_vgpc[..nv]), copy(&snap.tpc_mtpc[..nm]));
    if v.is_null() || m.is_null() {
        // SAFETY: null or from malloc above.
        unsafe { (libc::free(v as _), libc::free(m as _)) };
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    // SAFETY: checked non-null; the caller's out-pointers.
    unsafe { (vgpc.write(v), mtpc.write(m)) };
    CUDA_SUCCESS
}

unsafe extern "C" fn tpc_maps_free(vgpc: *mut u8, mtpc: *mut u8) -> CUresult {
    // SAFETY: null or arrays tpc_maps allocated with malloc.
    unsafe { (libc::free(vgpc as _), libc::free(mtpc as _)) };
    CUDA_SUCCESS
}

pub static CLUSTER: Table<17> = Table({
    let mut t = stub_table!(1; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
    t[4] = tpc_maps as *const c_void;
    t[13] = tpc_maps_free as *const c_void;
    t
});

// ---- 6e163fbe: tools module. cuFFT loads each of its kernel modules with
// cuModuleLoadData, then asks [7] for the module's functions: (context, module, callback,
// user, module again, its own data). The driver calls back once per function, on the
// calling thread, with (user, function, its mangled name, 0, 0, module), and returns how
// many it reported (1 for each of cuFFT's one-kernel modules, on driver 580).

type FunctionCallback = unsafe extern "C" fn(
    *mut c_void,
    *mut crate::handles::Function,
    *const std::ffi::c_char,
    usize,
    usize,
    *mut crate::handles::Module,
) -> usize;

unsafe extern "C" fn module_functions(
    _ctx: *mut c_void,
    module: *mut crate::handles::Module,
    cb: Option<FunctionCallback>,
    user: *mut c_void,
) -> usize {
    // SAFETY: a module handle of this shim, as the caller got it from cuModuleLoadData.
    let Ok(m) = (unsafe { crate::handles::resolve(module, crate::handles::MODULE_MAGIC) }) else {
        return 0;
    };
    let Some(cb) = cb else {
        return 0;
    };
    if crate::trace_enabled() {
        let names: Vec<_> = m
            .functions
            .iter()
            .map(|f| f.name.to_string_lossy())
            .collect();
        eprintln!(
            "omps trace: tools module [7]: {} function(s) {names:?}",
            names.len()
        );
    }
    for f in &m.functions {
        let fp = *f as *const crate::handles::Function as *mut crate::handles::Function;
        // SAFETY: the caller's callback and user pointer; the name lives with the function.
        unsafe { cb(user, fp, f.name.as_ptr(), 0, 0, module) };
    }
    m.functions.len()
}

pub static TOOLS_MODULE: Table<99> = Table({
    let mut t = stub_table!(2; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24
        25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53
        54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82
        83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98);
    t[7] = module_functions as *const c_void;
    t
});

// ---- f8cff951: every CUDA 13 runtime asks for it first. Driver 580 has it (24 bytes: the
// size and two functions). [1] is a log: cuDNN calls it with a category ("CUDA"), 0, a
// printf format ("Duplicate entry kernels named \"%s\" detected. ...") and a va_list;
// the driver answers success and prints nothing (darktrace, PyTorch's AdamW step on
// driver 580). [2] was never seen called: it names itself.

/// [1]: a library's log message. Printed only with OMPS_TRACE (its format string: the
/// arguments are in a va_list, which Rust does not take apart), as the driver prints it
/// only to its own log.
unsafe extern "C" fn library_log(
    category: *const std::ffi::c_char,
    _level: i32,
    format: *const std::ffi::c_char,
) -> CUresult {
    if crate::trace_enabled() {
        let text = |p: *const std::ffi::c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: the caller passes NUL-terminated strings (or null).
                unsafe { std::ffi::CStr::from_ptr(p) }
                    .to_string_lossy()
                    .into_owned()
            }
        };
        eprintln!(
            "omps trace: library log [{}] {}",
            text(category),
            text(format)
        );
    }
    CUDA_SUCCESS
}

pub static RUNTIME_FIRST: Table<3> = Table({
    let mut t = stub_table!(3; 0 1 2);
    t[1] = library_log as *const c_void;
    t
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_have_the_drivers_sizes_and_stubs_refuse() {
        assert_eq!(TOOLS_CONTEXT.0[0] as usize, 0x2e8);
        assert_eq!(CLUSTER.0[0] as usize, 0x88);
        assert_eq!(TOOLS_MODULE.0[0] as usize, 0x318);
        assert_eq!(RUNTIME_FIRST.0[0] as usize, 0x18);
        type Log =
            unsafe extern "C" fn(*const std::ffi::c_char, i32, *const std::ffi::c_char) -> CUresult;
        // SAFETY: slot 1 is library_log, of this signature.
        let log: Log = unsafe { std::mem::transmute(RUNTIME_FIRST.0[1]) };
        // SAFETY: both strings are NUL-terminated.
        let r = unsafe { log(c"CUDA".as_ptr(), 0, c"x %s".as_ptr()) };
        assert_eq!(r, CUDA_SUCCESS);
        // SAFETY: slot 1 is a stub taking no arguments.
        let f: extern "C" fn() -> CUresult = unsafe { std::mem::transmute(TOOLS_CONTEXT.0[1]) };
        assert_eq!(f(), CUDA_ERROR_NOT_SUPPORTED);
        assert_ne!(
            TOOLS_CONTEXT.0[1], TOOLS_CONTEXT.0[2],
            "each slot names itself"
        );
    }

    #[test]
    fn tpc_map_free_accepts_what_it_would_hand_out() {
        // SAFETY: malloc'd (or null) arrays, as tpc_maps hands out.
        unsafe {
            let (a, b) = (libc::malloc(8) as *mut u8, std::ptr::null_mut());
            assert_eq!(tpc_maps_free(a, b), CUDA_SUCCESS);
        }
    }
}
