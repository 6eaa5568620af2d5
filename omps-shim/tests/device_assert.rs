//! The text of a failed device assert reaches the client when its synchronizing call
//! fails, and code that only asserts costs successful synchronizations nothing. Its own
//! test binary: it takes over this process's fd 1, and each process declares its code once.

mod common;
mod printing;
use common::*;
use omps_shim::api::ctx::*;
use omps_shim::cuda::*;
use printing::*;
use std::ptr::null_mut;

fn ok(r: CUresult) {
    assert_eq!(r, CUDA_SUCCESS, "CUDA call failed");
}

#[test]
fn an_asserts_text_arrives_with_the_failed_sync() {
    let srv = start_as_client("assert");
    let out = CapturedStdout::start();
    let err = CapturedStdout::fd(2);
    // SAFETY (whole test): every pointer passed is a valid local.
    let (quiet_out, quiet_err, sync, out_text, err_text, before) = unsafe {
        let image =
            "omps-host-module\nextern __assertfail\nfn print 0:8 8:4\nfn assert_fail 0:8 8:4\n\0";
        let print = kernel_with_text(image, c"print", "earlier text\n");
        let fail = kernel_with_text(image, c"assert_fail", "Assertion `x != 200` failed.\n");

        print(null_mut());
        ok(cuCtxSynchronize());
        let (quiet_out, quiet_err) = (out.text(0), err.text(0));
        let before = srv.ctl("status").1;
        fail(null_mut());
        let sync = cuCtxSynchronize();
        (
            quiet_out,
            quiet_err,
            sync,
            out.text(13),
            err.text(29),
            before,
        )
    };
    // Checked once fd 2 is back, so that a failure can be read.
    drop(err);
    drop(out);
    assert_eq!(
        (quiet_out.as_str(), quiet_err.as_str()),
        ("", ""),
        "a successful sync of assert-only code asks for nothing"
    );
    assert_eq!(sync, 710, "CUDA_ERROR_ASSERT");
    assert_eq!(
        out_text, "",
        "printf text cannot come from code that only asserts: it goes to the log"
    );
    let after = srv.ctl("status").1;
    assert!(
        after.contains("FAULT"),
        "an assert poisons the context as an illegal address does: {after}"
    );
    assert!(
        after.contains(
            "device printf sent to the server log (no single client to give it to): 13 bytes"
        ),
        "{after}"
    );
    assert_eq!(
        err_text, "Assertion `x != 200` failed.\n",
        "the assert's message, on fd 2"
    );
    assert!(
        !before.contains("device printf sent to the server log"),
        "{before}"
    );
    drop(srv);
}
