//! Host functions no longer block the caller: cuLaunchHostFunc and cuStreamAddCallback
//! return at once, and the functions run on a thread of the client once the stream
//! reaches them (the stream order itself is the GPU's: tested by rt/callbacks and
//! rt/host_func_order on a GPU).

mod common;
use common::*;
use omps_shim::api::exec::*;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static RAN: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn slow(data: *mut c_void) {
    std::thread::sleep(Duration::from_millis(300));
    RAN.fetch_add(data as usize, Ordering::SeqCst);
}

unsafe extern "C" fn callback(_s: CUstream, status: CUresult, data: *mut c_void) {
    assert_eq!(status, CUDA_SUCCESS);
    RAN.fetch_add(data as usize, Ordering::SeqCst);
}

#[test]
fn host_functions_run_without_blocking_the_caller() {
    let _srv = start_as_client("hostfn");
    // SAFETY: valid pointers; the functions take the argument as a count.
    unsafe {
        let mut s = null_mut();
        assert_eq!(cuStreamCreate(&mut s, 1), CUDA_SUCCESS);
        let t = Instant::now();
        assert_eq!(
            cuLaunchHostFunc(s, Some(slow), std::ptr::without_provenance_mut(1)),
            CUDA_SUCCESS
        );
        assert_eq!(
            cuStreamAddCallback(s, Some(callback), 10 as *mut c_void, 0),
            CUDA_SUCCESS
        );
        assert!(
            t.elapsed() < Duration::from_millis(150),
            "the caller waited for the host function"
        );
        // More than a page of slots: callers wait for free ones, none is lost.
        for _ in 0..1000 {
            assert_eq!(
                cuStreamAddCallback(s, Some(callback), 100 as *mut c_void, 0),
                CUDA_SUCCESS
            );
        }
        let t = Instant::now();
        while RAN.load(Ordering::SeqCst) != 100_011 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            RAN.load(Ordering::SeqCst),
            100_011,
            "every function ran once"
        );
        assert_eq!(
            cuLaunchHostFunc(s, None, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
    }
}
