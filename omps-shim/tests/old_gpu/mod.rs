//! The server on a GPU older than Hopper (the host GPU playing one, `HostProfile`): it
//! starts and serves a client through the shim; what that GPU lacks is refused as its
//! driver refuses it (client calls) or with an error naming what is missing (operator
//! commands that need green contexts); and afterwards the server, this client and another
//! are unharmed. Shared by old_gpu_sm70.rs and old_gpu_sm61.rs (one shim connection per
//! process, so one profile per test binary).

use crate::common::*;
use omps_server::gpu_host::HostProfile;
use omps_shim::api::device::*;
use omps_shim::api::exec::*;
use omps_shim::api::mem::*;
use omps_shim::api::pool::*;
use omps_shim::api::tensor_map::*;
use omps_shim::api::vmm::*;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::ptr::null_mut;

/// Fills 64 words of fresh device memory with `f` (fill_u32), copies them back, frees
/// them.
///
/// # Safety
/// The shim is initialized with a current context (`start_as_client_on`).
unsafe fn serve_once(f: CUfunction, value: u32) {
    let mut p = 0;
    // SAFETY (block): every pointer is a valid local; p is this client's allocation.
    unsafe {
        ok(cuMemAlloc_v2(&mut p, 256));
        ok(cuMemcpyHtoD_v2(
            p,
            [0u8; 256].as_ptr() as *const c_void,
            256,
        ));
        let (mut ptr_arg, mut val, mut cnt) = (p, value, 64u32);
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
            64,
            1,
            1,
            0,
            s,
            args.as_mut_ptr(),
            null_mut(),
        ));
        ok(cuStreamSynchronize(s));
        let mut back = [0u32; 64];
        ok(cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, p, 256));
        assert!(back.iter().all(|&w| w == value), "the kernel's words");
        ok(cuMemFree_v2(p));
        ok(cuStreamDestroy_v2(s));
    }
}

fn attribute(a: i32) -> i32 {
    let mut v = -1;
    // SAFETY: valid out-pointer.
    ok(unsafe { cuDeviceGetAttribute(&mut v, a, 0) });
    v
}

