//! CUDA arrays through the shim on the host GPU: 2D and 3D arrays and their descriptors,
//! copies between arrays and host memory (sub-rectangles, through a device buffer), device
//! memory and other arrays, a mipmapped array's levels, texture and surface objects and
//! their descriptors, and what is refused. Arrays count as the client's memory until
//! destroyed.

mod common;
use common::*;
use omps_shim::api::array::*;
use omps_shim::api::hostmem::*;
use omps_shim::api::mem::*;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::ptr::null_mut;

const FLOAT: u32 = 0x20;

/// A 2D copy of `w` x `h` floats between a host buffer of `pitch` floats and an array.
fn copy_2d(
    host: *mut f32,
    pitch: usize,
    a: CUarray,
    to_array: bool,
    at: (usize, usize),
    w: usize,
    h: usize,
) -> CUresult {
    let mut c = Memcpy2D {
        src_x: 0,
        src_y: 0,
        src_type: 1,
        src_host: host as *const c_void,
        src_device: 0,
        src_array: null_mut(),
        src_pitch: pitch * 4,
        dst_x: 0,
        dst_y: 0,
        dst_type: 3,
        dst_host: null_mut(),
        dst_device: 0,
        dst_array: a as *mut c_void,
        dst_pitch: 0,
        width: w * 4,
        height: h,
    };
    (c.dst_x, c.dst_y) = (at.0 * 4, at.1);
    if !to_array {
        std::mem::swap(&mut c.src_type, &mut c.dst_type);
        c.dst_host = host as *mut c_void;
        c.src_host = std::ptr::null();
        (c.src_array, c.dst_array) = (a as *mut c_void, null_mut());
        (c.src_x, c.src_y, c.dst_x, c.dst_y) = (at.0 * 4, at.1, 0, 0);
        (c.src_pitch, c.dst_pitch) = (0, pitch * 4);
    }
    // SAFETY: the description names live buffers of the sizes given.
    unsafe { cuMemcpy2D_v2(&c) }
}

