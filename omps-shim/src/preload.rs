//! The ways into the shim for programs that load the driver themselves: under LD_PRELOAD,
//! `dlopen("libcuda.so.1")` (what cudart does) answers with the shim itself, whether or not
//! a real driver is installed. The other way in is a directory holding a `libcuda.so.1`
//! symlink to the shim, first on LD_LIBRARY_PATH; then the loader finds the shim by name.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;

/// The base address of the object holding `p` (dladdr), 0 if none.
fn object_of(p: usize) -> usize {
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(p as *const c_void, &mut info) == 0 {
            return 0;
        }
        info.dli_fbase as usize
    }
}

fn real_dlopen() -> DlopenFn {
    static REAL: OnceLock<usize> = OnceLock::new();
    let p = *REAL.get_or_init(|| {
        // Our own object, to never take the interposer below for libc's (a reference to
        // `dlopen` here may resolve to either, whichever comes first in the global scope).
        let own = object_of(real_dlopen as *const () as usize);
        let foreign = |p: usize| p != 0 && object_of(p) != own;
        // SAFETY: RTLD_NEXT lookup of a libc symbol; the name is NUL-terminated.
        let next = unsafe { libc::dlsym(libc::RTLD_NEXT, c"dlopen".as_ptr()) as usize };
        if foreign(next) {
            return next;
        }
        // Loaded as libcuda.so.1 by name (LD_LIBRARY_PATH) by a program that links libc
        // before libcuda, nothing after the shim defines dlopen: ask for libc's by its
        // versions (2.34 merged libdl into libc; before, 2.2.5 on x86-64 and 2.17, the
        // first glibc of aarch64, there).
        [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"]
            .iter()
            .map(|v| {
                // SAFETY: a versioned lookup in the global scope; names are NUL-terminated.
                let f = unsafe { libc::dlvsym(libc::RTLD_DEFAULT, c"dlopen".as_ptr(), v.as_ptr()) };
                f as usize
            })
            .find(|&p| foreign(p))
            .unwrap_or(0)
    });
    assert!(p != 0, "omps: libc's dlopen not found");
    // SAFETY: p is libc's dlopen, whose signature this is.
    unsafe { std::mem::transmute::<usize, DlopenFn>(p) }
}

/// Whether `name` asks for the CUDA driver library.
pub fn is_libcuda(name: &[u8]) -> bool {
    let base = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
    base == b"libcuda.so" || base == b"libcuda.so.1"
}

/// A dlopen handle of the shim itself.
pub fn self_handle() -> *mut c_void {
    static HANDLE: OnceLock<usize> = OnceLock::new();
    *HANDLE.get_or_init(|| {
        // SAFETY: dladdr of one of our own functions fills `info` with our file name, which
        // is NUL-terminated and lives while we are loaded.
        unsafe {
            let mut info: libc::Dl_info = std::mem::zeroed();
            if libc::dladdr(self_handle as *const c_void, &mut info) == 0
                || info.dli_fname.is_null()
            {
                return 0;
            }
            real_dlopen()(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD) as usize
        }
    }) as *mut c_void
}

/// Interposes libc's dlopen (LD_PRELOAD puts this definition first).
///
/// # Safety
/// As dlopen(3).
#[no_mangle]
pub unsafe extern "C" fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void {
    if !filename.is_null() {
        // SAFETY: dlopen's contract: a NUL-terminated file name.
        let name = unsafe { CStr::from_ptr(filename) }.to_bytes();
        if is_libcuda(name) {
            let me = self_handle();
            if !me.is_null() {
                return me;
            }
        }
    }
    // SAFETY: forwarding the caller's arguments unchanged.
    unsafe { real_dlopen()(filename, flags) }
}

/// The address of an entry point the shim exports, by name.
pub fn own_symbol(name: &CStr) -> *mut c_void {
    let h = self_handle();
    if h.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: h is our own handle; name is NUL-terminated.
    unsafe { libc::dlsym(h, name.as_ptr()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_driver_library_is_redirected() {
        assert!(is_libcuda(b"libcuda.so.1"));
        assert!(is_libcuda(b"/usr/lib/x86_64-linux-gnu/libcuda.so"));
        assert!(!is_libcuda(b"libcudart.so.13"));
        assert!(!is_libcuda(b"libcuda.so.580.1"));
        assert!(!is_libcuda(b"/opt/libcuda.so.1/other.so"));
    }
}
