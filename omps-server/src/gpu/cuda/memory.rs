//! [`CudaGpu`]'s memory family: allocations and frees, copies, memsets, stream memory
//! operations (write and wait on a word) and host registration.

use super::device::{ck, CudaGpu};
use crate::gpu::{code, CuError, Gpu, GpuResult};
use cudarc::driver::sys as cu;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

pub(super) fn mem_alloc(gpu: &CudaGpu, size: u64) -> GpuResult<u64> {
    gpu.bind();
    let mut p = 0;
    // SAFETY: valid out-pointer.
    ck(unsafe { cu::cuMemAlloc_v2(&mut p, size as usize) })?;
    Ok(p)
}

pub(super) fn mem_free(gpu: &CudaGpu, ptr: u64) -> GpuResult<()> {
    gpu.bind();
    // SAFETY: the caller frees only pointers it allocated, once, when idle.
    ck(unsafe { cu::cuMemFree_v2(ptr) })
}

pub(super) fn mem_free_async(gpu: &CudaGpu, ptr: u64) -> GpuResult<()> {
    if !gpu.pools {
        return gpu.mem_free(ptr);
    }
    gpu.bind();
    let st = gpu.release_stream.load(Ordering::Acquire);
    // SAFETY: as mem_free; a stream of this context with no work, so the free happens
    // as soon as the driver gets to it (cuMemFreeAsync takes cuMemAlloc's memory too:
    // scripts/probe/blocking_calls.cu).
    ck(unsafe { cu::cuMemFreeAsync(ptr, st) })
}

pub(super) fn settle_frees(gpu: &CudaGpu) -> GpuResult<()> {
    if !gpu.pools {
        return Ok(());
    }
    gpu.bind();
    let st = gpu.release_stream.load(Ordering::Acquire);
    // SAFETY: a live stream of this context that holds only frees.
    ck(unsafe { cu::cuStreamSynchronize(st) })
}

pub(super) fn mem_info(gpu: &CudaGpu) -> GpuResult<(u64, u64)> {
    gpu.bind();
    let (mut f, mut t) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    ck(unsafe { cu::cuMemGetInfo_v2(&mut f, &mut t) })?;
    Ok((f as u64, t as u64))
}

/// # Safety
/// As [`Gpu::copy_htod`](crate::gpu::Gpu::copy_htod)'s.
pub(super) unsafe fn copy_htod(
    gpu: &CudaGpu,
    dst: u64,
    src: *const u8,
    len: usize,
    s: usize,
) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: the caller guarantees the host range; the driver checks the device range.
    ck(unsafe { cu::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, st) })
}

/// # Safety
/// As [`Gpu::copy_dtoh`](crate::gpu::Gpu::copy_dtoh)'s.
pub(super) unsafe fn copy_dtoh(
    gpu: &CudaGpu,
    dst: *mut u8,
    src: u64,
    len: usize,
    s: usize,
) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: as copy_htod.
    ck(unsafe { cu::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, st) })
}

pub(super) fn copy_dtod(gpu: &CudaGpu, dst: u64, src: u64, len: usize, s: usize) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: device addresses only; the driver checks them.
    ck(unsafe { cu::cuMemcpyDtoDAsync_v2(dst, src, len, st) })
}

pub(super) fn memset(
    gpu: &CudaGpu,
    dst: u64,
    value: u32,
    elem_size: u32,
    count: usize,
    s: usize,
) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: device addresses only; the driver checks them.
    ck(unsafe {
        match elem_size {
            1 => cu::cuMemsetD8Async(dst, value as u8, count, st),
            2 => cu::cuMemsetD16Async(dst, value as u16, count, st),
            4 => cu::cuMemsetD32Async(dst, value, count, st),
            _ => return Err(CuError(code::INVALID_VALUE)),
        }
    })
}

