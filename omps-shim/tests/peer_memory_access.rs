//! Memory of GPU 0 given to GPU 1 through the shim's entry points, as NCCL's cuMem
//! transport and cudaMallocAsync users ask, on a server of two linked host GPUs:
//! cuMemSetAccess with GPU 1's location on VMM memory of GPU 0, then a kernel on GPU 1
//! fills it; cuMemPoolSetAccess for GPU 1 on a pool of GPU 0, then a kernel on GPU 1 fills
//! one of its blocks. Read-only access, a device the process does not have and multicast
//! are refused. One test: the shim connects once per process.

mod common;
use common::*;
use omps_server::gpu::Gpu;
use omps_shim::api::pool::*;
use omps_shim::api::vmm::*;
use omps_shim::api::{ctx::*, exec::*, mem::*, module::*};
use omps_shim::cuda::*;
use std::ffi::c_void;

/// CUmemAccessDesc: a device location and read-write access.
fn rw(dev: u32) -> [u32; 3] {
    [1, dev, 3]
}

/// Launches fill_u32 (`value`, 16 words at `p`) on `stream`.
///
/// # Safety
/// `kern` is a kernel of HOST_MODULE; `stream` is a live stream.
unsafe fn fill(kern: CUkernel, p: u64, value: u32, stream: CUstream) {
    let (mut p, mut value, mut count) = (p, value, 16u32);
    let mut params = [
        &mut p as *mut u64 as *mut c_void,
        &mut value as *mut u32 as *mut c_void,
        &mut count as *mut u32 as *mut c_void,
    ];
    // SAFETY: per the contract; the parameters live across the call.
    ok(unsafe {
        cuLaunchKernel(
            kern as CUfunction,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    });
}

#[test]
fn gpu_1_reaches_gpu_0_memory_it_was_given() {
    let ((dir, first, second, thread), [c0, c1]) = shim_on_linked_gpus("peer-mem");
    // SAFETY (whole block): valid out-pointers and buffers of the sizes passed; handles made here.
    unsafe {
        let (mut lib, mut kern) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok(cuCtxSetCurrent(c0));
        ok(cuLibraryLoadData(
            &mut lib,
            HOST_MODULE.as_ptr() as *const c_void,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        ));
        ok(cuLibraryGetKernel(&mut kern, lib, c"fill_u32".as_ptr()));

        // VMM memory of GPU 0, exportable as NCCL makes it, with access for both GPUs.
        let mut prop: AllocProp = std::mem::zeroed();
        let words = &mut prop as *mut AllocProp as *mut u32;
        *words = 1; // pinned
        *words.add(1) = 1; // exportable as a POSIX descriptor
        *words.add(2) = 1; // on device 0
        let mut g = 0usize;
        ok(cuMemGetAllocationGranularity(&mut g, &prop, 0));
        let (mut h, mut va) = (0u64, 0u64);
        ok(cuMemCreate(&mut h, g, &prop, 0));
        ok(cuMemAddressReserve(&mut va, g, 0, 0, 0));
        ok(cuMemMap(va, g, 0, h, 0));
        let mut flags = 9;
        let gpu1 = [1i32, 1];
        ok(cuMemGetAccess(&mut flags, &gpu1, va));
        assert_eq!(flags, 0, "no access before it is set");
        let both = [rw(0), rw(1)];
        ok(cuMemSetAccess(va, g, both.as_ptr().cast(), 2));
        ok(cuMemGetAccess(&mut flags, &gpu1, va));
        assert_eq!(flags, 3, "read-write for GPU 1");
        assert_eq!(
            cuMemSetAccess(va, g, [1u32, 1, 1].as_ptr().cast(), 1),
            CUDA_ERROR_NOT_SUPPORTED,
            "read-only"
        );
        assert_ne!(
            cuMemSetAccess(va, g, rw(7).as_ptr().cast(), 1),
            CUDA_SUCCESS,
            "a device the process does not have"
        );

        // A kernel on GPU 1 fills it; GPU 0's copy reads it back.
        ok(cuCtxSetCurrent(c1));
        let mut s1 = std::ptr::null_mut();
        ok(cuStreamCreate(&mut s1, 0));
        fill(kern, va, 0xabcd, s1);
        ok(cuStreamSynchronize(s1));
        let mut back = [0u32; 16];
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), va, 64));
        assert_eq!(back, [0xabcd; 16], "GPU 1's kernel wrote GPU 0's memory");

        // Unmapping waits for GPU 1's work, then the memory goes.
        ok(cuMemUnmap(va, g));
        ok(cuMemAddressFree(va, g));
        ok(cuMemRelease(h));

        // A pool of GPU 0 given to GPU 1: the server's context on GPU 1 gets peer access.
        ok(cuCtxSetCurrent(c0));
        let mut pool = std::ptr::null_mut();
        let pprops: [u32; 4] = [1, 0, 1, 0];
        let mut pprops_full = [0u8; 88];
        std::ptr::copy_nonoverlapping(pprops.as_ptr().cast::<u8>(), pprops_full.as_mut_ptr(), 16);
        ok(cuMemPoolCreate(&mut pool, pprops_full.as_ptr().cast()));
        let mut pflags = 9u32;
        ok(cuMemPoolGetAccess(&mut pflags, pool, &gpu1));
        assert_eq!(pflags, 0);
        assert!(!second.reaches(0), "enabled only when asked");
        ok(cuMemPoolSetAccess(pool, rw(1).as_ptr().cast(), 1));
        assert!(second.reaches(0), "GPU 1's context reaches GPU 0");
        ok(cuMemPoolGetAccess(&mut pflags, pool, &gpu1));
        assert_eq!(pflags, 3);
        assert_eq!(
            cuMemPoolSetAccess(pool, [1u32, 1, 0].as_ptr().cast(), 1),
            CUDA_ERROR_NOT_SUPPORTED,
            "taking access away"
        );
        let mut block = 0u64;
        ok(cuMemAllocFromPoolAsync(
            &mut block,
            64,
            pool,
            std::ptr::null_mut(),
        ));
        ok(cuCtxSynchronize());
        ok(cuCtxSetCurrent(c1));
        fill(kern, block, 0x7777, s1);
        ok(cuStreamSynchronize(s1));
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), block, 64));
        assert_eq!(back, [0x7777; 16], "GPU 1's kernel wrote the pool's block");
        assert_eq!(
            first.peek(block, 4).unwrap(),
            0x7777u32.to_le_bytes(),
            "on GPU 0"
        );
        ok(cuMemFreeAsync(block, s1));
        ok(cuStreamSynchronize(s1));
        ok(cuMemPoolDestroy(pool));
    }
    assert!(ctl_at(&omps_ring::sock::operator_socket_in(&dir), "quit").0);
    thread.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
