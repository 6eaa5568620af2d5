//! cuGetProcAddress: how cudart finds every entry point. The answers (which ABI variant a
//! name means at a CUDA version and stream flag) were probed from the real driver and are
//! compiled in from data/proc_address.txt; the pointer is the shim's own export of that
//! variant, implemented or a NOT_SUPPORTED stub.

use crate::cuda::*;
use crate::preload::own_symbol;
use crate::state::entry::{entry, out};
use std::ffi::{c_char, c_int, c_void, CStr};

/// The symbol a (name, version, flags) query resolves to, or the driver's (CUresult,
/// status) refusal.
type Answer = Result<&'static CStr, (i32, i32)>;
/// (name, flags, [(from version, answer)]).
type ProcEntry = (&'static str, u8, &'static [(i32, Answer)]);

include!(concat!(env!("OUT_DIR"), "/proc_table.rs"));

const SYMBOL_SUCCESS: c_int = 0;
const SYMBOL_NOT_FOUND: c_int = 1;
const VERSION_NOT_SUFFICIENT: c_int = 2;

/// What the driver answers for (name, version, flags): the symbol, or (CUresult, status).
pub fn resolve(name: &str, version: i32, flags: u64) -> Result<&'static CStr, (CUresult, c_int)> {
    // Flags: 0 default, 1 legacy stream, 2 per-thread default stream.
    let flags = (flags & 3) as u8;
    let i = PROC_TABLE
        .binary_search_by(|(n, f, _)| (*n, *f).cmp(&(name, flags)))
        .map_err(|_| (CUDA_SUCCESS, SYMBOL_NOT_FOUND))?;
    let entries = PROC_TABLE[i].2;
    match entries.iter().rev().find(|(v, _)| *v <= version) {
        Some((_, r)) => *r,
        // Asked for a version older than the name's first: the earliest answer is a refusal.
        None => Err((CUDA_SUCCESS, VERSION_NOT_SUFFICIENT)),
    }
}

/// # Safety
/// `symbol` is NUL-terminated; `pfn` and `status` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    entry(|| {
        if symbol.is_null() || pfn.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's NUL-terminated name.
        let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
        // A version newer than the driver's is refused without touching the outputs.
        let driver = crate::conn::connected().map_or(13000, |c| c.snapshot.driver_version);
        if version > driver {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let resolved = resolve(name, version, flags);
        if crate::trace_enabled() {
            let target = resolved.map(|s| s.to_string_lossy().into_owned());
            let implemented = resolved
                .is_ok_and(|s| crate::unsupported::IMPLEMENTED.contains(&s.to_str().unwrap_or("")));
            eprintln!("omps trace: resolve {name} {version} {flags} -> {target:?} implemented={implemented}");
        }
        let answer = resolved.and_then(|sym| {
            let p = own_symbol(sym);
            if p.is_null() {
                Err((CUDA_SUCCESS, SYMBOL_NOT_FOUND))
            } else {
                Ok(p)
            }
        });
        // SAFETY: the caller's pointers (status may be null).
        unsafe {
            match answer {
                Ok(p) => {
                    out(pfn, p)?;
                    if !status.is_null() {
                        status.write(SYMBOL_SUCCESS);
                    }
                    Ok(())
                }
                Err((r, st)) => {
                    out(pfn, std::ptr::null_mut())?;
                    if !status.is_null() {
                        status.write(st);
                    }
                    Err(r)
                }
            }
        }
    })
}

/// The pre-12.0 form, without the status.
///
/// # Safety
/// As cuGetProcAddress_v2.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuGetProcAddress_v2(symbol, pfn, version, flags, std::ptr::null_mut()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_match_the_probed_driver() {
        assert_eq!(
            resolve("cuMemcpyHtoDAsync", 13000, 0).unwrap(),
            c"cuMemcpyHtoDAsync_v2"
        );
        assert_eq!(
            resolve("cuMemcpyHtoDAsync", 13000, 2).unwrap(),
            c"cuMemcpyHtoDAsync_v2_ptsz"
        );
        assert_eq!(
            resolve("cuMemcpyHtoDAsync", 3000, 0).unwrap(),
            c"cuMemcpyHtoDAsync"
        );
        assert_eq!(
            resolve("cuLaunchKernel", 2000, 0),
            Err((CUDA_SUCCESS, VERSION_NOT_SUFFICIENT))
        );
        assert_eq!(
            resolve("cuNoSuchThing", 13000, 0),
            Err((CUDA_SUCCESS, SYMBOL_NOT_FOUND))
        );
    }
}
