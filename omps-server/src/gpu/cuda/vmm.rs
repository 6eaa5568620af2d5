//! [`CudaGpu`]'s virtual memory family: address reservations, physical allocations,
//! mappings and access (the cuMem* VMM calls).

use super::device::{ck, CudaGpu};
use crate::gpu::{code, CuError, GpuResult};
use cudarc::driver::sys as cu;

/// Pinned device memory of this GPU, not exportable (clients share it through the
/// server's tokens, ipc.rs), compressible if asked: what omps' clients may create.
fn vmm_prop(gpu: &CudaGpu, compressible: bool) -> cu::CUmemAllocationProp {
    cu::CUmemAllocationProp {
        type_: cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: cu::CUmemLocation {
            type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: gpu.dev,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: cu::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: u8::from(compressible),
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

pub(super) fn vmm_reserve(gpu: &CudaGpu, size: u64, align: u64, hint: u64) -> GpuResult<u64> {
    gpu.bind();
    let mut p = 0;
    // SAFETY: valid out-pointer; the driver checks sizes and alignment.
    ck(unsafe { cu::cuMemAddressReserve(&mut p, size as usize, align as usize, hint, 0) })?;
    Ok(p)
}

pub(super) fn vmm_address_free(gpu: &CudaGpu, ptr: u64, size: u64) -> GpuResult<()> {
    gpu.bind();
    // SAFETY: the session checked this is one whole reservation of the client.
    ck(unsafe { cu::cuMemAddressFree(ptr, size as usize) })
}

pub(super) fn vmm_create(gpu: &CudaGpu, size: u64, compressible: bool) -> GpuResult<(u64, bool)> {
    gpu.bind();
    let prop = vmm_prop(gpu, compressible);
    let mut h = 0;
    // SAFETY: valid out-pointer and property block.
    ck(unsafe { cu::cuMemCreate(&mut h, size as usize, &prop, 0) })?;
    if !compressible {
        return Ok((h, false));
    }
    // The driver may make the memory without compression (no compression on this GPU,
    // or none left): what it granted is in the handle's properties.
    // SAFETY: all-zero is a valid CUmemAllocationProp (plain integers, a null pointer).
    let mut got: cu::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; a handle just made.
    if let Err(e) = ck(unsafe { cu::cuMemGetAllocationPropertiesFromHandle(&mut got, h) }) {
        // SAFETY: the handle just made, released once.
        unsafe { cu::cuMemRelease(h) };
        return Err(e);
    }
    Ok((h, got.allocFlags.compressionType != 0))
}

pub(super) fn vmm_release(gpu: &CudaGpu, handle: u64) -> GpuResult<()> {
    gpu.bind();
    // SAFETY: a handle this server created, released once.
    ck(unsafe { cu::cuMemRelease(handle) })
}

pub(super) fn vmm_map(
    gpu: &CudaGpu,
    ptr: u64,
    size: u64,
    offset: u64,
    handle: u64,
) -> GpuResult<()> {
    gpu.bind();
    // SAFETY: the session checked the range lies in the client's reservation and the
    // handle is the client's; the driver checks sizes and offsets.
    ck(unsafe { cu::cuMemMap(ptr, size as usize, offset as usize, handle, 0) })
}

pub(super) fn vmm_unmap(gpu: &CudaGpu, ptr: u64, size: u64) -> GpuResult<()> {
    gpu.bind();
    // SAFETY: the session checked this is one whole mapping of the client.
    ck(unsafe { cu::cuMemUnmap(ptr, size as usize) })
}

pub(super) fn vmm_set_access(gpu: &CudaGpu, ptr: u64, size: u64, gpus: &[usize]) -> GpuResult<()> {
    gpu.bind();
    // Another GPU's location needs no peer access between the contexts: the driver
    // checks that the two devices can reach each other.
    let descs = gpus
        .iter()
        .map(|&g| {
            let dev = match g == gpu.ordinal {
                true => gpu.dev,
                false => gpu.peer_device(g).ok_or(CuError(code::INVALID_DEVICE))?,
            };
            Ok(cu::CUmemAccessDesc {
                location: cu::CUmemLocation {
                    type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: dev,
                },
                flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
        })
        .collect::<GpuResult<Vec<_>>>()?;
    // SAFETY: the session checked the range lies in the client's mappings; `descs`
    // holds as many descriptors as passed.
    ck(unsafe { cu::cuMemSetAccess(ptr, size as usize, descs.as_ptr(), descs.len()) })
}

pub(super) fn vmm_granularity(
    gpu: &CudaGpu,
    recommended: bool,
    compressible: bool,
) -> GpuResult<u64> {
    gpu.bind();
    let prop = vmm_prop(gpu, compressible);
    let option = if recommended {
        cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
    } else {
        cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM
    };
    let mut g = 0usize;
    // SAFETY: valid out-pointer and property block.
    ck(unsafe { cu::cuMemGetAllocationGranularity(&mut g, &prop, option) })?;
    Ok(g as u64)
}
