//! The host GPU's launch family: its known kernels run at once, the wire's queries
//! (occupancy, limits) and tensor maps.

use super::ops::HostOp;
use super::state::HostGpu;
use crate::gpu::{code, CuError, Gpu, GpuResult};
use std::sync::atomic::Ordering;

/// Not the driver's encoding: the fields laid out in order, enough for tests to see
/// that a descriptor comes back and that ReplaceAddress edits only the address.
pub(super) fn tensor_map(
    gpu: &HostGpu,
    t: &omps_ring::wire::TensorMap,
    old: Option<&[u8; 128]>,
) -> GpuResult<[u8; 128]> {
    use omps_ring::wire::tensor_map as k;
    // Tensor maps are for compute capability 9.0 and newer (the driver API's words).
    if !gpu.profile.tensor_maps() {
        return Err(CuError(code::NOT_SUPPORTED));
    }
    if !(1..=5).contains(&t.rank) || !t.global_address.is_multiple_of(16) {
        return Err(CuError(code::INVALID_VALUE));
    }
    let mut d = old.copied().unwrap_or([0; 128]);
    if t.kind != k::REPLACE_ADDRESS {
        let fields = bytemuck::bytes_of(t);
        d[8..].copy_from_slice(&fields[fields.len() - 120..]);
    }
    d[..8].copy_from_slice(&t.global_address.to_le_bytes());
    Ok(d)
}

pub(super) fn query(
    gpu: &HostGpu,
    kind: u32,
    _func: u64,
    args: [i64; 7],
    _attrs: &[u8],
) -> GpuResult<i64> {
    use omps_ring::wire::query;
    match kind {
        query::OCC_MAX_BLOCKS => Ok(if args[0] > 0 { 2048 / args[0] } else { 0 }),
        query::CTX_GET_LIMIT | query::CTX_SET_LIMIT if !(0..=6).contains(&args[0]) => {
            Err(CuError(code::INVALID_VALUE))
        }
        query::CTX_GET_LIMIT => {
            let st = gpu.state.lock().unwrap();
            Ok(st.limits.get(&args[0]).copied().unwrap_or(1024))
        }
        query::CTX_SET_LIMIT => {
            const MALLOC_HEAP_SIZE: i64 = 2;
            let mut st = gpu.state.lock().unwrap();
            let now = st.limits.get(&args[0]).copied().unwrap_or(1024);
            if args[0] == MALLOC_HEAP_SIZE && st.heap_fixed && args[1] != now {
                return Err(CuError(code::INVALID_VALUE));
            }
            st.limits.insert(args[0], args[1]);
            Ok(0)
        }
        query::CTX_RESET_PERSISTING_L2 => {
            gpu.state.lock().unwrap().l2_resets += 1;
            Ok(0)
        }
        query::FUNC_CACHE_CONFIG => Ok(0),
        _ => Err(CuError(code::NOT_SUPPORTED)),
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn launch(
    gpu: &HostGpu,
    func: u64,
    _grid: [u32; 3],
    _block: [u32; 3],
    _shared: u32,
    s: usize,
    attrs: &[u8],
    args: &[u8],
) -> GpuResult<()> {
    gpu.queued(s);
    let clustered = attrs
        .chunks_exact(omps_ring::wire::LAUNCH_ATTR_BYTES)
        .any(|a| {
            crate::gpu::host::profile::is_cluster_launch_attr(u32::from_le_bytes([
                a[0], a[1], a[2], a[3],
            ]))
        });
    if clustered && !gpu.profile.clusters() {
        return Err(CuError(code::NOT_SUPPORTED));
    }
    let mut st = gpu.state.lock().unwrap();
    st.check()?;
    let op = HostOp::Launch {
        func,
        args: args.to_vec(),
    };
    if st.captured(s, op) {
        return Ok(());
    }
    gpu.launches.fetch_add(1, Ordering::Relaxed);
    gpu.last_launch_stream.store(s, Ordering::Relaxed);
    let name = st
        .modules
        .get(&(func >> 16))
        .and_then(|(f, _)| f.get((func & 0xffff) as usize))
        .map(|f| f.name.clone())
        .ok_or(CuError(code::INVALID_HANDLE))?;
    match name.as_str() {
        "fill_u32" if args.len() >= 16 => {
            let ptr = u64::from_le_bytes(args[0..8].try_into().unwrap());
            let value = u32::from_le_bytes(args[8..12].try_into().unwrap());
            let n = u32::from_le_bytes(args[12..16].try_into().unwrap()) as usize;
            let bytes = value.to_le_bytes().repeat(n);
            if let Ok(d) = st.range(ptr, n * 4) {
                d.copy_from_slice(&bytes);
                return Ok(());
            }
            // A peer's plain memory, once access to that peer is enabled (VMM memory
            // is reached only where its own access was set for this GPU).
            let vmm = st.vmm.lock().unwrap().reserved(ptr);
            drop(st);
            let on_peer = !vmm
                && gpu.linked().iter().any(|p| {
                    gpu.reaches(p.ordinal)
                        && p.state
                            .lock()
                            .unwrap()
                            .range(ptr, n * 4)
                            .map(|d| d.copy_from_slice(&bytes))
                            .is_ok()
                });
            if !on_peer {
                gpu.state.lock().unwrap().sticky = Some(code::ILLEGAL_ADDRESS);
            }
        }
        "trap" => st.sticky = Some(code::LAUNCH_FAILED),
        "set_cond" if args.len() >= 12 => {
            let h = u64::from_le_bytes(args[0..8].try_into().unwrap());
            let value = u32::from_le_bytes(args[8..12].try_into().unwrap());
            match st.conds.get_mut(&h) {
                Some(c) => c.2 = value,
                None => st.sticky = Some(code::ILLEGAL_ADDRESS),
            }
        }
        "print" | "assert_fail" if args.len() >= 12 => {
            let ptr = u64::from_le_bytes(args[0..8].try_into().unwrap());
            let n = u32::from_le_bytes(args[8..12].try_into().unwrap()) as usize;
            match st.range(ptr, n) {
                Ok(d) => {
                    let text = d.to_vec();
                    if name == "assert_fail" {
                        st.assert_buffer.extend_from_slice(&text);
                        st.sticky = Some(code::ASSERT);
                    } else {
                        st.printf_buffer.extend_from_slice(&text);
                    }
                }
                Err(_) => st.sticky = Some(code::ILLEGAL_ADDRESS),
            }
        }
        _ => {}
    }
    Ok(())
}

/// Whether `func` names a function of a module loaded here (a run of launches is taken
/// whole or not at all: host/device.rs `launch_run`).
pub(super) fn knows(gpu: &HostGpu, func: u64) -> bool {
    let st = gpu.state.lock().unwrap();
    st.modules
        .get(&(func >> 16))
        .is_some_and(|(f, _)| f.get((func & 0xffff) as usize).is_some())
}
