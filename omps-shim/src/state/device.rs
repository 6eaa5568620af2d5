//! The devices the server's snapshot describes: every family checks a device ordinal here.

use super::entry::live;
use crate::cuda::*;
use omps_ring::segment::DeviceSnapshot;

/// The snapshot of `dev`, checking the ordinal.
pub(crate) fn device(dev: CUdevice) -> Result<&'static DeviceSnapshot, CUresult> {
    let c = live()?;
    let n = c.snapshot.device_count as usize;
    if dev < 0 || dev as usize >= n.min(c.num_devices()) {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    Ok(&c.snapshot.devices[dev as usize])
}
