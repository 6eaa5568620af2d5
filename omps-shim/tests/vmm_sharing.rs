//! Physical memory exported as a POSIX descriptor and imported by it (the same process
//! here; two processes on the GPU, tests/cuda/rt/vmm_ipc.cu): the imported handle maps
//! and outlives the exporter's release; what is not omps's descriptor, memory not made
//! exportable and other handle types are refused. Compressible memory is asked of the
//! driver, and the properties say what it granted, to the exporter and to importers.

mod common;
use common::*;
use omps_shim::api::vmm::*;
use omps_shim::api::vmm_share::*;
use omps_shim::cuda::*;
use std::ffi::c_void;
use std::os::fd::AsRawFd;

#[test]
fn exported_memory_is_imported_by_its_descriptor() {
    let srv = start_as_client("vmm-share");
    let pid = std::process::id();
    let mem = |want: u64| {
        let ps = srv.wait_ps(2, |ps| ps_mem(ps, pid) == Some(want));
        assert_eq!(ps_mem(&ps, pid), Some(want), "{ps}");
    };
    const SIZE: usize = 2 << 20;
    // SAFETY (whole test): every pointer passed is a valid local or a handle made here.
    unsafe {
        // Fabric handles are not offered: programs choose POSIX descriptors.
        let mut fabric = -1;
        ok(omps_shim::api::device::cuDeviceGetAttribute(
            &mut fabric,
            128,
            0,
        ));
        assert_eq!(fabric, 0);
        let mut prop: AllocProp = std::mem::zeroed();
        let words = &mut prop as *mut AllocProp as *mut u32;
        *words = 1; // pinned
        *words.add(1) = 1; // exportable as a POSIX descriptor
        *words.add(2) = 1; // on device 0
        let mut h = 0u64;
        *words.add(1) = 8; // fabric: refused as where no fabric is set up
        assert_eq!(cuMemCreate(&mut h, SIZE, &prop, 0), 800);
        *words.add(1) = 1;
        ok(cuMemCreate(&mut h, SIZE, &prop, 0));
        mem(SIZE as u64);
        let mut fd: i32 = -1;
        ok(cuMemExportToShareableHandle(
            &mut fd as *mut i32 as *mut c_void,
            h,
            1,
            0,
        ));
        assert!(fd >= 0);
        assert_eq!(
            cuMemExportToShareableHandle(&mut fd as *mut i32 as *mut c_void, h, 8, 0),
            CUDA_ERROR_NOT_SUPPORTED,
            "fabric handles"
        );
        let mut h2 = 0u64;
        ok(cuMemImportFromShareableHandle(
            &mut h2,
            fd as usize as *mut c_void,
            1,
        ));
        assert_ne!(h2, h);
        mem(SIZE as u64); // the importer is not charged again

        // Released by its exporter, the memory stays for the importer's mapping.
        ok(cuMemRelease(h));
        mem(0);
        let mut p = 0u64;
        ok(cuMemAddressReserve(&mut p, SIZE, 0, 0, 0));
        ok(cuMemMap(p, SIZE, 0, h2, 0));
        ok(cuMemUnmap(p, SIZE));
        ok(cuMemAddressFree(p, SIZE));
        ok(cuMemRelease(h2));
        assert_eq!(
            cuMemImportFromShareableHandle(&mut h2, fd as usize as *mut c_void, 1),
            CUDA_ERROR_INVALID_VALUE,
            "gone with its last user"
        );
        libc::close(fd);

        // A descriptor that is not omps's, and memory not made exportable.
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        assert_eq!(
            cuMemImportFromShareableHandle(&mut h2, f.as_raw_fd() as usize as *mut c_void, 1),
            CUDA_ERROR_INVALID_VALUE
        );
        *words.add(1) = 0;
        ok(cuMemCreate(&mut h, SIZE, &prop, 0));
        assert_eq!(
            cuMemExportToShareableHandle(&mut fd as *mut i32 as *mut c_void, h, 1, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        ok(cuMemRelease(h));
        mem(0);
    }
    compressible_memory_reports_what_the_gpu_granted();
}

/// Run by the test above: the shim connects to one server per process.
fn compressible_memory_reports_what_the_gpu_granted() {
    const SIZE: usize = 2 << 20;
    /// Byte of CUmemAllocationProp holding allocFlags.compressionType.
    const COMPRESSION: usize = 24;
    // SAFETY (whole test): every pointer passed is a valid local or a handle made here.
    unsafe {
        // The host GPU offers generic compression
        // (CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED).
        let mut supported = -1;
        ok(omps_shim::api::device::cuDeviceGetAttribute(
            &mut supported,
            107,
            0,
        ));
        assert_eq!(supported, 1);
        let mut prop: AllocProp = std::mem::zeroed();
        let words = &mut prop as *mut AllocProp as *mut u32;
        *words = 1; // pinned
        *words.add(1) = 1; // exportable as a POSIX descriptor
        *words.add(2) = 1; // on device 0
        let bytes = &mut prop as *mut AllocProp as *mut u8;
        *bytes.add(COMPRESSION) = 1; // CU_MEM_ALLOCATION_COMP_GENERIC
        let mut g = 0usize;
        ok(cuMemGetAllocationGranularity(&mut g, &prop, 0));
        assert!(g > 0 && SIZE.is_multiple_of(g));
        let mut h = 0u64;
        ok(cuMemCreate(&mut h, SIZE, &prop, 0));
        let compression_of = |h: u64| {
            let mut got: AllocProp = std::mem::zeroed();
            ok(cuMemGetAllocationPropertiesFromHandle(&mut got, h));
            *(&got as *const AllocProp as *const u8).add(COMPRESSION)
        };
        assert_eq!(compression_of(h), 1, "compression granted");
        // An importer sees the memory as compressible too.
        let mut fd: i32 = -1;
        ok(cuMemExportToShareableHandle(
            &mut fd as *mut i32 as *mut c_void,
            h,
            1,
            0,
        ));
        let mut h2 = 0u64;
        ok(cuMemImportFromShareableHandle(
            &mut h2,
            fd as usize as *mut c_void,
            1,
        ));
        libc::close(fd);
        assert_eq!(compression_of(h2), 1, "the importer's properties");
        // Mapped and used as any memory.
        let mut p = 0u64;
        ok(cuMemAddressReserve(&mut p, SIZE, 0, 0, 0));
        ok(cuMemMap(p, SIZE, 0, h2, 0));
        // Read-write on device 0 (CUmemAccessDesc: location type and id, flags): a new
        // mapping has no access, as natively.
        let access: [u32; 3] = [1, 0, 3];
        ok(cuMemSetAccess(p, SIZE, access.as_ptr().cast(), 1));
        ok(omps_shim::api::mem::cuMemsetD8_v2(p, 7, SIZE));
        let mut back = vec![0u8; 16];
        ok(omps_shim::api::mem::cuMemcpyDtoH_v2(
            back.as_mut_ptr().cast(),
            p + SIZE as u64 - 16,
            16,
        ));
        assert_eq!(back, [7; 16]);
        ok(cuMemUnmap(p, SIZE));
        ok(cuMemAddressFree(p, SIZE));
        ok(cuMemRelease(h2));
        ok(cuMemRelease(h));

        // Not asked: not compressible. A type the driver does not know: refused.
        *bytes.add(COMPRESSION) = 0;
        ok(cuMemCreate(&mut h, SIZE, &prop, 0));
        assert_eq!(compression_of(h), 0);
        ok(cuMemRelease(h));
        *bytes.add(COMPRESSION) = 2;
        assert_eq!(
            cuMemCreate(&mut h, SIZE, &prop, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemGetAllocationGranularity(&mut g, &prop, 0),
            CUDA_ERROR_INVALID_VALUE
        );
    }
}
