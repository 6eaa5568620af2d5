//! The slice of the CUDA driver ABI the shim speaks: result codes and handle types.
//! Error names and strings come from `data/cu_errors.tsv`.

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

pub type CUresult = i32;
pub type CUdevice = i32;
pub type CUdeviceptr = u64;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_DEINITIALIZED: CUresult = 4;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_CONTEXT_ALREADY_IN_USE: CUresult = 216;
pub const CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY: CUresult = 224;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_MPS_CONNECTION_FAILED: CUresult = 805;
pub const CUDA_ERROR_MPS_RPC_FAILURE: CUresult = 806;
pub const CUDA_ERROR_MPS_SERVER_NOT_READY: CUresult = 807;
pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
pub const CUDA_ERROR_INVALID_RESOURCE_TYPE: CUresult = 914;
pub const CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION: CUresult = 915;

fn table() -> &'static Vec<(i32, &'static CStr, &'static CStr)> {
    static TABLE: OnceLock<Vec<(i32, &'static CStr, &'static CStr)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        include_str!("../data/cu_errors.tsv")
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, '\t');
                let code = f.next()?.parse().ok()?;
                // Leaked once: the driver's strings are static too, and callers keep them.
                let name = Box::leak(format!("{}\0", f.next()?).into_boxed_str());
                let text = Box::leak(format!("{}\0", f.next()?).into_boxed_str());
                Some((
                    code,
                    CStr::from_bytes_with_nul(name.as_bytes()).ok()?,
                    CStr::from_bytes_with_nul(text.as_bytes()).ok()?,
                ))
            })
            .collect()
    })
}

/// (name, description) of a CUresult, as the driver gives them.
pub fn error_text(code: CUresult) -> Option<(*const c_char, *const c_char)> {
    table()
        .iter()
        .find(|e| e.0 == code)
        .map(|e| (e.1.as_ptr(), e.2.as_ptr()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_table_has_the_codes_the_shim_returns() {
        for c in [
            CUDA_SUCCESS,
            CUDA_ERROR_INVALID_VALUE,
            CUDA_ERROR_NOT_SUPPORTED,
            CUDA_ERROR_MPS_RPC_FAILURE,
            CUDA_ERROR_INVALID_CONTEXT,
        ] {
            let (n, _) = error_text(c).expect("code in table");
            // SAFETY: the table's strings are NUL-terminated statics.
            let n = unsafe { CStr::from_ptr(n) }.to_str().unwrap();
            assert!(n.starts_with("CUDA_"), "{n}");
        }
        assert!(error_text(123456).is_none());
    }
}
