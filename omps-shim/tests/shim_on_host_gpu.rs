//! The shim's exported entry points against a real server running on the host-memory GPU.
//! One test, run step by step: the shim holds one connection per process.

mod common;
use common::*;
use omps_shim::api::ctx::*;
use omps_shim::api::device::*;
use omps_shim::api::exec::*;
use omps_shim::api::mem::*;
use omps_shim::api::module::*;
use omps_shim::cuda::*;
use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

fn ok(r: CUresult) {
    assert_eq!(r, CUDA_SUCCESS, "CUDA call failed");
}

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

#[test]
fn driver_api_through_the_server() {
    let srv = TestServer::start("shim");
    // SAFETY: the test is single-threaded at this point; the shim reads this at cuInit.
    unsafe { std::env::set_var("OMPS_PIPE_DIRECTORY", &srv.dir) };
    // SAFETY (whole test): every pointer passed below is a valid local.
    unsafe {
        // Before cuInit nothing works.
        let mut n = 0;
        assert_eq!(cuDeviceGetCount(&mut n), CUDA_ERROR_NOT_INITIALIZED);
        ok(cuInit(0));
        ok(cuDeviceGetCount(&mut n));
        assert_eq!(n, 1);
        let mut dev = -1;
        ok(cuDeviceGet(&mut dev, 0));
        assert_eq!(cuDeviceGet(&mut dev, 1), CUDA_ERROR_INVALID_DEVICE);
        let mut name = [0i8; 64];
        ok(cuDeviceGetName(name.as_mut_ptr(), 64, 0));
        assert_eq!(
            CStr::from_ptr(name.as_ptr()).to_str().unwrap(),
            "omps host test device 0"
        );
        let mut sms = 0;
        ok(cuDeviceGetAttribute(&mut sms, 16, 0));
        assert_eq!(sms, 4);
        assert_eq!(
            cuDeviceGetAttribute(&mut sms, 250, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut total = 0usize;
        ok(cuDeviceTotalMem_v2(&mut total, 0));
        assert_eq!(total, 1 << 30);

        // No context yet: memory calls say so.
        let mut p: CUdeviceptr = 0;
        assert_eq!(cuMemAlloc_v2(&mut p, 16), CUDA_ERROR_INVALID_CONTEXT);
        let mut ctx = null_mut();
        ok(cuDevicePrimaryCtxRetain(&mut ctx, 0));
        ok(cuCtxSetCurrent(ctx));
        let mut d = -1;
        ok(cuCtxGetDevice(&mut d));
        assert_eq!(d, 0);

        // Copies larger than the staging area, in pieces that are not chunk multiples.
        let len = 6 * (1 << 20) + 123;
        ok(cuMemAlloc_v2(&mut p, len));
        let src = pattern(len, 7);
        ok(cuMemcpyHtoD_v2(p, src.as_ptr() as *const c_void, len));
        let mut back = vec![0u8; len];
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, p, len));
        assert!(back == src, "round trip through staging changed bytes");
        // Device to device, and a memset in the middle.
        let mut q: CUdeviceptr = 0;
        ok(cuMemAlloc_v2(&mut q, len));
        ok(cuMemcpyDtoD_v2(q, p, len));
        ok(cuMemsetD32_v2(q + 4096, 0xdeadbeef, 10));
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, q, len));
        assert_eq!(&back[..4096], &src[..4096]);
        assert_eq!(&back[4096..4100], &0xdeadbeefu32.to_le_bytes());
        assert_eq!(&back[4136..], &src[4136..]);

        // A few bytes travel inline in the record when they are whole aligned words;
        // other small copies go through a chunk. Either way the bytes arrive in order.
        let small = pattern(32, 9);
        for (off, n) in [(0usize, 4usize), (8, 8), (20, 6), (2, 4), (28, 4)] {
            ok(cuMemcpyHtoD_v2(
                q + off as u64,
                small[off..].as_ptr() as *const c_void,
                n,
            ));
        }
        let mut head = [0u8; 32];
        ok(cuMemcpyDtoH_v2(head.as_mut_ptr() as *mut c_void, q, 32));
        for (a, b) in [(0, 6), (8, 16), (20, 26), (28, 32)] {
            assert_eq!(&head[a..b], &small[a..b], "copied bytes {a}..{b}");
        }
        for (a, b) in [(6, 8), (16, 20), (26, 28)] {
            assert_eq!(&head[a..b], &src[a..b], "untouched bytes {a}..{b}");
        }

        // Out-of-bounds copies and bogus frees are refused synchronously.
        assert_eq!(
            cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, p + 1, len),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuMemFree_v2(p + 8), CUDA_ERROR_INVALID_VALUE);

        // Modules: functions come back with their parameter layout.
        let mut m = null_mut();
        ok(cuModuleLoadData(
            &mut m,
            HOST_MODULE.as_ptr() as *const c_void,
        ));
        let mut f = null_mut();
        ok(cuModuleGetFunction(&mut f, m, c"fill_u32".as_ptr()));
        assert_eq!(
            cuModuleGetFunction(&mut f, m, c"nope".as_ptr()),
            CUDA_ERROR_NOT_FOUND
        );
        ok(cuModuleGetFunction(&mut f, m, c"fill_u32".as_ptr()));
        let (mut ptr_arg, mut val, mut cnt) = (p, 0x01020304u32, 100u32);
        let mut args = [
            &mut ptr_arg as *mut _ as *mut c_void,
            &mut val as *mut _ as *mut c_void,
            &mut cnt as *mut _ as *mut c_void,
        ];
        let mut s = null_mut();
        ok(cuStreamCreate(&mut s, 1));
        ok(cuLaunchKernel(
            f,
            1,
            1,
            1,
            128,
            1,
            1,
            0,
            s,
            args.as_mut_ptr(),
            null_mut(),
        ));
        // Launches the driver would refuse are refused here, before anything is queued.
        assert_eq!(
            cuLaunchKernel(f, 1, 1, 1, 2048, 1, 1, 0, s, args.as_mut_ptr(), null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuLaunchKernel(f, 0, 1, 1, 32, 1, 1, 0, s, args.as_mut_ptr(), null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuLaunchKernel(
                null_mut(),
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                s,
                args.as_mut_ptr(),
                null_mut()
            ),
            CUDA_ERROR_INVALID_HANDLE
        );
        let mut e = null_mut();
        ok(cuEventCreate(&mut e, 0));
        ok(cuEventRecord(e, s));
        ok(cuEventSynchronize(e));
        ok(cuEventQuery(e));
        ok(cuStreamSynchronize(s));
        ok(cuStreamQuery(s));
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, p, 400));
        assert!(back[..400]
            .chunks(4)
            .all(|c| c == 0x01020304u32.to_le_bytes()));
        assert_eq!(&back[400..404], &src[400..404]);

        // The packed-buffer form of the arguments.
        let mut packed = [0u8; 16];
        packed[..8].copy_from_slice(&q.to_le_bytes());
        packed[8..12].copy_from_slice(&7u32.to_le_bytes());
        packed[12..16].copy_from_slice(&3u32.to_le_bytes());
        let mut size = 16usize;
        // CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE
        let (buffer_pointer, buffer_size) = (1usize, 2usize);
        let mut extra = [
            buffer_pointer as *mut c_void,
            packed.as_mut_ptr() as *mut c_void,
            buffer_size as *mut c_void,
            &mut size as *mut usize as *mut c_void,
            null_mut(),
        ];
        ok(cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            null_mut(),
            extra.as_mut_ptr(),
        ));
        ok(cuCtxSynchronize());
        let mut w = [0u32; 4];
        ok(cuMemcpyDtoH_v2(w.as_mut_ptr() as *mut c_void, q, 16));
        assert_eq!(&w[..3], &[7, 7, 7]);
        // A buffer shorter than the parameters, as NCCL passes its 4 KiB argument struct:
        // taken, the missing bytes zero (here the count: nothing is written).
        packed[8..12].copy_from_slice(&9u32.to_le_bytes());
        let mut short = 12usize;
        extra[3] = &mut short as *mut usize as *mut c_void;
        ok(cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            null_mut(),
            extra.as_mut_ptr(),
        ));
        ok(cuCtxSynchronize());
        ok(cuMemcpyDtoH_v2(w.as_mut_ptr() as *mut c_void, q, 16));
        assert_eq!(&w[..3], &[7, 7, 7], "count 0: nothing filled");

        // Globals are copyable ranges.
        let (mut g, mut gsize) = (0u64, 0usize);
        ok(cuModuleGetGlobal_v2(
            &mut g,
            &mut gsize,
            m,
            c"counter".as_ptr(),
        ));
        assert_eq!(gsize, 16);
        ok(cuMemcpyHtoD_v2(g, [9u8; 16].as_ptr() as *const c_void, 16));
        let mut gb = [0u8; 16];
        ok(cuMemcpyDtoH_v2(gb.as_mut_ptr() as *mut c_void, g, 16));
        assert_eq!(gb, [9u8; 16]);

        // Accounting: ps shows this process's memory (its allocations and the module's
        // 16-byte variable); frees come back once idle.
        let pid = std::process::id();
        let held = 2 * len as u64 + 16;
        let ps = srv.wait_ps(2, |ps| ps_mem(ps, pid) == Some(held));
        assert_eq!(ps_mem(&ps, pid), Some(held), "{ps}");
        ok(cuMemFree_v2(q));
        assert_eq!(cuMemFree_v2(q), CUDA_ERROR_INVALID_VALUE, "double free");
        let ps = srv.wait_ps(2, |ps| ps_mem(ps, pid) == Some(len as u64 + 16));
        assert_eq!(ps_mem(&ps, pid), Some(len as u64 + 16), "{ps}");

        // Destroyed handles are refused, not used.
        ok(cuEventDestroy_v2(e));
        assert_eq!(cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
        ok(cuStreamDestroy_v2(s));
        assert_eq!(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);

        // Unimplemented entry points say so.
        assert_eq!(
            omps_shim::unsupported::cuGraphAddExternalSemaphoresSignalNode(),
            CUDA_ERROR_NOT_SUPPORTED
        );

        // Error names.
        let mut msg = std::ptr::null();
        ok(cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &mut msg));
        assert_eq!(
            CStr::from_ptr(msg).to_str().unwrap(),
            "CUDA_ERROR_INVALID_VALUE"
        );

        // Last: a kernel fault surfaces at the next synchronizing call.
        let mut t = null_mut();
        ok(cuModuleGetFunction(&mut t, m, c"trap".as_ptr()));
        ok(cuLaunchKernel(
            t,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            null_mut(),
            null_mut(),
        ));
        assert_ne!(cuCtxSynchronize(), CUDA_SUCCESS);
    }
}
