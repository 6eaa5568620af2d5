//! Managed memory through the shim: one pointer the CPU and kernels both use, copies
//! and memsets that take it as device memory, advice and prefetch locations read back
//! per page, attachment checks, and the free. The client is a child process: managed
//! memory is mapped at one address in the client and in the server, which must be two
//! processes for that.

mod common;
use common::*;
use omps_shim::api::exec::*;
use omps_shim::api::hostmem::*;
use omps_shim::api::managed::*;
use omps_shim::api::mem::*;
use omps_shim::cuda::*;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

const WORDS: usize = 4096; // four pages

fn attr(a: u32, p: u64, len: usize) -> c_int {
    let mut v: c_int = 0;
    // SAFETY: an int to write.
    ok(unsafe { cuMemRangeGetAttribute(&mut v as *mut c_int as *mut c_void, 4, a, p, len) });
    v
}

#[test]
fn managed_memory_is_one_pointer_for_cpu_and_gpu() {
    let srv = TestServer::start("managed");
    let report = srv.dir.join("client-report");
    // SAFETY: the child runs only the shim and this test's checks, then exits.
    match unsafe { libc::fork() } {
        0 => {
            let to = report.clone();
            std::panic::set_hook(Box::new(move |info| {
                let _ = std::fs::write(&to, info.to_string());
            }));
            let r = std::panic::catch_unwind(|| client(&srv.dir));
            // SAFETY: leaves the child without running the parent's exit handlers.
            unsafe { libc::_exit(i32::from(r.is_err())) }
        }
        pid => {
            assert!(pid > 0, "fork");
            let mut status = 0;
            // SAFETY: our child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            let msg = std::fs::read_to_string(&report).unwrap_or_default();
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "client (status {status:#x}): {msg}"
            );
        }
    }
}

