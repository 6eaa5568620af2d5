//! The host GPU's memory family: allocations and frees, copies, memsets, stream memory
//! operations (write and wait on a word) and host registration.

use super::ops::HostOp;
use super::state::HostGpu;
use crate::gpu::{code, CuError, GpuResult};
use std::sync::atomic::{AtomicU32, Ordering};

pub(super) fn mem_alloc(gpu: &HostGpu, size: u64) -> GpuResult<u64> {
    let mut st = gpu.state.lock().unwrap();
    let used: u64 = st.mem.values().map(|v| v.len() as u64).sum::<u64>() + st.held_by_frees;
    if used.checked_add(size).is_none_or(|t| t > gpu.total) {
        return Err(CuError(code::OUT_OF_MEMORY));
    }
    Ok(st.alloc(size))
}

pub(super) fn mem_free(gpu: &HostGpu, ptr: u64) -> GpuResult<()> {
    gpu.wait_unless_stuck();
    let mut st = gpu.state.lock().unwrap();
    st.mem
        .remove(&ptr)
        .map(drop)
        .ok_or(CuError(code::INVALID_VALUE))
}

pub(super) fn mem_free_async(gpu: &HostGpu, ptr: u64) -> GpuResult<()> {
    // cuMemFreeAsync is the stream-ordered allocator's: refused where it has no pools.
    if !gpu.profile.memory_pools() {
        return Err(CuError(code::NOT_SUPPORTED));
    }
    let mut st = gpu.state.lock().unwrap();
    let v = st.mem.remove(&ptr).ok_or(CuError(code::INVALID_VALUE))?;
    st.held_by_frees += v.len() as u64;
    Ok(())
}

/// # Safety
/// As [`Gpu::copy_htod`](crate::gpu::Gpu::copy_htod)'s.
pub(super) unsafe fn copy_htod(
    gpu: &HostGpu,
    dst: u64,
    src: *const u8,
    len: usize,
    s: usize,
) -> GpuResult<()> {
    gpu.queued(s);
    let mut st = gpu.state.lock().unwrap();
    st.check()?;
    if !st.is_registered(src as usize, len) {
        return Err(CuError(code::INVALID_VALUE));
    }
    st.range(dst, len)?;
    let op = HostOp::Htod {
        dst,
        src: src as usize,
        len,
    };
    if st.captured(s, op) {
        return Ok(());
    }
    let d = st.range(dst, len)?;
    // SAFETY: the caller guarantees src..src+len is readable; d is a distinct Vec.
    unsafe { std::ptr::copy_nonoverlapping(src, d.as_mut_ptr(), len) };
    Ok(())
}

/// # Safety
/// As [`Gpu::copy_dtoh`](crate::gpu::Gpu::copy_dtoh)'s.
pub(super) unsafe fn copy_dtoh(
    gpu: &HostGpu,
    dst: *mut u8,
    src: u64,
    len: usize,
    s: usize,
) -> GpuResult<()> {
    gpu.queued(s);
    let mut st = gpu.state.lock().unwrap();
    st.check()?;
    if !st.is_registered(dst as usize, len) {
        return Err(CuError(code::INVALID_VALUE));
    }
    st.range(src, len)?;
    let op = HostOp::Dtoh {
        dst: dst as usize,
        src,
        len,
    };
    if st.captured(s, op) {
        return Ok(());
    }
    let from = st.range(src, len)?;
    // SAFETY: the caller guarantees dst..dst+len is writable; from is a distinct Vec.
    unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), dst, len) };
    Ok(())
}

pub(super) fn copy_dtod(gpu: &HostGpu, dst: u64, src: u64, len: usize, s: usize) -> GpuResult<()> {
    gpu.queued(s);
    let mut st = gpu.state.lock().unwrap();
    st.check()?;
    if st.captured(s, HostOp::Dtod { dst, src, len }) {
        return Ok(());
    }
    if let (Ok(tmp), true) = (
        st.range(src, len).map(|r| r.to_vec()),
        st.range(dst, len).is_ok(),
    ) {
        st.range(dst, len)?.copy_from_slice(&tmp);
        return Ok(());
    }
    // An end on a linked peer's memory.
    drop(st);
    let tmp = gpu.read_reachable(src, len)?;
    gpu.write_reachable(dst, &tmp)
}

