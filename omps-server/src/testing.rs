//! A client without a process behind it: a real segment and socket pair, for the fuzz
//! targets and unit tests that drive a [`Session`](crate::session::Session) directly.

use crate::client::ClientShared;
use crate::gpu::Gpu;
use omps_ring::segment::{LayoutParams, SegmentView};
use omps_ring::shm::{self, Mapping};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// A registered client segment for one GPU, and the peer end of its socket.
pub fn fake_client(
    gpu: &Arc<dyn Gpu>,
    id: u32,
) -> std::io::Result<(Arc<ClientShared>, UnixStream)> {
    let layout = LayoutParams::for_devices(1)
        .validate()
        .map_err(std::io::Error::other)?;
    let fd = shm::create_segment("omps-fake-client", layout.total_len)?;
    let map = Mapping::map(fd.as_fd(), layout.total_len)?;
    // SAFETY: the mapping is total_len bytes and moves into the ClientShared with the view.
    let seg = unsafe { SegmentView::new(map.as_ptr(), layout) };
    let (off, len) = layout.registered_range();
    // SAFETY: the range lies in the mapping, which ClientShared unregisters before unmapping.
    unsafe { gpu.register_host(seg.base().add(off), len) }
        .map_err(|e| std::io::Error::other(format!("register: {}", e.0)))?;
    let (ours, theirs) = UnixStream::pair()?;
    let c = ClientShared::new(
        id,
        0,
        "fake".into(),
        map,
        seg,
        OwnedFd::from(ours),
        Some(gpu.clone()),
    );
    Ok((Arc::new(c), theirs))
}
