//! Single driver calls that NVIDIA's cuda-samples make and omps once refused: CUDA 13's
//! cuCtxCreate with a zeroed CUctxCreateParams (every driver-API and NVRTC sample), the
//! answers to what it cannot grant (execution affinity, CIG), cuCtxResetPersistingL2Cache
//! (simpleAttributes), and a malloc heap set after another client's malloc code fixed the
//! shared context's heap (newdelete), and PTX loaded with JIT options whose logs come
//! back into the program's buffers (matrixMulDynlinkJIT).

mod common;
use common::*;
use omps_shim::api::ctx::*;
use omps_shim::api::ctx_params::*;
use omps_shim::api::module::*;
use omps_shim::api::query::*;
use omps_shim::conn::Conn;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::ptr::null_mut;

const MALLOC_HEAP_SIZE: i32 = 2;

#[test]
fn calls_the_samples_make() {
    // The server presizes the heap, as OMPS_MALLOC_HEAP_SIZE does (the host GPU's
    // default for every limit is 1024 bytes).
    let srv = start_as_client_with("samplecalls", |c| c.malloc_heap = Some("1M".into()));
    // SAFETY (whole test): every pointer passed is a valid local or a handle made here.
    unsafe {
        let mut primary = null_mut();
        ok(cuCtxGetCurrent(&mut primary));
        let mut c = null_mut();

        // Parameters that ask for nothing: a plain context, made current.
        let mut p = CtxCreateParams {
            exec_affinity: null_mut(),
            num_exec_affinity: 0,
            cig: null_mut(),
        };
        ok(cuCtxCreate_v4(&mut c, &mut p, 0, 0));
        let mut cur = null_mut();
        ok(cuCtxGetCurrent(&mut cur));
        assert_eq!(cur, c);
        ok(cuCtxDestroy_v2(c));
        ok(cuCtxCreate_v4(&mut c, null_mut(), 0, 0));
        ok(cuCtxDestroy_v2(c));
        assert_eq!(
            cuCtxCreate_v4(&mut c, &mut p, 0, 9),
            CUDA_ERROR_INVALID_DEVICE
        );

        // A count without its array; a negative count.
        p.num_exec_affinity = 1;
        assert_eq!(
            cuCtxCreate_v4(&mut c, &mut p, 0, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut aff = [ExecAffinityParam { ty: 0, value: 8 }];
        p.exec_affinity = aff.as_mut_ptr();
        p.num_exec_affinity = -1;
        assert_eq!(
            cuCtxCreate_v4(&mut c, &mut p, 0, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        // An SM count: not granted, as by the driver where it cannot.
        p.num_exec_affinity = 1;
        assert_eq!(
            cuCtxCreate_v4(&mut c, &mut p, 0, 0),
            CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY
        );
        assert_eq!(
            cuCtxCreate_v3(&mut c, aff.as_mut_ptr(), 1, 0, 0),
            CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY
        );
        (*p.exec_affinity).ty = 7;
        assert_eq!(
            cuCtxCreate_v4(&mut c, &mut p, 0, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut support = 9;
        ok(cuDeviceGetExecAffinitySupport(&mut support, 0, 0));
        assert_eq!(support, 0, "so programs that ask first never try");
        assert_eq!(
            cuDeviceGetExecAffinitySupport(&mut support, 7, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        // Both kinds at once; CIG alone (a graphics client's data) is not supported.
        let mut shared = 0u64;
        let mut cig = CigParam {
            data_type: 1,
            data: &mut shared as *mut u64 as *mut c_void,
        };
        p.cig = &mut cig;
        assert_eq!(
            cuCtxCreate_v4(&mut c, &mut p, 0, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        (p.exec_affinity, p.num_exec_affinity) = (null_mut(), 0);
        assert_eq!(
            cuCtxCreate_v4(&mut c, &mut p, 0, 0),
            CUDA_ERROR_NOT_SUPPORTED
        );
        (*p.cig).data = null_mut();
        assert_eq!(
            cuCtxCreate_v4(&mut c, &mut p, 0, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        // v3 with no affinity is a plain context.
        ok(cuCtxCreate_v3(&mut c, null_mut(), 0, 0, 0));
        ok(cuCtxDestroy_v2(c));
        ok(cuCtxGetCurrent(&mut cur));
        assert_eq!(cur, primary, "no refused create pushed a context");

        // The persisting L2 reset reaches the server's context.
        let resets = srv.gpu.l2_resets();
        ok(cuCtxResetPersistingL2Cache());
        assert_eq!(srv.gpu.l2_resets(), resets + 1);

        // Another client loads code that calls malloc: the shared context's heap is
        // fixed from then on. This client still sets its heap before its own malloc, as
        // natively, and reads its own value back; beyond what the server presized, the
        // driver's refusal.
        let other = Conn::connect_to(&srv.socket()).unwrap();
        load_image(&other, b"omps-host-module\nfn k\nextern malloc\n\0").expect("loads");
        let mut v = 0usize;
        ok(cuCtxGetLimit(&mut v, MALLOC_HEAP_SIZE));
        assert_eq!(v, 1024, "the driver's default, not the presized heap");
        ok(cuCtxSetLimit(MALLOC_HEAP_SIZE, 512 << 10));
        ok(cuCtxGetLimit(&mut v, MALLOC_HEAP_SIZE));
        assert_eq!(v, 512 << 10);
        assert_eq!(
            cuCtxSetLimit(MALLOC_HEAP_SIZE, 4 << 20),
            CUDA_ERROR_INVALID_VALUE
        );
        ok(cuCtxGetLimit(&mut v, MALLOC_HEAP_SIZE));
        assert_eq!(v, 512 << 10, "a refused set changes nothing");
        drop(other);

        jit_options_and_logs();
    }
}

/// cuModuleLoadDataEx of PTX with the options matrixMulDynlinkJIT passes (an info log
/// and its size, a register limit) and an error log: the server's driver compiles it
/// with the value options (the host GPU names them in its info log) and the logs land in
/// the program's buffers, truncated to their room, the size slots given what was written.
///
/// # Safety
/// Calls the shim's entry points with valid locals.
unsafe fn jit_options_and_logs() {
    const MAX_REGISTERS: i32 = 0;
    const INFO_LOG_BUFFER: i32 = 3;
    const INFO_LOG_SIZE: i32 = 4;
    const ERROR_LOG_BUFFER: i32 = 5;
    const ERROR_LOG_SIZE: i32 = 6;
    const INVALID_PTX: CUresult = 218;
    let load = |image: &[u8], info_room: usize| {
        let (mut info, mut error) = (vec![b'x'; info_room], vec![b'x'; 64]);
        let mut opts = [
            INFO_LOG_SIZE,
            INFO_LOG_BUFFER,
            MAX_REGISTERS,
            ERROR_LOG_SIZE,
            ERROR_LOG_BUFFER,
        ];
        let mut vals: [*mut c_void; 5] = [
            info_room as *mut c_void,
            info.as_mut_ptr() as *mut c_void,
            32 as *mut c_void,
            64 as *mut c_void,
            error.as_mut_ptr() as *mut c_void,
        ];
        let mut m = null_mut();
        // SAFETY: the option arrays hold 5 entries; the buffers the room given.
        let r = unsafe {
            cuModuleLoadDataEx(
                &mut m,
                image.as_ptr() as *const c_void,
                5,
                opts.as_mut_ptr(),
                vals.as_mut_ptr(),
            )
        };
        let text = |b: &[u8]| {
            let end = b.iter().position(|&c| c == 0).expect("NUL-terminated");
            String::from_utf8(b[..end].to_vec()).unwrap()
        };
        (
            r,
            m,
            text(&info),
            vals[0] as usize,
            text(&error),
            vals[3] as usize,
        )
    };
    let (r, m, info, info_len, error, error_len) = load(HOST_MODULE.as_bytes(), 1024);
    ok(r);
    assert!(info.contains("option 0 = 32"), "the register limit: {info}");
    assert_eq!(info_len, info.len());
    assert_eq!((error.as_str(), error_len), ("", 0));
    let mut f = null_mut();
    // SAFETY: valid out-pointer; a module and name of this test.
    unsafe { ok(cuModuleGetFunction(&mut f, m, c"fill_u32".as_ptr())) };
    // A log longer than its buffer: cut to the room, NUL-terminated.
    let (r, _, info, info_len, _, _) = load(HOST_MODULE.as_bytes(), 8);
    ok(r);
    assert_eq!((info.as_str(), info_len), ("option ", 7));
    // PTX that does not compile: the driver's error and its error log.
    let (r, _, _, _, error, error_len) = load(b"not a module\0", 64);
    assert_eq!(r, INVALID_PTX);
    assert_eq!((error.as_str(), error_len), ("not a module", 12));
}