/// The bytes of the host GPU's allocations return to `base` within 5 s (frees run on the
/// server's releaser thread).
fn wait_freed(srv: &TestServer, base: u64) {
    let t = std::time::Instant::now();
    while srv.gpu.bytes_allocated() != base {
        assert!(
            t.elapsed().as_secs() < 5,
            "freed memory never came back: {} bytes held, {base} before",
            srv.gpu.bytes_allocated()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A cluster launch (2 blocks in clusters of 2): Hopper's, refused before.
///
/// # Safety
/// As `serve_once`.
unsafe fn cluster_launch(f: CUfunction) -> CUresult {
    let mut attr = [0u8; omps_ring::wire::LAUNCH_ATTR_BYTES];
    attr[..4].copy_from_slice(&4u32.to_le_bytes()); // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    for (i, v) in [2u32, 1, 1].into_iter().enumerate() {
        attr[8 + 4 * i..12 + 4 * i].copy_from_slice(&v.to_le_bytes());
    }
    let config = LaunchConfig {
        grid: [2, 1, 1],
        block: [32, 1, 1],
        shared_mem: 0,
        stream: null_mut(),
        attrs: attr.as_ptr(),
        num_attrs: 1,
    };
    let (mut ptr_arg, mut val, mut cnt) = (0u64, 0u32, 0u32);
    let mut args = [
        &mut ptr_arg as *mut _ as *mut c_void,
        &mut val as *mut _ as *mut c_void,
        &mut cnt as *mut _ as *mut c_void,
    ];
    // SAFETY: a valid config and argument array for fill_u32.
    unsafe { cuLaunchKernelEx(&config, f, args.as_mut_ptr(), null_mut()) }
}

/// A tiled tensor map (TMA) of a 64x32 float tensor.
///
/// # Safety
/// As `serve_once`.
unsafe fn tensor_map() -> CUresult {
    let mut d = [0u8; 128];
    let (dims, strides) = ([64u64, 32], [256u64]);
    // SAFETY: arrays of the rank's lengths; the address is only encoded.
    unsafe {
        cuTensorMapEncodeTiled(
            &mut d,
            6,
            2,
            0x7f00_0000_0000usize as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            [16u32, 16].as_ptr(),
            [1u32, 1].as_ptr(),
            0,
            0,
            0,
            0,
        )
    }
}

pub fn serves_and_refuses(profile: HostProfile) {
    let srv = start_as_client_on(&format!("old-gpu-{profile:?}"), profile);
    // Loaded once: its variables stay allocated while it is.
    let f = host_function(c"fill_u32");
    let base = srv.gpu.bytes_allocated();
    // The device reports itself as that generation's driver does.
    let (major, minor) = profile.compute_capability();
    assert_eq!((attribute(75), attribute(76)), (major, minor));
    assert_eq!(attribute(16), profile.sms() as i32);
    assert_eq!(attribute(102), profile.vmm() as i32, "VMM supported");
    assert_eq!(attribute(115), profile.memory_pools() as i32, "pools");
    assert_eq!(attribute(120), 0, "cluster launch");
    assert_eq!(attribute(127), 0, "tensor map access");

    // SAFETY (whole test): the shim is this process's, with a current context; every
    // pointer passed is a valid local.
    unsafe {
        serve_once(f, 0x0101_0101);

        // Client calls that need a newer GPU get the driver's answer on this one.
        assert_eq!(cluster_launch(f), CUDA_ERROR_NOT_SUPPORTED, "clusters");
        assert_eq!(tensor_map(), CUDA_ERROR_NOT_SUPPORTED, "tensor maps");
        #[repr(C)]
        struct VmmProp([u32; 4], u64, [u8; 8]);
        let prop = VmmProp([1, 0, 1, 0], 0, [0; 8]);
        let prop_ptr = &prop as *const VmmProp as *const _;
        let (mut g, mut va, mut h) = (0usize, 0u64, 0u64);
        #[repr(C)]
        struct PoolProps([u32; 4], [u8; 80]);
        let props = PoolProps([1, 0, 1, 0], [0; 80]);
        let (mut pool, mut d) = (null_mut(), 0u64);
        let mut s = null_mut();
        ok(cuStreamCreate(&mut s, 1));
        if profile.vmm() {
            ok(cuMemGetAllocationGranularity(&mut g, prop_ptr, 0));
            ok(cuMemAddressReserve(&mut va, 2 * g, 0, 0, 0));
            ok(cuMemCreate(&mut h, g, prop_ptr, 0));
            ok(cuMemRelease(h));
            ok(cuMemAddressFree(va, 2 * g));
        } else {
            let refused = [
                cuMemGetAllocationGranularity(&mut g, prop_ptr, 0),
                cuMemAddressReserve(&mut va, 1 << 21, 0, 0, 0),
                cuMemCreate(&mut h, 1 << 21, prop_ptr, 0),
            ];
            assert_eq!(refused, [CUDA_ERROR_NOT_SUPPORTED; 3], "VMM");
        }
        if profile.memory_pools() {
            ok(cuMemAllocAsync(&mut d, 4096, s));
            ok(cuMemFreeAsync(d, s));
            ok(cuMemPoolCreate(
                &mut pool,
                &props as *const PoolProps as *const _,
            ));
            ok(cuMemPoolDestroy(pool));
        } else {
            let mut plain = 0;
            ok(cuMemAlloc_v2(&mut plain, 64));
            let refused = [
                cuMemAllocAsync(&mut d, 4096, s),
                cuMemFreeAsync(plain, s),
                cuMemPoolCreate(&mut pool, &props as *const PoolProps as *const _),
                cuDeviceGetDefaultMemPool(&mut pool, 0),
                cuDeviceGetMemPool(&mut pool, 0),
            ];
            assert_eq!(refused, [CUDA_ERROR_NOT_SUPPORTED; 5], "memory pools");
            ok(cuMemFree_v2(plain));
        }
        ok(cuStreamSynchronize(s));
        ok(cuStreamDestroy_v2(s));

        // Operator commands that need green contexts say so and change nothing.
        let mut uuid = [0u8; 16];
        ok(cuDeviceGetUuid(&mut uuid, 0));
        let uuid = omps_server::control::uuid_text(&uuid);
        let (done, text) = srv.ctl(&format!("sm_partition add {uuid} 1"));
        assert!(!done && text.contains("green contexts"), "{text}");
        assert!(text.contains("CUDA_ERROR_NOT_SUPPORTED"), "{text}");
        let me = std::process::id();
        let server = me; // the server runs in this process
        for cmd in [
            format!("set_active_thread_percentage {server} 50"),
            format!("set_active_thread_percentage {me} 25"),
            "set_default_active_thread_percentage 50".to_string(),
        ] {
            let (done, text) = srv.ctl(&cmd);
            assert!(
                !done && text.contains("thread-percentage limits need green contexts"),
                "{cmd}: {text}"
            );
        }
        assert_eq!(
            srv.ctl(&format!("get_active_thread_percentage {me}")),
            (true, "100.0\n".into())
        );
        assert!(
            srv.ctl(&format!("set_active_thread_percentage {me} 100")).0,
            "no limit is fine"
        );
        let (done, text) = srv.ctl(&format!("set_client_qos {me} latency-critical"));
        assert!(
            done && text.contains("no latency-critical SM reserve"),
            "{text}"
        );
        let (_, status) = srv.ctl("status");
        let line = format!("compute capability {major}.{minor}, without green contexts");
        assert!(status.contains(&line), "{status}");
        assert!(srv.ctl("lspart").0);

        // Still serving: this client, and another.
        serve_once(f, 0x0202_0202);
        let other = omps_shim::conn::Conn::connect_to(&srv.socket()).expect("another client");
        let q = alloc(&other, 64);
        memset(&other, q);
        sync_default_stream(&other).expect("the other client's work");
        assert_eq!(srv.gpu.peek(q, 4), Some(7u32.to_le_bytes().to_vec()));
        drop(other);
        // Everything freed came back (on a GPU without pools through cuMemFree).
        wait_freed(&srv, base);
    }
}
