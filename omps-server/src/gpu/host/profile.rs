//! Which GPU generation the host GPU ([`crate::gpu::host::HostGpu`]) plays, so that CI,
//! which has no GPU, also runs the server on GPUs older than Hopper: what their driver
//! reports in the device attributes, and which of the features omps uses from newer GPUs
//! their driver refuses (and with which error).
//!
//! Tests pick a profile with [`crate::gpu::host::HostGpu::with_profile`]; for manual runs
//! `OMPS_HOST_GPU_PROFILE=sm90|sm70|sm61` sets the one [`crate::gpu::host::HostGpu::new`]
//! takes (sm90 when unset), so that e.g. `OMPS_HOST_GPU_PROFILE=sm61 cargo test -p
//! omps-shim` runs every host test on a Pascal-like GPU (those of newer features then fail,
//! as they would there).
//!
//! Green contexts are not a device attribute: a driver offers them or not (NVIDIA's
//! documentation gives SM split sizes from compute capability 6.0, but no one here has
//! run one that old). The old profiles play a GPU whose driver gives none, the case the
//! server must survive whatever the reason.

/// The environment variable that picks [`HostGpu::new`](crate::gpu::host::HostGpu::new)'s
/// profile.
pub const PROFILE_ENV: &str = "OMPS_HOST_GPU_PROFILE";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostProfile {
    /// Hopper (H100) features on 4 one-SM chunks: the host GPU every test had before.
    Sm90,
    /// Volta (V100): VMM and memory pools, no green contexts, clusters or tensor maps.
    Sm70,
    /// Pascal (P40, GTX 10x0): no VMM and no memory pools either.
    Sm61,
}

/// CU_DEVICE_ATTRIBUTE_* numbers the profiles set (cuda.h).
pub mod attr {
    pub const MULTIPROCESSOR_COUNT: usize = 16;
    pub const MAX_THREADS_PER_MULTIPROCESSOR: usize = 39;
    pub const COMPUTE_CAPABILITY_MAJOR: usize = 75;
    pub const COMPUTE_CAPABILITY_MINOR: usize = 76;
    pub const STREAM_PRIORITIES_SUPPORTED: usize = 78;
    pub const MANAGED_MEMORY: usize = 83;
    pub const COOPERATIVE_LAUNCH: usize = 95;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: usize = 97;
    /// VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED (also named VIRTUAL_ADDRESS_...).
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: usize = 102;
    pub const HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: usize = 103;
    pub const MEMORY_POOLS_SUPPORTED: usize = 115;
    pub const CLUSTER_LAUNCH: usize = 120;
    pub const TENSOR_MAP_ACCESS_SUPPORTED: usize = 127;
}

impl HostProfile {
    pub fn parse(s: &str) -> Option<HostProfile> {
        match s.trim().to_ascii_lowercase().as_str() {
            "sm90" | "9.0" | "hopper" => Some(HostProfile::Sm90),
            "sm70" | "7.0" | "volta" => Some(HostProfile::Sm70),
            "sm61" | "6.1" | "pascal" => Some(HostProfile::Sm61),
            _ => None,
        }
    }

    /// The profile `OMPS_HOST_GPU_PROFILE` names (sm90 when unset). A value it does not
    /// know stops the test at once rather than run it on the wrong GPU.
    pub fn from_env() -> HostProfile {
        match std::env::var(PROFILE_ENV) {
            Err(_) => HostProfile::Sm90,
            Ok(v) => HostProfile::parse(&v)
                .unwrap_or_else(|| panic!("{PROFILE_ENV}={v}: not sm90, sm70 or sm61")),
        }
    }

    pub fn compute_capability(self) -> (i32, i32) {
        match self {
            HostProfile::Sm90 => (9, 0),
            HostProfile::Sm70 => (7, 0),
            HostProfile::Sm61 => (6, 1),
        }
    }

    /// SMs: 4 on sm90 (so chunk arithmetic stays small in tests), a V100's 80, a P40's 30.
    pub fn sms(self) -> u32 {
        match self {
            HostProfile::Sm90 => 4,
            HostProfile::Sm70 => 80,
            HostProfile::Sm61 => 30,
        }
    }

