//! The host GPU's context family: the device snapshot, peers, the reset after a fault,
//! SM confinement and printf flushing.

use super::state::HostGpu;
use crate::gpu::{code, CuError, Gpu, GpuResult};
use omps_ring::segment::DeviceSnapshot;
use std::sync::atomic::Ordering;

pub(super) fn snapshot(gpu: &HostGpu) -> DeviceSnapshot {
    let mut s: DeviceSnapshot = bytemuck::Zeroable::zeroed();
    let name = format!("omps host test device {}", gpu.ordinal);
    s.name[..name.len()].copy_from_slice(name.as_bytes());
    s.uuid = [0x10 + gpu.ordinal as u8; 16];
    let bus = format!("0000:{:02x}:00.0", 0x10 + gpu.ordinal);
    s.pci_bus_id[..bus.len()].copy_from_slice(bus.as_bytes());
    s.total_mem = gpu.total;
    // The profile's attributes, and generic compression (vmm_create grants it) where
    // the GPU has VMM.
    let compression = gpu.profile.vmm().then_some((107, 1));
    for (a, v) in gpu.profile.attributes().into_iter().chain(compression) {
        s.attributes[a] = v;
        s.attr_valid[a] = 1;
    }
    s
}

pub(super) fn peer_attributes(
    gpu: &HostGpu,
    peer: usize,
) -> [i32; omps_ring::segment::P2P_ATTRIBUTES] {
    let mut out = [0; omps_ring::segment::P2P_ATTRIBUTES];
    if gpu.peers.lock().unwrap().iter().any(|&(o, _)| o == peer) {
        // Rank 0, access, native atomics; no array access.
        out[1] = 1;
        out[2] = 1;
    }
    out
}

pub(super) fn enable_peer(gpu: &HostGpu, peer: usize) -> GpuResult<()> {
    if !gpu.peers.lock().unwrap().iter().any(|&(o, _)| o == peer) {
        return Err(CuError(code::PEER_ACCESS_UNSUPPORTED));
    }
    let mut on = gpu.peers_enabled.lock().unwrap();
    if !on.contains(&peer) {
        on.push(peer);
    }
    Ok(())
}

pub(super) fn reset(gpu: &HostGpu) -> GpuResult<()> {
    if gpu.resets_fail.load(Ordering::Relaxed) {
        return Err(CuError(code::NOT_PERMITTED));
    }
    let mut st = gpu.state.lock().unwrap();
    st.sticky = None;
    st.events.clear();
    st.modules.clear();
    st.mem.clear();
    st.held_by_frees = 0;
    st.capturing.clear();
    st.joined.clear();
    st.event_capture.clear();
    st.arrays.clear();
    st.mipmaps.clear();
    st.textures.clear();
    st.surfaces.clear();
    Ok(())
}

pub(super) fn layout() -> crate::sched::placement::Layout {
    crate::sched::placement::Layout {
        classes: [4, 8, 4, 4],
        connections: 4,
        confined: 8,
        confined_per_class: 4,
    }
}

pub(super) fn sm_chunks(gpu: &HostGpu) -> crate::sched::confine::SmChunks {
    // sm90: its 4 SMs, one per chunk. Without green contexts the split fails, and
    // gpu_green leaves no chunks, as here.
    crate::sched::confine::SmChunks {
        total: gpu.profile.sms(),
        chunk: 1,
        chunks: if gpu.profile.green_contexts() { 4 } else { 0 },
    }
}

pub(super) fn confine(
    gpu: &HostGpu,
    slot: usize,
    set: &crate::sched::confine::SmSet,
) -> GpuResult<u32> {
    if !gpu.profile.green_contexts() {
        // What gpu_green's create answers where the device split failed.
        return Err(CuError(code::NOT_SUPPORTED));
    }
    if slot >= gpu.layout().confined || set.chunks.iter().any(|&c| c >= 4) {
        return Err(CuError(code::INVALID_VALUE));
    }
    gpu.state.lock().unwrap().confined.insert(slot, set.clone());
    Ok(gpu.sm_chunks().sms(set))
}

pub(super) fn flush_printf(gpu: &HostGpu) -> GpuResult<()> {
    // The driver writes the printf buffer out once the running kernels are done.
    gpu.wait_unless_stuck();
    gpu.flushes.fetch_add(1, Ordering::Relaxed);
    let (out, err) = {
        let mut st = gpu.state.lock().unwrap();
        (
            std::mem::take(&mut st.printf_buffer),
            std::mem::take(&mut st.assert_buffer),
        )
    };
    for (fd, text) in [(&gpu.printf_fd, out), (&gpu.assert_fd, err)] {
        let fd = fd.load(Ordering::Relaxed);
        if fd < 0 || text.is_empty() {
            continue;
        }
        // SAFETY: the router's pipe, open for the life of the server; ManuallyDrop
        // leaves it open.
        let mut f = std::mem::ManuallyDrop::new(unsafe {
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
        });
        std::io::Write::write_all(&mut *f, &text).map_err(|_| CuError(code::UNKNOWN))?;
    }
    Ok(())
}
