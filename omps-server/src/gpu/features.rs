//! What a GPU lacks of the features omps uses from newer GPUs, found once at start from
//! its device attributes and from whether its green contexts could be made, so that the
//! server serves GPUs where MPS is missing (older ones included) and says plainly what
//! goes without: in the log at start, in `omps-ctl status`, and in the answer to an
//! operator command that needs what is missing.
//!
//! Client calls need nothing from here: those that need a missing feature get the
//! driver's own refusal (the server forwards them), or the shim's where the shim does the
//! work itself (memory pools, cluster launch attributes), from the same attributes.

use omps_ring::segment::DeviceSnapshot;

/// CU_DEVICE_ATTRIBUTE_* numbers read here.
const CC_MAJOR: usize = 75;
const CC_MINOR: usize = 76;
const VMM: usize = 102;
const MEMORY_POOLS: usize = 115;
const CLUSTER_LAUNCH: usize = 120;
const TENSOR_MAP_ACCESS: usize = 127;

/// What green contexts take, for messages: the driver API came with CUDA 12.4 (R550);
/// NVIDIA documents SM splits from compute capability 6.0 on, so where there are none the
/// driver (or the GPU's mode, MIG or vGPU) refused them.
pub const GREEN_NEEDS: &str = "green contexts (a CUDA 12.4+ driver, R550+, that offers them on this GPU; the server log says what the driver answered)";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Compute capability (0.0 where the driver did not say).
    pub cc: (i32, i32),
    /// SM confinement through green contexts: thread limits, partitions, the QoS reserve.
    pub green: bool,
    pub vmm: bool,
    pub pools: bool,
    pub clusters: bool,
    pub tensor_maps: bool,
}

impl Features {
    /// From `snap`'s attributes; `green`: whether the GPU's SMs could be split for green
    /// contexts (the policy's chunks). An attribute the driver does not report is a
    /// feature it does not have (it came with a newer driver), except tensor maps, whose
    /// attribute is younger than the feature: then compute capability 9.0 decides.
    pub fn of(snap: &DeviceSnapshot, green: bool) -> Features {
        let on = |a: usize| snap.attribute(a).is_some_and(|v| v != 0);
        let cc = (
            snap.attribute(CC_MAJOR).unwrap_or(0),
            snap.attribute(CC_MINOR).unwrap_or(0),
        );
        Features {
            cc,
            green,
            vmm: on(VMM),
            pools: on(MEMORY_POOLS),
            clusters: on(CLUSTER_LAUNCH),
            tensor_maps: snap
                .attribute(TENSOR_MAP_ACCESS)
                .map_or(cc.0 >= 9, |v| v != 0),
        }
    }

    /// One line per missing feature: what it is, what goes without it, what it needs.
    pub fn missing(&self) -> Vec<String> {
        let mut v = Vec::new();
        if !self.green {
            v.push(format!(
                "no green contexts: thread-percentage limits, SM partitions (sm_partition) and the latency-critical SM reserve are off; they need {GREEN_NEEDS}"
            ));
        }
        if !self.vmm {
            v.push("no virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0): cuMemCreate, cuMemMap and the rest (PyTorch's expandable_segments) fail with CUDA_ERROR_NOT_SUPPORTED, as natively".into());
        }
        if !self.pools {
            v.push("no memory pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED is 0): cuMemAllocAsync and the pool calls (PyTorch's backend:cudaMallocAsync) fail with CUDA_ERROR_NOT_SUPPORTED, as natively; the server frees clients' memory with cuMemFree".into());
        }
        if !self.clusters {
            v.push("no thread-block clusters (compute capability 9.0 and newer): cluster launches fail with CUDA_ERROR_NOT_SUPPORTED".into());
        }
        if !self.tensor_maps {
            v.push("no tensor maps (TMA, compute capability 9.0 and newer): cuTensorMapEncode* gets the driver's answer".into());
        }
        v
    }

    /// The `omps-ctl status` line: compute capability and what is missing, briefly.
    pub fn summary(&self) -> String {
        let gone: Vec<&str> = [
            (
                !self.green,
                "green contexts (thread limits, SM partitions, LC reserve)",
            ),
            (!self.vmm, "VMM"),
            (!self.pools, "memory pools"),
            (!self.clusters, "clusters"),
            (!self.tensor_maps, "tensor maps"),
        ]
        .into_iter()
        .filter_map(|(missing, name)| missing.then_some(name))
        .collect();
        let cc = format!("compute capability {}.{}", self.cc.0, self.cc.1);
        match gone.is_empty() {
            true => format!("{cc}, every feature omps uses"),
            false => format!("{cc}, without {}", gone.join(", ")),
        }
    }

    /// Logs, once at start, what GPU `ordinal` lacks.
    pub fn log(&self, ordinal: usize) {
        for m in self.missing() {
            tracing::warn!(
                "GPU {ordinal} (compute capability {}.{}): {m}",
                self.cc.0,
                self.cc.1
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::host::{HostGpu, HostProfile};
    use crate::gpu::Gpu;

    fn of(p: HostProfile) -> Features {
        let g = HostGpu::with_profile(0, 1 << 20, p);
        Features::of(&g.snapshot(), g.sm_chunks().chunks > 0)
    }

    #[test]
    fn each_profile_lacks_what_its_generation_lacks() {
        let h = of(HostProfile::Sm90);
        assert!(h.missing().is_empty(), "{:?}", h.missing());
        assert!(h.summary().contains("9.0, every feature"));
        let v = of(HostProfile::Sm70);
        assert_eq!((v.cc, v.green, v.vmm, v.pools), ((7, 0), false, true, true));
        assert!(!v.clusters && !v.tensor_maps);
        assert_eq!(v.missing().len(), 3);
        let p = of(HostProfile::Sm61);
        assert_eq!((p.cc, p.vmm, p.pools), ((6, 1), false, false));
        assert!(p.summary().contains("VMM, memory pools"), "{}", p.summary());
        assert!(p.missing()[0].contains("green contexts"));
    }
}