    /// Whether its driver makes green contexts (see the module's note).
    pub fn green_contexts(self) -> bool {
        self == HostProfile::Sm90
    }

    pub fn vmm(self) -> bool {
        self != HostProfile::Sm61
    }

    pub fn memory_pools(self) -> bool {
        self != HostProfile::Sm61
    }

    /// Thread-block clusters and tensor maps (TMA) came with compute capability 9.0.
    pub fn clusters(self) -> bool {
        self == HostProfile::Sm90
    }

    pub fn tensor_maps(self) -> bool {
        self == HostProfile::Sm90
    }

    /// The most dynamic shared memory a block may opt into: an H100's 227 KiB, a V100's
    /// 96 KiB, 48 KiB on Pascal (no opt-in beyond the default).
    pub fn shared_optin(self) -> i32 {
        match self {
            HostProfile::Sm90 => 232448,
            HostProfile::Sm70 => 98304,
            HostProfile::Sm61 => 49152,
        }
    }

    /// The device attributes its driver reports (attribute, value); the rest are unset.
    pub fn attributes(self) -> Vec<(usize, i32)> {
        let (major, minor) = self.compute_capability();
        let b = |on: bool| on as i32;
        vec![
            // Max threads per block, block and grid dimensions, shared memory per block.
            (1, 1024),
            (2, 1024),
            (3, 1024),
            (4, 64),
            (5, i32::MAX),
            (6, 65535),
            (7, 65535),
            (8, 49152),
            (10, 32), // warp size
            (attr::MULTIPROCESSOR_COUNT, self.sms() as i32),
            (attr::MAX_THREADS_PER_MULTIPROCESSOR, 2048),
            (attr::COMPUTE_CAPABILITY_MAJOR, major),
            (attr::COMPUTE_CAPABILITY_MINOR, minor),
            (attr::STREAM_PRIORITIES_SUPPORTED, 1),
            (attr::MANAGED_MEMORY, 1),
            (attr::COOPERATIVE_LAUNCH, 1),
            (attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, self.shared_optin()),
            (attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, b(self.vmm())),
            (
                attr::HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                b(self.vmm()),
            ),
            (attr::MEMORY_POOLS_SUPPORTED, b(self.memory_pools())),
            (attr::CLUSTER_LAUNCH, b(self.clusters())),
            (attr::TENSOR_MAP_ACCESS_SUPPORTED, b(self.tensor_maps())),
        ]
    }
}

/// Launch attributes a GPU without clusters refuses: cluster dimension, cluster
/// scheduling policy, preferred cluster dimension (CUlaunchAttributeID).
pub fn is_cluster_launch_attr(id: u32) -> bool {
    matches!(id, 4 | 5 | 11)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_and_report_their_generation() {
        assert_eq!(HostProfile::parse(" SM70 "), Some(HostProfile::Sm70));
        assert_eq!(HostProfile::parse("6.1"), Some(HostProfile::Sm61));
        assert_eq!(HostProfile::parse("sm80"), None);
        let a: std::collections::HashMap<_, _> =
            HostProfile::Sm61.attributes().into_iter().collect();
        assert_eq!(a[&attr::COMPUTE_CAPABILITY_MAJOR], 6);
        assert_eq!(a[&attr::COMPUTE_CAPABILITY_MINOR], 1);
        assert_eq!(a[&attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED], 0);
        assert_eq!(a[&attr::MEMORY_POOLS_SUPPORTED], 0);
        let v: std::collections::HashMap<_, _> =
            HostProfile::Sm70.attributes().into_iter().collect();
        assert_eq!(v[&attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED], 1);
        assert_eq!(v[&attr::CLUSTER_LAUNCH], 0);
        assert_eq!(v[&attr::TENSOR_MAP_ACCESS_SUPPORTED], 0);
        assert_eq!(v[&attr::MULTIPROCESSOR_COUNT], 80);
    }
}
