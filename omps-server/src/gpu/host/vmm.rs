//! The host GPU's virtual memory family: reservations, physical allocations, mappings
//! and access, on the machine's shared VMM space (machine_vmm.rs).

use super::setup::VMM_GRANULE;
use super::state::HostGpu;
use crate::gpu::{code, CuError, GpuResult};

pub(super) fn vmm_reserve(gpu: &HostGpu, size: u64, align: u64, _hint: u64) -> GpuResult<u64> {
    gpu.vmm_here()?;
    let g = VMM_GRANULE;
    if size == 0 || !size.is_multiple_of(g) || (align != 0 && !align.is_power_of_two()) {
        return Err(CuError(code::INVALID_VALUE));
    }
    // One larger than the GPU is refused here (the driver would give address space;
    // nothing could be mapped), so a test's reservation stays small.
    if size > gpu.total || align > gpu.total {
        return Err(CuError(code::OUT_OF_MEMORY));
    }
    let mut st = gpu.state.lock().unwrap();
    let a = st.next_addr.next_multiple_of(align.max(g));
    st.vmm.lock().unwrap().reserve(a, size)?;
    st.next_addr = a + size + g;
    Ok(a)
}

pub(super) fn vmm_address_free(gpu: &HostGpu, ptr: u64, size: u64) -> GpuResult<()> {
    gpu.vmm_here()?;
    let st = gpu.state.lock().unwrap();
    let r = st.vmm.lock().unwrap().address_free(ptr, size);
    r
}

/// Grants compression whenever asked, as a GPU with compressible memory to spare.
pub(super) fn vmm_create(gpu: &HostGpu, size: u64, compressible: bool) -> GpuResult<(u64, bool)> {
    gpu.vmm_here()?;
    if size == 0 || !size.is_multiple_of(VMM_GRANULE) || size > gpu.total {
        return Err(CuError(code::INVALID_VALUE));
    }
    let st = gpu.state.lock().unwrap();
    let h = st.vmm.lock().unwrap().create(size, gpu.ordinal)?;
    Ok((h, compressible))
}

pub(super) fn vmm_release(gpu: &HostGpu, handle: u64) -> GpuResult<()> {
    gpu.vmm_here()?;
    let st = gpu.state.lock().unwrap();
    let r = st.vmm.lock().unwrap().release(handle);
    r
}

pub(super) fn vmm_map(
    gpu: &HostGpu,
    ptr: u64,
    size: u64,
    offset: u64,
    handle: u64,
) -> GpuResult<()> {
    gpu.vmm_here()?;
    let st = gpu.state.lock().unwrap();
    let r = st
        .vmm
        .lock()
        .unwrap()
        .map(ptr, size, offset, handle, gpu.ordinal);
    r
}

pub(super) fn vmm_unmap(gpu: &HostGpu, ptr: u64, _size: u64) -> GpuResult<()> {
    gpu.vmm_here()?;
    let st = gpu.state.lock().unwrap();
    let r = st.vmm.lock().unwrap().unmap(ptr);
    r
}

/// Access for another GPU needs the memory's GPU and that one linked (`link_peers`).
pub(super) fn vmm_set_access(gpu: &HostGpu, ptr: u64, size: u64, gpus: &[usize]) -> GpuResult<()> {
    gpu.vmm_here()?;
    let mut linked: Vec<usize> = gpu.peers.lock().unwrap().iter().map(|p| p.0).collect();
    linked.push(gpu.ordinal);
    let reaches = |a: usize, b: usize| a == b || (linked.contains(&a) && linked.contains(&b));
    let st = gpu.state.lock().unwrap();
    let r = st.vmm.lock().unwrap().set_access(ptr, size, gpus, reaches);
    r
}
