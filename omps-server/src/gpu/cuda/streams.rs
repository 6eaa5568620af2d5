//! [`CudaGpu`]'s stream and event family: events created, recorded, waited on, queried
//! and timed, and whether a stream is idle.

use super::device::{ck, CudaGpu};
use crate::gpu::{CuError, GpuResult};
use cudarc::driver::sys as cu;

pub(super) fn event_create(gpu: &CudaGpu, flags: u32) -> GpuResult<u64> {
    gpu.bind();
    let mut e = std::ptr::null_mut();
    // Blocking sync is meaningless in a server that never blocks; keep disable-timing.
    let flags = flags & 0x2;
    // SAFETY: valid out-pointer.
    ck(unsafe { cu::cuEventCreate(&mut e, flags) })?;
    Ok(e as u64)
}

pub(super) fn event_destroy(gpu: &CudaGpu, ev: u64) -> GpuResult<()> {
    gpu.bind();
    // SAFETY: ev from event_create, destroyed once.
    ck(unsafe { cu::cuEventDestroy_v2(ev as cu::CUevent) })
}

pub(super) fn event_record(gpu: &CudaGpu, ev: u64, s: usize) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: live event and stream.
    ck(unsafe { cu::cuEventRecord(ev as cu::CUevent, st) })
}

pub(super) fn stream_wait_event(gpu: &CudaGpu, s: usize, ev: u64) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: live event and stream.
    ck(unsafe { cu::cuStreamWaitEvent(st, ev as cu::CUevent, 0) })
}

pub(super) fn event_record_external(gpu: &CudaGpu, ev: u64, s: usize) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    const RECORD_EXTERNAL: u32 = 1;
    // SAFETY: live event and stream.
    ck(unsafe { cu::cuEventRecordWithFlags(ev as cu::CUevent, st, RECORD_EXTERNAL) })
}

pub(super) fn stream_wait_event_external(gpu: &CudaGpu, s: usize, ev: u64) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    const WAIT_EXTERNAL: u32 = 1;
    // SAFETY: live event and stream.
    ck(unsafe { cu::cuStreamWaitEvent(st, ev as cu::CUevent, WAIT_EXTERNAL) })
}

pub(super) fn event_query(gpu: &CudaGpu, ev: u64) -> GpuResult<bool> {
    gpu.bind();
    // SAFETY: live event.
    match unsafe { cu::cuEventQuery(ev as cu::CUevent) } {
        cu::CUresult::CUDA_SUCCESS => Ok(true),
        cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        e => Err(CuError(e as i32)),
    }
}

pub(super) fn event_elapsed(gpu: &CudaGpu, start: u64, end: u64) -> GpuResult<f32> {
    gpu.bind();
    let mut ms = 0f32;
    // SAFETY: live events, valid out-pointer.
    ck(unsafe { cu::cuEventElapsedTime_v2(&mut ms, start as cu::CUevent, end as cu::CUevent) })?;
    Ok(ms)
}

pub(super) fn stream_query(gpu: &CudaGpu, s: usize) -> GpuResult<bool> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: live stream.
    match unsafe { cu::cuStreamQuery(st) } {
        cu::CUresult::CUDA_SUCCESS => Ok(true),
        cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        e => Err(CuError(e as i32)),
    }
}