/// # Safety
/// As [`Gpu::write_u32`](crate::gpu::Gpu::write_u32)'s.
pub(super) unsafe fn write_u32(
    gpu: &CudaGpu,
    addr: *mut u32,
    value: u32,
    s: usize,
) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: registered with DEVICEMAP and unified addressing, so the host address is
    // the device address (checked in register_host).
    ck(unsafe { cu::cuStreamWriteValue32_v2(st, addr as u64, value, 0) })
}

/// # Safety
/// As [`Gpu::wait_u32`](crate::gpu::Gpu::wait_u32)'s.
pub(super) unsafe fn wait_u32(
    gpu: &CudaGpu,
    addr: *mut u32,
    value: u32,
    s: usize,
) -> GpuResult<()> {
    // CU_STREAM_WAIT_VALUE_GEQ compares with wrap-around: a slot's sequence only grows,
    // so a later function's acknowledgement through the same slot also releases this
    // wait (EQ could miss the moment and wait forever).
    const WAIT_VALUE_GEQ: u32 = 0;
    // SAFETY: the caller's promise, as wait_value asks it.
    unsafe { wait_value(gpu, addr, value, s, WAIT_VALUE_GEQ) }
}

/// # Safety
/// As [`Gpu::wait_u32_eq`](crate::gpu::Gpu::wait_u32_eq)'s.
pub(super) unsafe fn wait_u32_eq(
    gpu: &CudaGpu,
    addr: *mut u32,
    value: u32,
    s: usize,
) -> GpuResult<()> {
    const WAIT_VALUE_EQ: u32 = 1;
    // SAFETY: the caller's promise, as wait_value asks it.
    unsafe { wait_value(gpu, addr, value, s, WAIT_VALUE_EQ) }
}

/// Makes work stream `s` wait until the word at `addr` compares with `value` as `flags`
/// (CU_STREAM_WAIT_VALUE_*) say.
///
/// # Safety
/// `addr` is in registered host memory that stays registered while the wait can run.
unsafe fn wait_value(
    gpu: &CudaGpu,
    addr: *mut u32,
    value: u32,
    s: usize,
    flags: u32,
) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: as write_u32: registered with DEVICEMAP, host address = device address.
    ck(unsafe { cu::cuStreamWaitValue32_v2(st, addr as u64, value, flags) })
}

/// # Safety
/// As [`Gpu::register_host`](crate::gpu::Gpu::register_host)'s.
pub(super) unsafe fn register_host(gpu: &CudaGpu, ptr: *mut u8, len: usize) -> GpuResult<()> {
    gpu.bind();
    const PORTABLE: u32 = 1;
    const DEVICEMAP: u32 = 2;
    // SAFETY: the caller keeps the range mapped until unregister.
    ck(unsafe { cu::cuMemHostRegister_v2(ptr as *mut c_void, len, PORTABLE | DEVICEMAP) })?;
    let mut d = 0;
    // SAFETY: ptr was just registered; valid out-pointer.
    ck(unsafe { cu::cuMemHostGetDevicePointer_v2(&mut d, ptr as *mut c_void, 0) })?;
    if d != ptr as u64 {
        // write_u32 relies on the identity mapping; refuse rather than write elsewhere.
        // SAFETY: undoing the registration above.
        unsafe { cu::cuMemHostUnregister(ptr as *mut c_void) };
        return Err(CuError(code::NOT_SUPPORTED));
    }
    Ok(())
}

/// # Safety
/// As [`Gpu::unregister_host`](crate::gpu::Gpu::unregister_host)'s.
pub(super) unsafe fn unregister_host(gpu: &CudaGpu, ptr: *mut u8) -> GpuResult<()> {
    gpu.bind();
    // SAFETY: the caller guarantees nothing is in flight.
    ck(unsafe { cu::cuMemHostUnregister(ptr as *mut c_void) })
}

pub(super) fn write_device_u32(gpu: &CudaGpu, dptr: u64, value: u32, s: usize) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: live stream; the session checked that dptr..dptr+4 is the client's.
    ck(unsafe { cu::cuStreamWriteValue32_v2(st, dptr, value, 0) })
}
