//! Memsets of and copies to page-locked host memory: natively the GPU writes it through its unified
//! address (XLA's autotuner memsets pinned words), so omps must not refuse them, whether
//! the server reaches the memory (cuMemHostAlloc) or not (registered pieces of pages).

mod common;
use common::*;
use omps_shim::api::ctx::*;
use omps_shim::api::device::*;
use omps_shim::api::exec::*;
use omps_shim::api::hostmem::*;
use omps_shim::api::mem::*;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::ptr::null_mut;

fn ok(r: CUresult) {
    assert_eq!(r, CUDA_SUCCESS, "CUDA call failed");
}

/// Set in the child process that plays the client.
const CLIENT: &str = "OMPS_TEST_HOST_MEMSET_CLIENT";

/// The server runs here; the client is this test run again in a child process, so its
/// page-locked memory is shared with the server as between two processes (in one process
/// the server cannot map it at the client's address, which is taken).
#[test]
fn memsets_reach_page_locked_memory() {
    if std::env::var_os(CLIENT).is_some() {
        return client();
    }
    let srv = TestServer::start("host-memset");
    run_client_child(&srv, "memsets_reach_page_locked_memory", CLIENT);
}

fn client() {
    // SAFETY (whole test): every pointer passed below is a valid local or the page-locked
    // allocation, which lives until cuMemFreeHost at the end.
    unsafe {
        ok(cuInit(0));
        let mut ctx = null_mut();
        ok(cuDevicePrimaryCtxRetain(&mut ctx, 0));
        ok(cuCtxSetCurrent(ctx));
        let mut s = null_mut();
        ok(cuStreamCreate(&mut s, 1));
        let mut host: *mut c_void = null_mut();
        ok(cuMemHostAlloc(&mut host, 4096, 0));
        let mut devptr = 0u64;
        ok(cuMemHostGetDevicePointer_v2(&mut devptr, host, 0));
        assert_eq!(
            devptr, host as u64,
            "the server maps the memory at its address"
        );
        let words = std::slice::from_raw_parts_mut(host as *mut u32, 1024);
        words.fill(7);

        // 8 bytes in the middle, as a stream-ordered memset: the words around stay.
        ok(cuMemsetD32Async(host as u64 + 16, 0xdead_beef, 2, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(&words[3..7], &[7, 0xdead_beef, 0xdead_beef, 7]);
        // The synchronous forms, bytes and halves.
        ok(cuMemsetD8_v2(host as u64 + 1000, 0xab, 3));
        let bytes = std::slice::from_raw_parts(host as *const u8, 4096);
        assert_eq!(&bytes[996..1004], &[7, 0, 0, 0, 0xab, 0xab, 0xab, 0]);
        ok(cuMemsetD16_v2(host as u64 + 2048, 0x1234, 4));
        assert_eq!(&words[512..515], &[0x1234_1234, 0x1234_1234, 7]);

        // Past the allocation's end, or memory this process never pinned: refused, as
        // before, and nothing outside the allocation is written.
        assert_eq!(
            cuMemsetD32Async(host as u64 + 4092, 1, 2, s),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut own = vec![5u32; 16];
        assert_eq!(
            cuMemsetD32_v2(own.as_mut_ptr() as u64, 1, 16),
            CUDA_ERROR_INVALID_VALUE
        );
        assert!(own.iter().all(|&w| w == 5));
        ok(cuStreamSynchronize(s));
        ok(cuMemFreeHost(host));

        // Program memory registered in pieces that are not whole pages (the server cannot
        // map it): the memset is done here, after the stream's earlier work.
        let mut mine = vec![9u32; 100];
        let base = mine.as_mut_ptr().add(3) as *mut c_void;
        ok(cuMemHostRegister_v2(base, 40 * 4, 0));
        ok(cuMemsetD32Async(base as u64 + 8, 0x5151_5151, 4, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(
            &mine[4..11],
            &[9, 0x5151_5151, 0x5151_5151, 0x5151_5151, 0x5151_5151, 9, 9]
        );
        // Past the registered piece: refused, nothing written.
        assert_eq!(
            cuMemsetD32Async(base as u64 + 38 * 4, 1, 4, s),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(mine[41..46], [9; 5]);
        ok(cuMemHostUnregister(base));

        copies_that_name_the_wrong_side(s);
        registered_piece_device_pointer(s);
    }
}

/// NPP registers a 4-byte stack variable, asks for its device pointer and has a kernel
/// write a count there: a piece of a page, which the server cannot map, gets a mirror
/// (api/host_mirror.rs) whose writes the program sees once it synchronizes, and whose
/// reads see the program's writes.
///
/// # Safety
/// `s` is a live stream of the current context.
unsafe fn registered_piece_device_pointer(s: CUstream) {
    // SAFETY (whole function): every pointer is a live local or the registered piece,
    // which stays registered until the end.
    unsafe {
        let mut mine = vec![5u32; 64];
        let base = mine.as_mut_ptr().add(3) as *mut c_void;
        ok(cuMemHostRegister_v2(base, 8 * 4, 2));
        let mut devptr = 0u64;
        ok(cuMemHostGetDevicePointer_v2(&mut devptr, base, 0));
        assert_ne!(devptr, base as u64, "a mirror, not the program's address");
        let mut again = 0u64;
        ok(cuMemHostGetDevicePointer_v2(
            &mut again,
            (base as *mut u32).add(2) as *mut c_void,
            0,
        ));
        assert_eq!(again, devptr + 8, "one mirror for the piece");
        // A kernel writes through the device pointer; after the sync the program sees it.
        fill_kernel(devptr + 4, 0xabcd, 2, s);
        ok(cuStreamSynchronize(s));
        assert_eq!(&mine[2..8], &[5, 5, 0xabcd, 0xabcd, 5, 5]);
        // The program writes its memory; the GPU reads it through the device pointer.
        mine[9] = 0x600d;
        let mut d = 0u64;
        ok(cuMemAlloc_v2(&mut d, 64));
        ok(cuMemcpyDtoD_v2(d, devptr + 24, 4));
        let mut back = 0u32;
        ok(cuMemcpyDtoH_v2(&mut back as *mut u32 as *mut c_void, d, 4));
        assert_eq!(back, 0x600d);
        ok(cuMemHostUnregister(base));
        // Past the unregistration the mirror is gone: the program's memory is its own.
        assert_eq!(
            cuMemHostGetDevicePointer_v2(&mut again, base, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        fill_kernel(d, 1, 1, s);
        ok(cuStreamSynchronize(s));
        assert_eq!(mine[4], 0xabcd);
        ok(cuMemFree_v2(d));
    }
}

/// XLA's autotuner copies a word into a pinned buffer with cuMemcpyDtoD: under unified
/// addressing the driver takes page-locked memory on either side of a copy whatever the
/// copy's name says, so omps must too (it answered INVALID_VALUE).
///
/// # Safety
/// `s` is a live stream of the current context.
unsafe fn copies_that_name_the_wrong_side(s: CUstream) {
    // SAFETY (whole function): every pointer is a live local, the device allocation, or
    // the page-locked allocation, which live until freed at the end.
    unsafe {
        let mut pinned: *mut c_void = null_mut();
        ok(cuMemHostAlloc(&mut pinned, 4096, 0));
        let pw = std::slice::from_raw_parts_mut(pinned as *mut u32, 1024);
        pw.fill(1);
        let mut d = 0u64;
        ok(cuMemAlloc_v2(&mut d, 64));
        let src: Vec<u32> = (100..116).collect();
        ok(cuMemcpyHtoD_v2(d, src.as_ptr() as *const c_void, 64));

        // Device to pinned, named DtoD, in stream order and at once.
        ok(cuMemcpyDtoDAsync_v2(pinned as u64 + 8, d, 8, s));
        ok(cuStreamSynchronize(s));
        assert_eq!(&pw[1..5], &[1, 100, 101, 1]);
        ok(cuMemcpyDtoD_v2(pinned as u64 + 64, d + 8, 8));
        assert_eq!(&pw[15..19], &[1, 102, 103, 1]);
        // Pinned to device, named DtoD; then read back with the right name.
        pw[32] = 0xfeed;
        ok(cuMemcpyDtoD_v2(d, pinned as u64 + 128, 4));
        let mut back = [0u32; 2];
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, d, 8));
        assert_eq!(back, [0xfeed, 101]);
        // Pinned where HtoD and DtoH name the device side: pinned to pageable and back.
        let mut own = [0u32; 2];
        ok(cuMemcpyDtoH_v2(
            own.as_mut_ptr() as *mut c_void,
            pinned as u64 + 8,
            8,
        ));
        assert_eq!(own, [100, 101]);
        let word = [0x77u32];
        ok(cuMemcpyHtoDAsync_v2(
            pinned as u64 + 256,
            word.as_ptr() as *const c_void,
            4,
            s,
        ));
        ok(cuStreamSynchronize(s));
        assert_eq!(pw[64], 0x77);
        // Memory that is neither the client's device memory nor page-locked: still refused.
        let mut plain = vec![3u32; 4];
        assert_eq!(
            cuMemcpyDtoD_v2(plain.as_mut_ptr() as u64, d, 8),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(plain, [3; 4]);
        ok(cuMemFree_v2(d));
        ok(cuMemFreeHost(pinned));
    }
}
