//! Two GPUs from one process, through the shim's entry points, on a server with two host
//! GPUs that can reach each other: what peer access answers and how enabling it fails, a
//! library's kernel run on the device that is current when it launches, copies between
//! the GPUs (cuMemcpyPeer, its asynchronous form, a plain device-to-device copy across
//! GPUs), and memory freed on one GPU held while the client's work on the other has not
//! passed its fence. One test: the shim connects once per process.

mod common;
use common::*;
use omps_shim::api::{ctx::*, device::*, exec::*, mem::*, module::*, peer::*};
use omps_shim::cuda::*;
use omps_shim::state::streams::CUfunction;
use std::ffi::c_void;
use std::time::Duration;

const PEER_ACCESS_UNSUPPORTED: CUresult = 217;
const PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
const PEER_ACCESS_NOT_ENABLED: CUresult = 705;

#[test]
fn two_gpus_with_peer_access_copy_launch_and_fence_frees_on_both() {
    let (dir, first, second, thread) = linked_gpus_server("peer");
    // SAFETY: set before this test starts threads that read it; the shim reads it at cuInit.
    unsafe { std::env::set_var("OMPS_PIPE_DIRECTORY", &dir) };
    let n = 3 << 20; // more than one piece of the host bounce
    let data: Vec<u8> = (0..n).map(|i| (i * 7 + i / 4093) as u8).collect();
    // SAFETY (whole block): valid out-pointers and buffers of the sizes passed; handles made here.
    unsafe {
        ok(cuInit(0));
        let (mut c0, mut c1) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok(cuDevicePrimaryCtxRetain(&mut c0, 0));
        ok(cuDevicePrimaryCtxRetain(&mut c1, 1));

        // What the server enabled, as the snapshot tells it.
        let mut can = 0;
        ok(cuDeviceCanAccessPeer(&mut can, 0, 1));
        assert_eq!(can, 1, "GPU 0 reaches GPU 1");
        ok(cuDeviceCanAccessPeer(&mut can, 0, 0));
        assert_eq!(can, 0, "no device is its own peer");
        let mut v = -1;
        ok(cuDeviceGetP2PAttribute(&mut v, 2, 1, 0));
        assert_eq!(v, 1, "access supported");
        ok(cuDeviceGetP2PAttribute(&mut v, 4, 1, 0));
        assert_eq!(v, 0, "no array access on the host GPUs");
        assert_eq!(
            cuDeviceGetP2PAttribute(&mut v, 2, 0, 0),
            CUDA_ERROR_INVALID_DEVICE
        );
        assert_eq!(
            cuDeviceGetP2PAttribute(&mut v, 9, 0, 1),
            CUDA_ERROR_INVALID_VALUE
        );

        // Enabling and disabling, with the driver's errors.
        ok(cuCtxSetCurrent(c0));
        assert_eq!(cuCtxDisablePeerAccess(c1), PEER_ACCESS_NOT_ENABLED);
        assert_eq!(cuCtxEnablePeerAccess(c1, 1), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuCtxEnablePeerAccess(c0, 0), PEER_ACCESS_UNSUPPORTED);
        ok(cuCtxEnablePeerAccess(c1, 0));
        assert_eq!(cuCtxEnablePeerAccess(c1, 0), PEER_ACCESS_ALREADY_ENABLED);

        // A library loaded while GPU 0 is current runs its kernel on GPU 1 when GPU 1's
        // stream launches it (cudart loads every program's kernels this way).
        let (mut lib, mut kern) = (std::ptr::null_mut(), std::ptr::null_mut());
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
        let name = c"fill_u32";
        ok(cuLibraryGetKernel(&mut kern, lib, name.as_ptr()));
        ok(cuCtxSetCurrent(c1));
        let (mut on1, mut s1) = (0u64, std::ptr::null_mut());
        ok(cuMemAlloc_v2(&mut on1, 64));
        ok(cuStreamCreate(&mut s1, 0));
        let (mut value, mut count) = (0x5eed_u32, 16u32);
        let mut params = [
            &mut on1 as *mut u64 as *mut c_void,
            &mut value as *mut u32 as *mut c_void,
            &mut count as *mut u32 as *mut c_void,
        ];
        ok(cuLaunchKernel(
            kern as CUfunction,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            s1,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        ));
        let mut words = [0u32; 16];
        ok(cuStreamSynchronize(s1));
        ok(cuMemcpyDtoH_v2(words.as_mut_ptr() as *mut c_void, on1, 64));
        assert_eq!(words, [0x5eed; 16], "the kernel ran on GPU 1");
        let mut f1 = std::ptr::null_mut();
        ok(cuKernelGetFunction(&mut f1, kern));
        assert_ne!(f1, kern as CUfunction, "GPU 1's function of the library");

        // Copies between the GPUs: directly now that peer access is on.
        let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
        ok(cuCtxSetCurrent(c0));
        ok(cuMemAlloc_v2(&mut a, n));
        ok(cuMemcpyHtoD_v2(a, data.as_ptr() as *const c_void, n));
        ok(cuCtxSetCurrent(c1));
        ok(cuMemAlloc_v2(&mut b, n));
        ok(cuMemAlloc_v2(&mut c, n));
        ok(cuMemcpyHtoD_v2(b, data.as_ptr() as *const c_void, n));
        ok(cuMemsetD8_v2(b, 0, n));
        ok(cuMemcpyPeer(b, c1, a, c0, n));
        ok(cuMemcpyPeerAsync(c, c1, b, c1, n, std::ptr::null_mut()));
        let mut back = vec![0u8; n];
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, c, n));
        assert!(back == data, "GPU 0 -> GPU 1 -> GPU 1 lost bytes");
        ok(cuMemsetD8_v2(a, 0, n));
        ok(cuMemcpyDtoD_v2(a, c, n));
        ok(cuCtxSetCurrent(c0));
        let mut again = vec![0u8; n];
        ok(cuMemcpyDtoH_v2(again.as_mut_ptr() as *mut c_void, a, n));
        assert!(again == data, "GPU 1 -> GPU 0 lost bytes");
        assert_eq!(
            cuMemcpyPeer(a, c0, 0xdead_0000, c1, 16),
            CUDA_ERROR_INVALID_VALUE
        );

        // With peer access, memory freed on GPU 0 stays until the client's work on GPU 1
        // (whose fences do not pass while it is stuck) is done: a kernel there may use it.
        ok(cuCtxSynchronize());
        let before = first.bytes_allocated();
        let mut held = 0u64;
        ok(cuMemAlloc_v2(&mut held, 1 << 20));
        assert_eq!(first.bytes_allocated(), before + (1 << 20));
        second.stick_releases(true);
        ok(cuMemFree_v2(held));
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            first.bytes_allocated(),
            before + (1 << 20),
            "freed before the client's work on GPU 1 passed its fence"
        );
        second.stick_releases(false);
        assert!(
            eventually(|| first.bytes_allocated() == before),
            "never freed: {} bytes over",
            first.bytes_allocated() - before
        );

        ok(cuCtxDisablePeerAccess(c1));
        assert_eq!(cuCtxDisablePeerAccess(c1), PEER_ACCESS_NOT_ENABLED);
        // Only the library's own handle unloads it, on every device.
        ok(cuCtxSetCurrent(c1));
        let mut m1 = std::ptr::null_mut();
        ok(cuLibraryGetModule(&mut m1, lib));
        assert_ne!(m1, lib, "GPU 1's module of the library");
        assert_eq!(cuLibraryUnload(m1), CUDA_ERROR_INVALID_HANDLE);
        ok(cuLibraryUnload(lib));
        assert_eq!(
            cuKernelGetFunction(&mut f1, kern),
            CUDA_ERROR_INVALID_HANDLE,
            "its kernels went with it"
        );
        assert_eq!(
            cuLibraryUnload(lib),
            CUDA_ERROR_INVALID_HANDLE,
            "unloaded on both GPUs"
        );
    }
    assert!(ctl_at(&omps_ring::sock::operator_socket_in(&dir), "quit").0);
    thread.join().unwrap();
}
