//! Entry points PyTorch's stack needs beyond a plain runtime program, against a server on
//! the host-memory GPU: stream-ordered allocation and pools, per-client context limits,
//! capture queries, stream attributes. One test: the shim holds one connection per process.

mod common;
use common::*;
use omps_shim::api::ctx::*;
use omps_shim::api::device::*;
use omps_shim::api::exec::*;
use omps_shim::api::link::*;
use omps_shim::api::mem::*;
use omps_shim::api::pool::*;
use omps_shim::api::query::*;
use omps_shim::api::stream_info::*;
use omps_shim::api::tensor_map::*;
use omps_shim::api::vmm::*;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::ptr::null_mut;

fn ok(r: CUresult) {
    assert_eq!(r, CUDA_SUCCESS, "CUDA call failed");
}

#[test]
fn pools_limits_and_stream_queries() {
    let srv = TestServer::start("surface");
    // SAFETY: single-threaded here; the shim reads this at cuInit.
    unsafe { std::env::set_var("OMPS_PIPE_DIRECTORY", &srv.dir) };
    // SAFETY (whole test): every pointer passed below is a valid local.
    unsafe {
        ok(cuInit(0));
        let mut ctx = null_mut();
        ok(cuDevicePrimaryCtxRetain(&mut ctx, 0));
        ok(cuCtxSetCurrent(ctx));
        let (mut s1, mut s2) = (null_mut(), null_mut());
        ok(cuStreamCreate(&mut s1, 1));
        ok(cuStreamCreate(&mut s2, 1));
        let base = srv.gpu.bytes_allocated();

        // The default pool keeps nothing by default: a free returns the memory.
        let mut p = 0;
        ok(cuMemAllocAsync(&mut p, 1 << 20, s1));
        assert_eq!(srv.gpu.bytes_allocated(), base + (1 << 20));
        ok(cuMemFreeAsync(p, s1));
        ok(cuStreamSynchronize(s1));
        wait_for(|| srv.gpu.bytes_allocated() == base, "threshold 0 frees");

        // With a threshold, a freed block comes back on the stream that freed it, and
        // never on another stream.
        let mut pool = null_mut();
        ok(cuDeviceGetMemPool(&mut pool, 0));
        let max = u64::MAX;
        ok(cuMemPoolSetAttribute(
            pool,
            4,
            &max as *const u64 as *const c_void,
        ));
        let (mut a, mut b, mut c) = (0, 0, 0);
        ok(cuMemAllocAsync(&mut a, 4096, s1));
        ok(cuMemFreeAsync(a, s1));
        ok(cuMemAllocAsync(&mut b, 4096, s2));
        assert_ne!(a, b, "a block freed on s1 is not handed to s2");
        ok(cuMemAllocAsync(&mut c, 4000, s1));
        assert_eq!(a, c, "same stream, fitting size: reused");
        let mut used = 0u64;
        ok(cuMemPoolGetAttribute(
            pool,
            7,
            &mut used as *mut u64 as *mut c_void,
        ));
        assert_eq!(used, 8192);
        ok(cuMemFreeAsync(b, s2));
        ok(cuMemFreeAsync(c, s1));
        let mut reserved = 0u64;
        ok(cuMemPoolGetAttribute(
            pool,
            5,
            &mut reserved as *mut u64 as *mut c_void,
        ));
        assert_eq!(reserved, 8192, "both blocks kept");
        ok(cuMemPoolTrimTo(pool, 0));
        ok(cuStreamSynchronize(s1));
        wait_for(|| srv.gpu.bytes_allocated() == base, "trim frees");

        // A pool of one's own: made current, destroyed, and the default comes back.
        #[repr(C)]
        struct Props([u32; 4], [u8; 80]);
        let props = Props([1, 0, 1, 0], [0; 80]);
        let mut mine = null_mut();
        ok(cuMemPoolCreate(
            &mut mine,
            &props as *const Props as *const _,
        ));
        ok(cuDeviceSetMemPool(0, mine));
        let mut d = 0;
        ok(cuMemAllocFromPoolAsync(&mut d, 64, mine, s1));
        ok(cuMemFreeAsync(d, s1));
        let mut dflt = null_mut();
        ok(cuDeviceGetDefaultMemPool(&mut dflt, 0));
        assert_eq!(cuMemPoolDestroy(dflt), CUDA_ERROR_INVALID_VALUE);
        ok(cuMemPoolDestroy(mine));
        let mut cur = null_mut();
        ok(cuDeviceGetMemPool(&mut cur, 0));
        assert_eq!(cur, dflt);
        assert_eq!(
            cuMemAllocFromPoolAsync(&mut d, 64, mine, s1),
            CUDA_ERROR_INVALID_HANDLE
        );
        let bad = Props([1, 2, 1, 0], [0; 80]);
        assert_eq!(
            cuMemPoolCreate(&mut mine, &bad as *const Props as *const _),
            CUDA_ERROR_NOT_SUPPORTED,
            "exportable pools are refused, not silently made private"
        );
        wait_for(
            || srv.gpu.bytes_allocated() == base,
            "a destroyed pool's blocks freed",
        );

        // Virtual memory: reserve, back with a handle, map, copy through, unmap, free.
        #[repr(C)]
        struct VmmProp([u32; 4], u64, [u8; 8]);
        let prop = VmmProp([1, 0, 1, 0], 0, [0; 8]);
        let prop_ptr = &prop as *const VmmProp as *const _;
        let mut g = 0usize;
        ok(cuMemGetAllocationGranularity(&mut g, prop_ptr, 0));
        assert!(g.is_power_of_two());
        let mut va = 0;
        ok(cuMemAddressReserve(&mut va, 4 * g, 0, 0, 0));
        let mut h = 0u64;
        ok(cuMemCreate(&mut h, 2 * g, prop_ptr, 0));
        ok(cuMemMap(va + g as u64, 2 * g, 0, h, 0));
        let mapped = srv.gpu.bytes_allocated();
        assert_eq!(
            cuMemMap(va + 2 * g as u64, g, 0, h, 0),
            CUDA_ERROR_INVALID_VALUE,
            "overlapping mapping refused"
        );
        let access = [1u32, 0, 3];
        ok(cuMemSetAccess(
            va + g as u64,
            2 * g,
            access.as_ptr() as *const _,
            1,
        ));
        let data: Vec<u8> = (0..g).map(|i| i as u8).collect();
        ok(cuMemcpyHtoD_v2(
            va + g as u64 + 7,
            data.as_ptr() as *const c_void,
            g,
        ));
        let mut back = vec![0u8; g];
        ok(cuMemcpyDtoH_v2(
            back.as_mut_ptr() as *mut c_void,
            va + g as u64 + 7,
            g,
        ));
        assert_eq!(back, data);
        assert_eq!(
            cuMemcpyHtoD_v2(va, data.as_ptr() as *const c_void, 16),
            CUDA_ERROR_INVALID_VALUE,
            "the unmapped part of a reservation is no memory"
        );
        // A tensor across the seam of two mappings (PyTorch's expandable segments).
        let mut h3 = 0u64;
        ok(cuMemCreate(&mut h3, g, prop_ptr, 0));
        ok(cuMemMap(va + 3 * g as u64, g, 0, h3, 0));
        ok(cuMemSetAccess(
            va + 3 * g as u64,
            g,
            access.as_ptr() as *const _,
            1,
        ));
        let seam = va + 3 * g as u64 - 8;
        ok(cuMemcpyHtoD_v2(seam, data.as_ptr() as *const c_void, 16));
        let mut across = [0u8; 16];
        ok(cuMemcpyDtoH_v2(
            across.as_mut_ptr() as *mut c_void,
            seam,
            16,
        ));
        assert_eq!(&across[..], &data[..16]);
        ok(cuMemUnmap(va + 3 * g as u64, g));
        ok(cuMemRelease(h3));
        let mut h2 = 0u64;
        ok(cuMemRetainAllocationHandle(
            &mut h2,
            (va + g as u64 + 1) as *mut c_void,
        ));
        assert_eq!(h2, h);
        ok(cuMemRelease(h2));
        ok(cuMemRelease(h));
        assert_eq!(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            cuMemAddressFree(va, 4 * g),
            CUDA_ERROR_INVALID_VALUE,
            "still mapped"
        );
        ok(cuMemUnmap(va + g as u64, 2 * g));
        wait_for(
            || srv.gpu.bytes_allocated() == mapped - 2 * g as u64,
            "unmapped handles released",
        );
        ok(cuMemAddressFree(va, 4 * g));

        // JIT linking: inputs go to the server's linker, the image and logs come back.
        let mut info = [0u8; 64];
        let mut opts = [3u32, 4, 7];
        let mut vals = [
            info.as_mut_ptr() as *mut c_void,
            64 as *mut c_void,
            4 as *mut c_void,
        ];
        let mut st = null_mut();
        ok(cuLinkCreate_v2(
            3,
            opts.as_mut_ptr(),
            vals.as_mut_ptr(),
            &mut st,
        ));
        let (a, b) = (b"first piece ".to_vec(), vec![7u8; 3 << 20]);
        // Two objects (CU_JIT_INPUT_OBJECT): the linker bounds them by their lengths.
        ok(cuLinkAddData_v2(
            st,
            3,
            a.as_ptr() as *const c_void,
            a.len(),
            c"a".as_ptr(),
            0,
            null_mut(),
            null_mut(),
        ));
        ok(cuLinkAddData_v2(
            st,
            3,
            b.as_ptr() as *const c_void,
            b.len(),
            c"b".as_ptr(),
            0,
            null_mut(),
            null_mut(),
        ));
        let (mut img, mut len) = (null_mut(), 0usize);
        ok(cuLinkComplete(st, &mut img, &mut len));
        let img = std::slice::from_raw_parts(img as *const u8, len);
        assert!(
            img.starts_with(b"omps-host-linked\nfirst piece "),
            "image fetched in pieces"
        );
        assert_eq!(len, 17 + a.len() + b.len());
        let log = std::ffi::CStr::from_ptr(info.as_ptr() as *const _)
            .to_str()
            .unwrap();
        assert_eq!(
            log, "1 options, 2 inputs",
            "only the value option is forwarded"
        );
        assert_eq!(vals[1] as usize, log.len(), "the log size is written back");
        ok(cuLinkDestroy(st));
        assert_eq!(cuLinkDestroy(st), CUDA_ERROR_INVALID_HANDLE);
        // A cubin or fatbin shorter than its headers: the driver would read past the
        // server's copy; refused (issue 23, finding 1), and the server serves on. (PTX with
        // no NUL gets one in the server's copy: session/link.rs.)
        for (kind, bad) in [
            (0u32, b"\x7fELF\x02".to_vec()),
            (2, vec![0x50, 0xed, 0x55, 0xba]),
        ] {
            ok(cuLinkCreate_v2(0, null_mut(), null_mut(), &mut st));
            ok(cuLinkAddData_v2(
                st,
                kind,
                bad.as_ptr() as *const c_void,
                bad.len(),
                c"bad".as_ptr(),
                0,
                null_mut(),
                null_mut(),
            ));
            let (mut img, mut len) = (null_mut(), 0usize);
            assert_eq!(
                cuLinkComplete(st, &mut img, &mut len),
                CUDA_ERROR_INVALID_IMAGE,
                "input kind {kind}"
            );
            ok(cuLinkDestroy(st));
        }
        // PTX sent with a length of strlen (no NUL), which the driver takes: the server's
        // copy gets the NUL the driver reads up to.
        ok(cuLinkCreate_v2(0, null_mut(), null_mut(), &mut st));
        let ptx = b".version 8.0";
        ok(cuLinkAddData_v2(
            st,
            1,
            ptx.as_ptr() as *const c_void,
            ptx.len(),
            c"p".as_ptr(),
            0,
            null_mut(),
            null_mut(),
        ));
        let (mut img, mut len) = (null_mut(), 0usize);
        ok(cuLinkComplete(st, &mut img, &mut len));
        let img = std::slice::from_raw_parts(img as *const u8, len);
        assert!(img.ends_with(b".version 8.0\0"), "the PTX went with a NUL");
        ok(cuLinkDestroy(st));
        let mut err = [0u8; 32];
        let mut eopts = [5u32, 6];
        let mut evals = [err.as_mut_ptr() as *mut c_void, 32 as *mut c_void];
        ok(cuLinkCreate_v2(
            2,
            eopts.as_mut_ptr(),
            evals.as_mut_ptr(),
            &mut st,
        ));
        ok(cuLinkAddData_v2(
            st,
            3,
            a.as_ptr() as *const c_void,
            a.len(),
            c"bad".as_ptr(),
            0,
            null_mut(),
            null_mut(),
        ));
        assert_ne!(
            cuLinkComplete(st, &mut (null_mut()), &mut len),
            CUDA_SUCCESS
        );
        assert_eq!(
            &err[..11],
            b"link failed",
            "the error log arrives with the failure"
        );
        let mut pointer_opt = [17u32];
        let mut pv = [null_mut()];
        assert_eq!(
            cuLinkCreate_v2(1, pointer_opt.as_mut_ptr(), pv.as_mut_ptr(), &mut st),
            CUDA_ERROR_NOT_SUPPORTED,
            "a pointer-valued option is refused, not dropped"
        );

        // cuFFT's module function enumeration (export table 6e163fbe, entry 7).
        let mut m = null_mut();
        ok(omps_shim::api::module::cuModuleLoadData(
            &mut m,
            HOST_MODULE.as_ptr() as *const c_void,
        ));
        let uuid = [
            0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1,
            0x99, 0x1e,
        ];
        let mut table: *const c_void = std::ptr::null();
        ok(omps_shim::dark::cuGetExportTable(&mut table, &uuid));
        type Cb = unsafe extern "C" fn(
            *mut c_void,
            *mut c_void,
            *const std::ffi::c_char,
            usize,
            usize,
            *mut c_void,
        ) -> usize;
        type Enumerate = unsafe extern "C" fn(*mut c_void, *mut c_void, Cb, *mut c_void) -> usize;
        unsafe extern "C" fn collect(
            user: *mut c_void,
            f: *mut c_void,
            name: *const std::ffi::c_char,
            _: usize,
            _: usize,
            _: *mut c_void,
        ) -> usize {
            let v = &mut *(user as *mut Vec<(usize, String)>);
            v.push((
                f as usize,
                std::ffi::CStr::from_ptr(name)
                    .to_string_lossy()
                    .into_owned(),
            ));
            0
        }
        let enumerate: Enumerate = std::mem::transmute(*(table as *const *const c_void).add(7));
        let mut seen: Vec<(usize, String)> = Vec::new();
        let n = enumerate(
            ctx as *mut c_void,
            m as *mut c_void,
            collect,
            &mut seen as *mut _ as *mut c_void,
        );
        assert_eq!(n, 3);
        let names: Vec<&str> = seen.iter().map(|s| s.1.as_str()).collect();
        assert_eq!(names, ["fill_u32", "trap", "set_cond"]);
        let mut f = null_mut();
        ok(omps_shim::api::module::cuModuleGetFunction(
            &mut f,
            m,
            c"fill_u32".as_ptr(),
        ));
        assert_eq!(
            seen[0].0, f as usize,
            "the callback gets the module's own function handles"
        );

        // TMA descriptors come from the server (the host GPU lays the fields out); each
        // encoding carries its own arguments, ReplaceAddress changes only the address.
        let addr = 0x7f00_0000_0000usize as *mut c_void;
        let dims = [64u64, 32, 8, 2];
        let strides = [128u64, 4096, 32768];
        let es = [1u32; 4];
        let (mut d1, mut d2) = ([0u8; 128], [0u8; 128]);
        ok(cuTensorMapEncodeTiled(
            &mut d1,
            6,
            2,
            addr,
            dims.as_ptr(),
            strides.as_ptr(),
            [16u32, 16].as_ptr(),
            es.as_ptr(),
            0,
            0,
            0,
            0,
        ));
        ok(cuTensorMapEncodeTiled(
            &mut d2,
            6,
            2,
            addr,
            dims.as_ptr(),
            strides.as_ptr(),
            [32u32, 16].as_ptr(),
            es.as_ptr(),
            0,
            0,
            0,
            0,
        ));
        assert_ne!(d1, d2, "the box dimensions reach the encoder");
        let (lo, hi) = ([-1i32, -1], [1i32, 1]);
        ok(cuTensorMapEncodeIm2col(
            &mut d1,
            6,
            4,
            addr,
            dims.as_ptr(),
            strides.as_ptr(),
            lo.as_ptr(),
            hi.as_ptr(),
            8,
            32,
            es.as_ptr(),
            0,
            0,
            0,
            0,
        ));
        ok(cuTensorMapEncodeIm2col(
            &mut d2,
            6,
            4,
            addr,
            dims.as_ptr(),
            strides.as_ptr(),
            lo.as_ptr(),
            lo.as_ptr(),
            8,
            32,
            es.as_ptr(),
            0,
            0,
            0,
            0,
        ));
        assert_ne!(d1, d2, "the pixel box corners reach the encoder");
        let before = d1;
        ok(cuTensorMapReplaceAddress(
            &mut d1,
            0x7f00_0000_1000usize as *mut c_void,
        ));
        assert_ne!(d1[..8], before[..8]);
        assert_eq!(d1[8..], before[8..]);
        assert_eq!(
            cuTensorMapEncodeTiled(
                &mut d1,
                6,
                0,
                addr,
                dims.as_ptr(),
                strides.as_ptr(),
                es.as_ptr(),
                es.as_ptr(),
                0,
                0,
                0,
                0
            ),
            CUDA_ERROR_INVALID_VALUE
        );

        // Context limits read back what this client set.
        let mut stack = 0usize;
        ok(cuCtxGetLimit(&mut stack, 0));
        ok(cuCtxSetLimit(0, stack * 2));
        let mut now = 0usize;
        ok(cuCtxGetLimit(&mut now, 0));
        assert_eq!(now, stack * 2);
        assert_eq!(cuCtxSetLimit(42, 1), CUDA_ERROR_INVALID_VALUE);

        // Capture queries: no stream is capturing; the thread's mode is swapped.
        let mut status = 7u32;
        ok(cuStreamIsCapturing(s1, &mut status));
        assert_eq!(status, 0);
        let mut mode = 1u32;
        ok(cuThreadExchangeStreamCaptureMode(&mut mode));
        assert_eq!(mode, 0);
        ok(cuThreadExchangeStreamCaptureMode(&mut mode));
        assert_eq!(mode, 1);
        mode = 9;
        assert_eq!(
            cuThreadExchangeStreamCaptureMode(&mut mode),
            CUDA_ERROR_INVALID_VALUE
        );

        // Stream attributes are read back per stream and copied.
        let mut v = [0u8; 64];
        v[..4].copy_from_slice(&2u32.to_le_bytes());
        ok(cuStreamSetAttribute(s1, 3, &v));
        let mut back = [0u8; 64];
        ok(cuStreamGetAttribute(s2, 3, &mut back));
        assert_eq!(back[0], 1, "s2 keeps the default policy");
        ok(cuStreamCopyAttributes(s2, s1));
        ok(cuStreamGetAttribute(s2, 3, &mut back));
        assert_eq!(back[0], 2);
    }
}

fn wait_for(cond: impl Fn() -> bool, what: &str) {
    let t = std::time::Instant::now();
    while !cond() {
        assert!(t.elapsed().as_secs() < 5, "{what}: timed out");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