pub(super) fn memset(
    gpu: &HostGpu,
    dst: u64,
    value: u32,
    elem_size: u32,
    count: usize,
    s: usize,
) -> GpuResult<()> {
    gpu.queued(s);
    let mut st = gpu.state.lock().unwrap();
    st.check()?;
    let op = HostOp::Memset {
        dst,
        value,
        elem: elem_size,
        count,
    };
    if st.captured(s, op) {
        return Ok(());
    }
    let n = elem_size as usize;
    let bytes = &value.to_le_bytes()[..n];
    let d = st.range(dst, count * n)?;
    for c in d.chunks_exact_mut(n) {
        c.copy_from_slice(bytes);
    }
    Ok(())
}

/// # Safety
/// As [`Gpu::wait_u32`](crate::gpu::Gpu::wait_u32)'s.
pub(super) unsafe fn wait_u32(
    gpu: &HostGpu,
    addr: *mut u32,
    value: u32,
    s: usize,
) -> GpuResult<()> {
    // Work on the host GPU runs as it is queued: there is no later to wait until.
    // Tests of host functions see the callback run and the caller not block, not the
    // stream order, which only a GPU keeps (unless a test plays the queues).
    gpu.state.lock().unwrap().check()?;
    gpu.queued(s);
    gpu.hold_wait(addr as usize, value, false, s);
    Ok(())
}

/// # Safety
/// As [`Gpu::wait_u32_eq`](crate::gpu::Gpu::wait_u32_eq)'s.
pub(super) unsafe fn wait_u32_eq(
    gpu: &HostGpu,
    addr: *mut u32,
    value: u32,
    s: usize,
) -> GpuResult<()> {
    {
        let mut st = gpu.state.lock().unwrap();
        let op = HostOp::WaitEq {
            addr: addr as usize,
            value,
        };
        if st.captured(s, op) {
            return Ok(());
        }
    }
    gpu.state.lock().unwrap().check()?;
    gpu.queued(s);
    gpu.hold_wait(addr as usize, value, true, s);
    Ok(())
}

/// # Safety
/// As [`Gpu::write_u32`](crate::gpu::Gpu::write_u32)'s.
pub(super) unsafe fn write_u32(
    gpu: &HostGpu,
    addr: *mut u32,
    value: u32,
    s: usize,
) -> GpuResult<()> {
    let mut st = gpu.state.lock().unwrap();
    st.check()?;
    if !st.is_registered(addr as usize, 4) {
        return Err(CuError(code::INVALID_VALUE));
    }
    let word = HostOp::Word {
        addr: addr as usize,
        value,
    };
    if st.captured(s, word) {
        return Ok(());
    }
    drop(st);
    gpu.queued(s);
    gpu.completions.fetch_add(1, Ordering::Relaxed);
    if gpu.hold_write(addr as usize, value, s) {
        return Ok(());
    }
    // SAFETY: registered memory is mapped and the address is 4-aligned (a segment word).
    unsafe { (*(addr as *const AtomicU32)).store(value, Ordering::Release) };
    Ok(())
}

/// # Safety
/// As [`Gpu::register_host`](crate::gpu::Gpu::register_host)'s.
pub(super) unsafe fn register_host(gpu: &HostGpu, ptr: *mut u8, len: usize) -> GpuResult<()> {
    let st = gpu.state.lock().unwrap();
    let (a, b) = (ptr as usize, ptr as usize + len);
    let mut registered = st.registered.lock().unwrap();
    // As the driver: a range overlapping one still registered is refused.
    if registered.iter().any(|&(s, n)| a < s + n && s < b) {
        const HOST_MEMORY_ALREADY_REGISTERED: i32 = 712;
        return Err(CuError(HOST_MEMORY_ALREADY_REGISTERED));
    }
    registered.push((a, len));
    Ok(())
}

/// # Safety
/// As [`Gpu::unregister_host`](crate::gpu::Gpu::unregister_host)'s.
pub(super) unsafe fn unregister_host(gpu: &HostGpu, ptr: *mut u8) -> GpuResult<()> {
    let st = gpu.state.lock().unwrap();
    let mut registered = st.registered.lock().unwrap();
    let before = registered.len();
    registered.retain(|&(s, _)| s != ptr as usize);
    if registered.len() == before {
        return Err(CuError(code::INVALID_VALUE));
    }
    Ok(())
}

pub(super) fn write_device_u32(gpu: &HostGpu, dptr: u64, value: u32, s: usize) -> GpuResult<()> {
    gpu.queued(s);
    let mut st = gpu.state.lock().unwrap();
    st.check()?;
    st.range(dptr, 4)?.copy_from_slice(&value.to_le_bytes());
    Ok(())
}
