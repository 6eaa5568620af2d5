//! The per-thread default stream variants (`_ptds`, `_ptsz`) that cuGetProcAddress hands
//! out for flag CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: each is its legacy entry
//! point run with stream 0 meaning the calling thread's own stream.

use super::exec::*;
use super::mem::*;
use super::peer::*;
use crate::cuda::*;
use crate::state::ctx::CUcontext;
use crate::state::launch::LaunchConfig;
use crate::state::streams::{per_thread, CUevent, CUfunction, CUstream};
use std::ffi::{c_uint, c_void};

macro_rules! per_thread_variants {
    ($($alias:ident => $base:ident($($arg:ident: $ty:ty),*);)*) => {$(
        /// # Safety
        /// As the legacy entry point it stands for.
        #[no_mangle]
        #[allow(clippy::too_many_arguments, unused_unsafe)]
        pub unsafe extern "C" fn $alias($($arg: $ty),*) -> CUresult {
            // SAFETY: forwarded contract.
            per_thread(|| unsafe { $base($($arg),*) })
        }
    )*};
}

per_thread_variants! {
    cuLaunchKernel_ptsz => cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuStreamSynchronize_ptsz => cuStreamSynchronize(s: CUstream);
    cuStreamQuery_ptsz => cuStreamQuery(s: CUstream);
    cuStreamWaitEvent_ptsz => cuStreamWaitEvent(s: CUstream, e: CUevent, flags: c_uint);
    cuEventRecord_ptsz => cuEventRecord(e: CUevent, s: CUstream);
    cuMemcpyHtoD_v2_ptds => cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize);
    cuMemcpyDtoH_v2_ptds => cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize);
    cuMemcpyDtoD_v2_ptds => cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    cuMemcpyPeer_ptds => cuMemcpyPeer(dst: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize);
    cuMemcpyPeerAsync_ptsz => cuMemcpyPeerAsync(dst: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize, s: CUstream);
    cuMemcpyHtoDAsync_v2_ptsz => cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream);
    cuMemcpyDtoHAsync_v2_ptsz => cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream);
    cuMemcpyDtoDAsync_v2_ptsz => cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream);
    cuMemsetD8_v2_ptds => cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize);
    cuMemsetD16_v2_ptds => cuMemsetD16_v2(dst: CUdeviceptr, v: u16, n: usize);
    cuMemsetD32_v2_ptds => cuMemsetD32_v2(dst: CUdeviceptr, v: u32, n: usize);
    cuMemsetD8Async_ptsz => cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, s: CUstream);
    cuMemsetD16Async_ptsz => cuMemsetD16Async(dst: CUdeviceptr, v: u16, n: usize, s: CUstream);
    cuMemsetD32Async_ptsz => cuMemsetD32Async(dst: CUdeviceptr, v: u32, n: usize, s: CUstream);
}

per_thread_variants! {
    cuLaunchKernelEx_ptsz => cuLaunchKernelEx(config: *const LaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuLaunchCooperativeKernel_ptsz => cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, s: CUstream, params: *mut *mut c_void);
    cuStreamGetPriority_ptsz => cuStreamGetPriority(s: CUstream, p: *mut std::ffi::c_int);
    cuStreamGetFlags_ptsz => cuStreamGetFlags(s: CUstream, p: *mut c_uint);
    cuStreamGetId_ptsz => cuStreamGetId(s: CUstream, p: *mut u64);
}

use super::hostmem::*;

per_thread_variants! {
    cuMemcpy_ptds => cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize);
    cuMemcpyAsync_ptsz => cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream);
    cuMemcpy2D_v2_ptds => cuMemcpy2D_v2(c: *const Memcpy2D);
    cuMemcpy2DUnaligned_v2_ptds => cuMemcpy2DUnaligned_v2(c: *const Memcpy2D);
    cuMemcpy2DAsync_v2_ptsz => cuMemcpy2DAsync_v2(c: *const Memcpy2D, s: CUstream);
    cuMemcpy3D_v2_ptds => cuMemcpy3D_v2(c: *const Memcpy3D);
    cuMemcpy3DAsync_v2_ptsz => cuMemcpy3DAsync_v2(c: *const Memcpy3D, s: CUstream);
    cuLaunchHostFunc_ptsz => cuLaunchHostFunc(s: CUstream, f: Option<unsafe extern "C" fn(*mut c_void)>, data: *mut c_void);
}

