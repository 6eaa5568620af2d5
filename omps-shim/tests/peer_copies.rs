//! Copies between two GPUs' memory through the shim's entry points (cuMemcpyPeer, its
//! asynchronous form, and a plain device-to-device copy across GPUs), on a server with two
//! host GPUs: the bytes arrive, each GPU's session checks its own side, and no direct
//! peer access is claimed. One test: the shim connects once per process.

mod common;
use common::*;
use omps_server::gpu::Gpu;
use omps_server::gpu_host::HostGpu;
use omps_server::{Server, ServerConfig};
use omps_shim::api::{ctx::*, device::*, mem::*, peer::*};
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::sync::Arc;

#[test]
fn copies_between_gpus_arrive_and_peer_access_is_not_claimed() {
    let dir = temp_dir("peer");
    let first = HostGpu::new(0, 1 << 28);
    let second = HostGpu::beside(&first, 1, 1 << 28);
    let gpus: Vec<Arc<dyn Gpu>> = vec![Arc::new(first), Arc::new(second)];
    let server = Server::new(ServerConfig::minimal(dir.clone()), gpus, 13000).expect("server");
    let thread = std::thread::spawn(move || server.run().expect("server runs"));
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
        let mut can = 1;
        ok(cuDeviceCanAccessPeer(&mut can, 0, 1));
        assert_eq!(can, 0, "no direct peer access");
        assert_eq!(cuCtxEnablePeerAccess(c1, 0), 217, "PEER_ACCESS_UNSUPPORTED");
        let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
        ok(cuCtxSetCurrent(c0));
        ok(cuMemAlloc_v2(&mut a, n));
        ok(cuMemcpyHtoD_v2(a, data.as_ptr() as *const c_void, n));
        ok(cuCtxSetCurrent(c1));
        ok(cuMemAlloc_v2(&mut b, n));
        ok(cuMemAlloc_v2(&mut c, n));
        // Pageable copies on both GPUs, through the one set of staging chunks.
        ok(cuMemcpyHtoD_v2(b, data.as_ptr() as *const c_void, n));
        ok(cuMemsetD8_v2(b, 0, n));
        ok(cuMemcpyPeer(b, c1, a, c0, n));
        ok(cuMemcpyPeerAsync(c, c1, b, c1, n, std::ptr::null_mut()));
        let mut back = vec![0u8; n];
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, c, n));
        assert!(back == data, "GPU 0 -> GPU 1 -> GPU 1 lost bytes");
        // Back the other way with a plain device-to-device copy across GPUs.
        ok(cuMemsetD8_v2(a, 0, n));
        ok(cuMemcpyDtoD_v2(a, c, n));
        ok(cuCtxSetCurrent(c0));
        let mut again = vec![0u8; n];
        ok(cuMemcpyDtoH_v2(again.as_mut_ptr() as *mut c_void, a, n));
        assert!(again == data, "GPU 1 -> GPU 0 lost bytes");
        // A range of neither GPU is refused, as natively.
        assert_eq!(
            cuMemcpyPeer(a, c0, 0xdead_0000, c1, 16),
            CUDA_ERROR_INVALID_VALUE
        );
    }
    assert!(ctl_at(&dir.join(omps_ring::sock::SOCKET_NAME), "quit").0);
    thread.join().unwrap();
}
