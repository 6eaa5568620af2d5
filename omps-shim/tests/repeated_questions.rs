//! Questions and settings that libraries repeat before every launch (a function's
//! attributes, occupancy, context limits) reach the server once; a change asks again. Counted with the
//! COMMANDS column of `ps`, which counts every record the server handles for a client.

mod common;
use common::*;
use omps_shim::api::module::*;
use omps_shim::api::query::*;
use omps_shim::cuda::*;

fn commands(srv: &TestServer) -> u64 {
    let (_, ps) = srv.ctl("ps");
    ps_field(&ps, std::process::id(), "COMMANDS")
        .expect("this process in ps")
        .parse()
        .unwrap()
}

#[test]
fn repeated_attribute_and_occupancy_questions_cost_one_round_trip() {
    const NUM_REGS: i32 = 4;
    const MAX_DYNAMIC_SHARED: i32 = 8;
    let srv = start_as_client("repeat");
    // SAFETY (whole test): every pointer passed below is a valid local.
    unsafe {
        let f = host_function(c"fill_u32");

        let asked = |before: u64| commands(&srv) - before;
        let c = commands(&srv);
        for _ in 0..3 {
            ok(cuFuncSetAttribute(f, MAX_DYNAMIC_SHARED, 1000));
        }
        assert_eq!(asked(c), 1, "a repeated set of the same value");
        let mut v = 0;
        let c = commands(&srv);
        for _ in 0..3 {
            ok(cuFuncGetAttribute(&mut v, NUM_REGS, f));
            assert_eq!(v, 32);
        }
        ok(cuFuncGetAttribute(&mut v, MAX_DYNAMIC_SHARED, f));
        assert_eq!(v, 1000);
        assert_eq!(asked(c), 1, "a repeated read");
        let c = commands(&srv);
        for _ in 0..3 {
            ok(cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut v, f, 256, 0,
            ));
            assert_eq!(v, 8);
        }
        ok(cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &mut v, f, 512, 0,
        ));
        assert_eq!(v, 4);
        assert_eq!(asked(c), 2, "one question per distinct occupancy question");

        // A new value is set, and the occupancy answers are asked again after it.
        let c = commands(&srv);
        ok(cuFuncSetAttribute(f, MAX_DYNAMIC_SHARED, 2000));
        ok(cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &mut v, f, 256, 0,
        ));
        assert_eq!(asked(c), 2, "a change and the question after it");
        // A refused value is not remembered as set: each try asks, and fails.
        let c = commands(&srv);
        for _ in 0..2 {
            assert_eq!(
                cuFuncSetAttribute(f, MAX_DYNAMIC_SHARED, 1 << 30),
                CUDA_ERROR_INVALID_VALUE
            );
        }
        ok(cuFuncGetAttribute(&mut v, MAX_DYNAMIC_SHARED, f));
        assert_eq!(v, 2000);
        assert_eq!(asked(c), 2, "refused sets");

        // This client's own limits: read once, read again after a change.
        const STACK_SIZE: i32 = 0;
        let c = commands(&srv);
        let mut lim = 0usize;
        for _ in 0..3 {
            ok(cuCtxGetLimit(&mut lim, STACK_SIZE));
        }
        assert_eq!(asked(c), 1, "a repeated limit read");
        let c = commands(&srv);
        ok(cuCtxSetLimit(STACK_SIZE, lim * 2));
        ok(cuCtxGetLimit(&mut lim, STACK_SIZE));
        ok(cuCtxGetLimit(&mut lim, STACK_SIZE));
        assert_eq!(asked(c), 2, "a limit set and the read after it");
        let mut again = 0usize;
        ok(cuCtxGetLimit(&mut again, STACK_SIZE));
        assert_eq!(again, lim);
    }
}
