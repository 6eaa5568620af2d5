//! Device printf reaches the client's fd 1 by the time its synchronizing call returns:
//! the host GPU's `print` kernel fills the printf buffer, the server routes the text, and
//! the shim writes it out. Its own test binary, since it takes over this process's fd 1.

mod common;
mod printing;
use common::*;
use omps_shim::api::ctx::*;
use omps_shim::api::exec::*;
use omps_shim::api::mem::*;
use omps_shim::cuda::*;
use printing::*;
use std::ffi::c_void;
use std::ptr::null_mut;

fn ok(r: CUresult) {
    assert_eq!(r, CUDA_SUCCESS, "CUDA call failed");
}

#[test]
fn device_printf_reaches_the_client_before_its_sync_returns() {
    let srv = start_as_client("printf");
    let out = CapturedStdout::start();
    // SAFETY (whole test): every pointer passed is a valid local.
    unsafe {
        // Code that does not name vprintf: the shim asks for nothing after a sync.
        let quiet = printer("omps-host-module\nfn print 0:8 8:4\n\0", "first\n");
        quiet(null_mut());
        ok(cuCtxSynchronize());
        assert_eq!(
            out.text(0),
            "",
            "nothing is delivered for code that does not print"
        );

        // Code that calls vprintf: each synchronizing call delivers what was printed so far,
        // the earlier kernel's text included (this process is the only one that prints).
        let loud = printer(
            "omps-host-module\nextern vprintf\nfn print 0:8 8:4\n\0",
            "second\n",
        );
        loud(null_mut());
        ok(cuCtxSynchronize());
        assert_eq!(out.text(14), "first\nsecond\n");

        let mut s = null_mut();
        ok(cuStreamCreate(&mut s, 0));
        loud(s);
        ok(cuStreamSynchronize(s));
        assert_eq!(out.text(21), "first\nsecond\nsecond\n");

        let mut ev = null_mut();
        ok(cuEventCreate(&mut ev, 0));
        loud(s);
        ok(cuEventRecord(ev, s));
        ok(cuEventSynchronize(ev));
        assert_eq!(out.text(28), "first\nsecond\nsecond\nsecond\n");

        // A blocking copy delivers too.
        loud(null_mut());
        let mut p = 0;
        ok(cuMemAlloc_v2(&mut p, 4));
        let mut word = [0u8; 4];
        ok(cuMemcpyDtoH_v2(word.as_mut_ptr() as *mut c_void, p, 4));
        assert_eq!(out.text(35), "first\nsecond\nsecond\nsecond\nsecond\n");

        // A synchronization asks only while printing code was queued since one that
        // covered it: its stream's or the context's.
        ok(cuCtxSynchronize());
        let flushes = srv.gpu.printf_flushes();
        ok(cuCtxSynchronize());
        ok(cuStreamSynchronize(s));
        assert_eq!(srv.gpu.printf_flushes(), flushes, "nothing printed since");
        loud(s);
        ok(cuStreamSynchronize(null_mut()));
        ok(cuStreamSynchronize(null_mut()));
        assert_eq!(
            srv.gpu.printf_flushes(),
            flushes + 2,
            "another stream's sync asks"
        );
        ok(cuStreamSynchronize(s));
        ok(cuStreamSynchronize(s));
        ok(cuCtxSynchronize());
        assert_eq!(
            srv.gpu.printf_flushes(),
            flushes + 3,
            "the printing stream's sync covers it"
        );
        assert_eq!(
            out.text(42),
            "first\nsecond\nsecond\nsecond\nsecond\nsecond\n"
        );
    }
    drop(out);
    drop(srv);
}
