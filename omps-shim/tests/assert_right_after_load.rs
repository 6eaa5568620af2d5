//! A kernel that asserts as soon as its module is loaded: its message still reaches the
//! client. The server reads the module's printf level on the worker; were the router told
//! only on the control thread's next pass (up to 50 ms later), text written before that
//! would find no printing client and go to the log, as rt/device_assert's did on the GPU.
//! Its own test binary: it takes over this process's fd 2.

mod common;
mod printing;
use common::*;
use omps_shim::api::ctx::*;
use printing::*;
use std::ptr::null_mut;

#[test]
fn an_assert_at_once_after_the_load_reaches_the_client() {
    let srv = start_as_client("assert-at-once");
    let err = CapturedStdout::fd(2);
    // SAFETY: every pointer passed is a valid local.
    let (sync, err_text) = unsafe {
        let image = "omps-host-module\nextern __assertfail\nfn assert_fail 0:8 8:4\n\0";
        let fail = kernel_with_text(image, c"assert_fail", "Assertion `v[i] != bad` failed.\n");
        fail(null_mut());
        (cuCtxSynchronize(), err.text(32))
    };
    drop(err);
    assert_eq!(sync, 710, "CUDA_ERROR_ASSERT");
    assert_eq!(
        err_text, "Assertion `v[i] != bad` failed.\n",
        "the message, on fd 2"
    );
    let status = srv.ctl("status").1;
    assert!(
        !status.contains("device printf sent to the server log"),
        "{status}"
    );
    drop(srv);
}