fn client(dir: &std::path::Path) {
    use omps_shim::api::{ctx::*, device::*};
    // SAFETY: the child has one thread.
    unsafe { std::env::set_var("OMPS_PIPE_DIRECTORY", dir) };
    let mut ctx = null_mut();
    // SAFETY: valid out-pointer.
    unsafe {
        ok(cuInit(0));
        ok(cuDevicePrimaryCtxRetain(&mut ctx, 0));
        ok(cuCtxSetCurrent(ctx));
    }
    let f = host_function(c"fill_u32");
    // SAFETY (whole test): every pointer passed is a valid local, a handle made here, or
    // managed memory of WORDS words.
    unsafe {
        let mut m = 0u64;
        assert_eq!(
            cuMemAllocManaged(&mut m, 4 * WORDS, 3),
            CUDA_ERROR_INVALID_VALUE,
            "attach flags"
        );
        ok(cuMemAllocManaged(&mut m, 4 * WORDS, 1));
        let host = std::slice::from_raw_parts_mut(m as *mut u32, WORDS);
        host.iter_mut().enumerate().for_each(|(i, w)| *w = i as u32);

        // A kernel fills the first half; the CPU reads it after the synchronize.
        let (mut p, mut v, mut n) = (m, 7u32, (WORDS / 2) as u32);
        let mut args = [
            &mut p as *mut _ as *mut c_void,
            &mut v as *mut _ as *mut c_void,
            &mut n as *mut _ as *mut c_void,
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
            args.as_mut_ptr(),
            null_mut(),
        ));
        ok(omps_shim::api::ctx::cuCtxSynchronize());
        assert!(host[..WORDS / 2].iter().all(|&w| w == 7));
        assert_eq!(host[WORDS / 2], (WORDS / 2) as u32, "untouched half");

        // Memset and copies take it as device memory.
        ok(cuMemsetD32_v2(m + 4 * 8, 9, 8));
        assert_eq!(&host[6..18], &[7, 7, 9, 9, 9, 9, 9, 9, 9, 9, 7, 7]);
        let mut d = 0u64;
        ok(cuMemAlloc_v2(&mut d, 4 * WORDS));
        ok(cuMemcpyDtoD_v2(d, m, 4 * WORDS));
        let mut back = vec![0u32; WORDS];
        ok(cuMemcpyDtoH_v2(
            back.as_mut_ptr() as *mut c_void,
            d,
            4 * WORDS,
        ));
        assert_eq!(back, host.to_vec());
        ok(cuMemcpyHtoD_v2(m, [5u32; 4].as_ptr() as *const c_void, 16));
        assert_eq!(&host[..5], &[5, 5, 5, 5, 7]);

        // Pointer attributes: managed, device 0, the same pointer both ways.
        let mut is_managed = 0u32;
        ok(cuPointerGetAttribute(
            &mut is_managed as *mut u32 as *mut c_void,
            8,
            m + 12,
        ));
        assert_eq!(is_managed, 1);
        let mut hp = 0u64;
        ok(cuPointerGetAttribute(
            &mut hp as *mut u64 as *mut c_void,
            4,
            m,
        ));
        assert_eq!(hp, m);
        ok(cuPointerGetAttribute(
            &mut is_managed as *mut u32 as *mut c_void,
            8,
            d,
        ));
        assert_eq!(is_managed, 0, "device memory is not managed");

        // Advice and prefetches, per page: the range answers what all its pages share.
        let dev0 = MemLocation { ty: 1, id: 0 };
        let host_loc = MemLocation { ty: 2, id: 0 };
        assert_eq!(attr(1, m, 4 * WORDS), 0);
        assert_eq!(attr(4, m, 4 * WORDS), -2, "never prefetched");
        ok(cuMemAdvise_v2(m, 4096, 1, dev0));
        assert_eq!(attr(1, m, 4096), 1, "read-mostly page");
        assert_eq!(attr(1, m, 4 * WORDS), 0, "not every page");
        ok(cuMemAdvise_v2(m, 4 * WORDS, 3, dev0));
        assert_eq!(
            (attr(2, m, 8192), attr(5, m, 8192), attr(6, m, 8192)),
            (0, 1, 0)
        );
        ok(cuMemAdvise(m + 8192, 4096, 3, -1));
        assert_eq!(attr(2, m + 8192, 100), -1, "the host, in the legacy form");
        assert_eq!(attr(2, m, 4 * WORDS), -2, "no one location");
        ok(cuMemAdvise_v2(m, 4 * WORDS, 5, dev0));
        let mut by = [0 as c_int; 3];
        ok(cuMemRangeGetAttribute(
            by.as_mut_ptr() as *mut c_void,
            12,
            3,
            m,
            4 * WORDS,
        ));
        assert_eq!(by, [0, -2, -2]);
        assert_eq!(
            cuMemAdvise_v2(m, 4096, 5, host_loc),
            CUDA_ERROR_INVALID_DEVICE,
            "accessed-by names a device"
        );
        ok(cuMemPrefetchAsync_v2(m, 4 * WORDS, dev0, 0, null_mut()));
        assert_eq!(
            (attr(4, m, 4 * WORDS), attr(7, m, 4), attr(8, m, 4)),
            (0, 1, 0)
        );
        ok(cuMemPrefetchAsync(m, 4096, -1, null_mut()));
        assert_eq!(attr(4, m, 4096), -1);
        assert_eq!(
            cuMemPrefetchAsync_v2(d, 4096, dev0, 0, null_mut()),
            CUDA_ERROR_INVALID_VALUE,
            "device memory is not managed"
        );
        assert_eq!(
            cuMemPrefetchAsync_v2(m, 8 * WORDS, dev0, 0, null_mut()),
            CUDA_ERROR_INVALID_VALUE,
            "past the allocation"
        );
        let mut vals = [0 as c_int; 2];
        let mut data = [
            &mut vals[0] as *mut c_int as *mut c_void,
            &mut vals[1] as *mut c_int as *mut c_void,
        ];
        ok(cuMemRangeGetAttributes(
            data.as_mut_ptr(),
            [4, 4].as_ptr(),
            [1, 5].as_ptr(),
            2,
            m,
            4096,
        ));
        assert_eq!(vals, [1, 1]);

        ok(cuStreamAttachMemAsync(null_mut(), m, 0, 4));
        assert_eq!(
            cuStreamAttachMemAsync(null_mut(), m + 4096, 0, 4),
            CUDA_ERROR_INVALID_VALUE
        );

        assert_eq!(
            cuMemFreeHost(m as *mut c_void),
            CUDA_ERROR_INVALID_VALUE,
            "not host memory"
        );
        assert_eq!(
            cuMemFree_v2(m + 4),
            CUDA_ERROR_INVALID_VALUE,
            "not its start"
        );
        ok(cuMemFree_v2(m));
        assert_eq!(attr_err(m), CUDA_ERROR_INVALID_VALUE, "gone");
        ok(cuMemFree_v2(d));
    }
}

fn attr_err(p: u64) -> CUresult {
    let mut v: c_int = 0;
    // SAFETY: an int to write.
    unsafe { cuMemRangeGetAttribute(&mut v as *mut c_int as *mut c_void, 4, 1, p, 4) }
}
