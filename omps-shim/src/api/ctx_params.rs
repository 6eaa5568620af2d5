//! What a program may ask of a context it creates beyond a device and flags: execution
//! affinity (an SM count, CUDA 11.4's cuCtxCreate_v3 and CUDA 13's CUctxCreateParams)
//! and CIG (a graphics client's shared data, CUDA 12.5). CUDA 13's headers make every
//! cuCtxCreate pass a CUctxCreateParams, most of them zeroed: those asking for nothing
//! create a plain context. omps cannot grant an SM count to one context (every client's
//! work runs in the server's one context, whose SM partitions the operator sets), so it
//! reports no support and refuses such a request as the driver does where it cannot
//! grant it; CIG needs a D3D12 or Vulkan client, which a Linux process is not.

use crate::cuda::*;
use crate::state::ctx::{create, CUcontext};
use crate::state::device::device;
use crate::state::entry::{entry, out};
use std::ffi::{c_int, c_uint, c_void};

/// CUexecAffinityParam: the type and a one-word union (the SM count of type 0).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExecAffinityParam {
    pub ty: c_uint,
    pub value: c_uint,
}

/// CUctxCigParam: the kind of data shared and a pointer to it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CigParam {
    pub data_type: c_uint,
    pub data: *mut c_void,
}

/// CUctxCreateParams. The driver's rule: at most one of the two pointers is non-null;
/// the count is 0 when the array is null.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CtxCreateParams {
    pub exec_affinity: *mut ExecAffinityParam,
    pub num_exec_affinity: c_int,
    pub cig: *mut CigParam,
}

const _: () = assert!(std::mem::size_of::<ExecAffinityParam>() == 8);
const _: () = assert!(std::mem::size_of::<CigParam>() == 16);
const _: () = assert!(std::mem::size_of::<CtxCreateParams>() == 24);

/// CU_EXEC_AFFINITY_TYPE_SM_COUNT, the only type there is.
const SM_COUNT: c_uint = 0;
/// CIG_DATA_TYPE_D3D12_COMMAND_QUEUE and CIG_DATA_TYPE_NV_BLOB.
const CIG_TYPES: std::ops::RangeInclusive<c_uint> = 1..=2;

/// Checks an execution-affinity array as the driver does (null with a count, a negative
/// count, an unknown type: CUDA_ERROR_INVALID_VALUE) and answers what
/// omps can grant: nothing, so a non-empty array is CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY.
///
/// # Safety
/// `p` is null or holds `n` entries.
unsafe fn exec_affinity(p: *const ExecAffinityParam, n: c_int) -> Result<(), CUresult> {
    if n < 0 || (p.is_null() && n != 0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if n == 0 {
        return Ok(());
    }
    // SAFETY: non-null with n > 0 entries, per the contract.
    let params = unsafe { std::slice::from_raw_parts(p, n as usize) };
    if params.iter().any(|a| a.ty != SM_COUNT) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Err(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY)
}

/// # Safety
/// `p` is non-null and points at a CUctxCigParam.
unsafe fn cig(p: *const CigParam) -> Result<(), CUresult> {
    // SAFETY: the caller's parameter, non-null.
    let c = unsafe { p.read() };
    if !CIG_TYPES.contains(&c.data_type) || c.data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Err(crate::unsupported::unsupported(
        "cuCtxCreate with CIG parameters (a D3D12 or Vulkan client's shared data)",
    ))
}

/// CUDA 13's cuCtxCreate: (ctx, params, flags, dev). Zeroed params are a plain create.
///
/// # Safety
/// `pctx` is null or writable; `params` is null or a valid CUctxCreateParams whose
/// arrays hold what they say.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut CtxCreateParams,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters, null or valid.
        if let Some(p) = unsafe { params.as_ref() } {
            if !p.exec_affinity.is_null() && !p.cig.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            device(dev)?;
            // SAFETY: the array holds num_exec_affinity entries, per the contract.
            unsafe { exec_affinity(p.exec_affinity, p.num_exec_affinity)? };
            if !p.cig.is_null() {
                // SAFETY: non-null, per the contract a CUctxCigParam.
                unsafe { cig(p.cig)? };
            }
        }
        create(pctx, dev)
    })
}

/// CUDA 11.4's cuCtxCreate with execution affinity: (ctx, params, count, flags, dev).
///
/// # Safety
/// `pctx` is null or writable; `params` is null or holds `n` entries.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut ExecAffinityParam,
    n: c_int,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        device(dev)?;
        // SAFETY: forwarded contract.
        unsafe { exec_affinity(params, n)? };
        create(pctx, dev)
    })
}

/// No execution affinity is supported (see the file's comment); an unknown type is
/// CUDA_ERROR_INVALID_VALUE, as from the driver.
///
/// # Safety
/// `pi` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetExecAffinitySupport(
    pi: *mut c_int,
    ty: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        device(dev)?;
        if ty != SM_COUNT {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's pointer.
        unsafe { out(pi, 0) }
    })
}