#[test]
fn arrays_copies_and_texture_objects() {
    let srv = start_as_client("arrays");
    let pid = std::process::id();
    let mem = |want: u64| {
        let ps = srv.wait_ps(2, |ps| ps_mem(ps, pid) == Some(want));
        assert_eq!(ps_mem(&ps, pid), Some(want), "{ps}");
    };
    // SAFETY (whole test): every pointer passed is a valid local or a handle made here.
    unsafe {
        // A 16 x 8 float array: 512 bytes of the client's memory.
        let mut a = null_mut();
        let d = ArrayDesc {
            width: 16,
            height: 8,
            format: FLOAT,
            channels: 1,
        };
        ok(cuArrayCreate_v2(&mut a, &d));
        mem(512);
        let mut back = ArrayDesc::default();
        ok(cuArrayGetDescriptor_v2(&mut back, a));
        assert_eq!(back, d);
        let mut d3 = Array3DDesc::default();
        ok(cuArray3DGetDescriptor_v2(&mut d3, a));
        assert_eq!(
            (d3.width, d3.height, d3.depth, d3.format),
            (16, 8, 0, FLOAT)
        );

        // The whole array from the host, then a 4 x 3 block at (5, 2) back out.
        let mut src: Vec<f32> = (0..128).map(|i| i as f32).collect();
        ok(copy_2d(src.as_mut_ptr(), 16, a, true, (0, 0), 16, 8));
        let mut block = vec![0f32; 12];
        ok(copy_2d(block.as_mut_ptr(), 4, a, false, (5, 2), 4, 3));
        let want: Vec<f32> = (2..5)
            .flat_map(|y| (5..9).map(move |x| (y * 16 + x) as f32))
            .collect();
        assert_eq!(block, want);
        // Past the array's edge: refused at once.
        assert_eq!(
            copy_2d(block.as_mut_ptr(), 4, a, false, (14, 0), 4, 1),
            CUDA_ERROR_INVALID_VALUE
        );

        // Array to device memory, device to a second array, that array to the host
        // (1D forms: offsets into the first row).
        let mut dev = 0u64;
        ok(cuMemAlloc_v2(&mut dev, 64));
        ok(cuMemcpyAtoD_v2(dev, a, 16, 48));
        let mut b = null_mut();
        ok(cuArrayCreate_v2(&mut b, &d));
        ok(cuMemcpyDtoA_v2(b, 0, dev, 48));
        ok(cuMemcpyAtoA_v2(b, 48, a, 0, 16));
        assert_eq!(
            cuMemcpyAtoA_v2(b, 56, a, 0, 16),
            CUDA_ERROR_INVALID_VALUE,
            "past the row"
        );
        let mut row = vec![0f32; 16];
        ok(cuMemcpyAtoH_v2(row.as_mut_ptr() as *mut c_void, b, 0, 64));
        let want: Vec<f32> = (4..16).chain(0..4).map(|v| v as f32).collect();
        assert_eq!(row, want);
        ok(cuMemcpyHtoA_v2(b, 8, [99f32].as_ptr() as *const c_void, 4));
        ok(cuMemcpyAtoH_v2(row.as_mut_ptr() as *mut c_void, b, 0, 16));
        assert_eq!(&row[..4], &[4.0, 5.0, 99.0, 7.0]);

        // A texture object over the array and one over device memory; the descriptors
        // come back as given.
        let mut res = ResourceDesc {
            ty: 0,
            res: [0; 16],
            flags: 0,
        };
        res.res[0] = a as u64;
        let mut texd = [0u32; 26];
        texd[3] = 1; // filter mode: linear
        let mut t = 0u64;
        ok(cuTexObjectCreate(&mut t, &res, &texd, std::ptr::null()));
        let mut r2 = res;
        r2.res[0] = 0;
        ok(cuTexObjectGetResourceDesc(&mut r2, t));
        assert_eq!(r2.res[0], a as u64);
        let mut t2d = [9u32; 26];
        ok(cuTexObjectGetTextureDesc(&mut t2d, t));
        assert_eq!(t2d, texd);
        let mut view = [0u32; 28];
        assert_eq!(
            cuTexObjectGetResourceViewDesc(&mut view, t),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut lin = ResourceDesc {
            ty: 2,
            res: [0; 16],
            flags: 0,
        };
        lin.res[..3].copy_from_slice(&[dev, FLOAT as u64 | 1 << 32, 64]);
        let mut tl = 0u64;
        ok(cuTexObjectCreate(&mut tl, &lin, &texd, std::ptr::null()));
        // A size past the allocation, as convolutionFFT2D gives: the texture ends with the
        // allocation (what lies past it may be another client's), the query answers the
        // size given.
        lin.res[2] = 1 << 20;
        let mut past = 0u64;
        ok(cuTexObjectCreate(&mut past, &lin, &texd, std::ptr::null()));
        assert!(
            matches!(
                srv.gpu.texture(past),
                Some(omps_server::gpu::Resource::Linear { size: 64, .. })
            ),
            "the server's texture covers the 64 bytes allocated"
        );
        let mut r3 = lin;
        r3.res[2] = 0;
        ok(cuTexObjectGetResourceDesc(&mut r3, past));
        assert_eq!(r3.res[2], 1 << 20);
        ok(cuTexObjectDestroy(past));
        // Starting outside the client's memory is still refused.
        lin.res[0] = dev + (1 << 40);
        assert_eq!(
            cuTexObjectCreate(&mut past, &lin, &texd, std::ptr::null()),
            CUDA_ERROR_INVALID_VALUE
        );
        lin.res[0] = dev;
        let mut surf = 0u64;
        ok(cuSurfObjectCreate(&mut surf, &res));
        assert_eq!(
            cuSurfObjectCreate(&mut surf, &lin),
            CUDA_ERROR_INVALID_VALUE,
            "surfaces are over arrays"
        );
        ok(cuSurfObjectDestroy(surf));
        assert_eq!(cuSurfObjectDestroy(surf), CUDA_ERROR_INVALID_VALUE, "twice");
        ok(cuTexObjectDestroy(t));
        ok(cuTexObjectDestroy(tl));

        // A 3D array, 4 x 4 x 3 of float2, and a sub-box copied through it.
        let d3 = Array3DDesc {
            width: 4,
            height: 4,
            depth: 3,
            format: FLOAT,
            channels: 2,
            flags: 0,
        };
        let mut c3 = null_mut();
        ok(cuArray3DCreate_v2(&mut c3, &d3));
        let vals: Vec<f32> = (0..96).map(|i| i as f32).collect();
        let mut cp: Memcpy3D = std::mem::zeroed();
        (cp.src_type, cp.src_host, cp.src_pitch, cp.src_height) =
            (1, vals.as_ptr() as *const c_void, 32, 4);
        (cp.dst_type, cp.dst_array) = (3, c3 as *mut c_void);
        (cp.width, cp.height, cp.depth) = (32, 4, 3);
        ok(cuMemcpy3D_v2(&cp));
        let mut boxv = vec![0f32; 2 * 2 * 2 * 2];
        let mut cb: Memcpy3D = std::mem::zeroed();
        (cb.src_type, cb.src_array, cb.src_x, cb.src_y, cb.src_z) = (3, c3 as *mut c_void, 8, 1, 1);
        (cb.dst_type, cb.dst_host, cb.dst_pitch, cb.dst_height) =
            (1, boxv.as_mut_ptr() as *mut c_void, 16, 2);
        (cb.width, cb.height, cb.depth) = (16, 2, 2);
        ok(cuMemcpy3D_v2(&cb));
        let want: Vec<f32> = (1..3)
            .flat_map(|z| {
                (1..3).flat_map(move |y| (2..6).map(move |x| (z * 32 + y * 8 + x) as f32))
            })
            .collect();
        assert_eq!(boxv, want);

        // A mipmapped array: its levels are arrays of halved size, the same one each time,
        // destroyed with it and not alone.
        let mut m = null_mut();
        let md = Array3DDesc {
            width: 8,
            height: 8,
            depth: 0,
            format: FLOAT,
            channels: 1,
            flags: 0,
        };
        // More levels than any extent halves in: refused as the driver does, before any
        // cost (4 billion were counted out one by one on a worker every client shares).
        assert_eq!(
            cuMipmappedArrayCreate(&mut m, &md, u32::MAX),
            CUDA_ERROR_INVALID_VALUE
        );
        ok(cuMipmappedArrayCreate(&mut m, &md, 3));
        let (mut l1, mut l1b) = (null_mut(), null_mut());
        ok(cuMipmappedArrayGetLevel(&mut l1, m, 1));
        ok(cuMipmappedArrayGetLevel(&mut l1b, m, 1));
        assert_eq!(l1, l1b);
        let mut ld = ArrayDesc::default();
        ok(cuArrayGetDescriptor_v2(&mut ld, l1));
        assert_eq!((ld.width, ld.height), (4, 4));
        ok(cuMemcpyHtoA_v2(
            l1,
            0,
            [1f32, 2.0, 3.0, 4.0].as_ptr() as *const c_void,
            16,
        ));
        assert_eq!(
            cuArrayDestroy(l1),
            CUDA_ERROR_INVALID_VALUE,
            "a level goes with its mipmapped array"
        );
        ok(cuMipmappedArrayDestroy(m));
        assert_eq!(
            cuArrayGetDescriptor_v2(&mut ld, l1),
            CUDA_ERROR_INVALID_HANDLE
        );

        for x in [a, b, c3] {
            ok(cuArrayDestroy(x));
        }
        assert_eq!(cuArrayDestroy(a), CUDA_ERROR_INVALID_HANDLE);
        ok(cuMemFree_v2(dev));
        mem(0);
        let _ = srv;
    }
}