per_thread_variants! {
    cuEventRecordWithFlags_ptsz => cuEventRecordWithFlags(e: CUevent, s: CUstream, flags: c_uint);
    cuStreamGetCtx_ptsz => cuStreamGetCtx(s: CUstream, pctx: *mut *mut c_void);
    cuStreamGetDevice_ptsz => cuStreamGetDevice(s: CUstream, dev: *mut std::ffi::c_int);
}

per_thread_variants! {
    cuMemsetD2D8_v2_ptds => cuMemsetD2D8_v2(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize);
    cuMemsetD2D16_v2_ptds => cuMemsetD2D16_v2(dst: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize);
    cuMemsetD2D32_v2_ptds => cuMemsetD2D32_v2(dst: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize);
    cuMemsetD2D8Async_ptsz => cuMemsetD2D8Async(dst: CUdeviceptr, pitch: usize, v: u8, w: usize, h: usize, s: CUstream);
    cuMemsetD2D16Async_ptsz => cuMemsetD2D16Async(dst: CUdeviceptr, pitch: usize, v: u16, w: usize, h: usize, s: CUstream);
    cuMemsetD2D32Async_ptsz => cuMemsetD2D32Async(dst: CUdeviceptr, pitch: usize, v: u32, w: usize, h: usize, s: CUstream);
}

use super::graph::{cuGraphInstantiateWithParams, CUgraph, CUgraphExec, InstantiateParams};

per_thread_variants! {
    cuGraphInstantiateWithParams_ptsz => cuGraphInstantiateWithParams(pexec: *mut CUgraphExec, g: CUgraph, params: *mut InstantiateParams);
}

use super::array::*;

per_thread_variants! {
    cuMemcpyHtoA_v2_ptds => cuMemcpyHtoA_v2(a: CUarray, off: usize, src: *const c_void, n: usize);
    cuMemcpyAtoH_v2_ptds => cuMemcpyAtoH_v2(dst: *mut c_void, a: CUarray, off: usize, n: usize);
    cuMemcpyDtoA_v2_ptds => cuMemcpyDtoA_v2(a: CUarray, off: usize, src: CUdeviceptr, n: usize);
    cuMemcpyAtoD_v2_ptds => cuMemcpyAtoD_v2(dst: CUdeviceptr, a: CUarray, off: usize, n: usize);
    cuMemcpyAtoA_v2_ptds => cuMemcpyAtoA_v2(dst: CUarray, doff: usize, src: CUarray, soff: usize, n: usize);
    cuMemcpyHtoAAsync_v2_ptsz => cuMemcpyHtoAAsync_v2(a: CUarray, off: usize, src: *const c_void, n: usize, s: CUstream);
    cuMemcpyAtoHAsync_v2_ptsz => cuMemcpyAtoHAsync_v2(dst: *mut c_void, a: CUarray, off: usize, n: usize, s: CUstream);
}

use super::managed::*;

per_thread_variants! {
    cuMemPrefetchAsync_v2_ptsz => cuMemPrefetchAsync_v2(p: CUdeviceptr, len: usize, to: MemLocation, flags: c_uint, s: CUstream);
    cuMemPrefetchAsync_ptsz => cuMemPrefetchAsync(p: CUdeviceptr, len: usize, dev: std::ffi::c_int, s: CUstream);
    cuStreamAttachMemAsync_ptsz => cuStreamAttachMemAsync(s: CUstream, p: CUdeviceptr, len: usize, flags: c_uint);
}
