//! A client's staging chunks and the GPU: registered with the segment (the first clients,
//! `crate::release::segpool::STAGING_AHEAD`), or channel by channel at the first copy
//! through each. Registering pins every page, which then counts in the server's resident
//! memory whether or not a copy ever comes; clients that never copy through staging (most
//! of 1,024 small ones) pin only their channel headers.

use super::*;

impl ClientShared {
    /// Its segment has only the control range registered (`Staging::AtFirstCopy`): each
    /// channel's staging is registered at its first copy. Set before the client is shared.
    pub fn stage_at_first_copy(&mut self) {
        self.staging = pins::Pins::at_first_copy();
    }

    /// Makes sure the GPU can reach channel `channel`'s staging chunks before a copy
    /// through them is queued: registers them at the first such copy (4 MiB, 1 MiB in a
    /// small segment; once). Err: the driver's error, to answer the copy with.
    pub fn staging_ready(&self, channel: usize) -> Result<(), i32> {
        let Some((off, len)) = self.seg.layout.staging_range(channel) else {
            return Err(crate::gpu::code::INVALID_VALUE);
        };
        if self.staging.ready(channel) {
            return Ok(());
        }
        // Without a GPU nothing was registered, and nothing needs to be.
        let Some(gpu) = &self.registered_on else {
            return Ok(());
        };
        let _one = self.staging.registering();
        if self.staging.ready(channel) {
            return Ok(());
        }
        // SAFETY: the range lies inside the mapping (the layout says so), which stays
        // mapped until Drop has it unregistered (pinned.rs).
        unsafe { gpu.register_host(self.seg.base().add(off), len) }.map_err(|e| e.0)?;
        self.staging.mark(channel);
        Ok(())
    }

    /// The segment's registered ranges, (offset, length) each: what Drop unregisters.
    pub(super) fn segment_registrations(&self) -> Vec<(usize, usize)> {
        self.staging.ranges(&self.seg.layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::host::HostGpu;
    use omps_ring::segment::LayoutParams;

    /// A client whose segment was made as a later client's (`Staging::AtFirstCopy`).
    fn late_client(host: &Arc<HostGpu>) -> ClientShared {
        let gpu: Arc<dyn Gpu> = host.clone();
        let layout = LayoutParams::for_crowd(1).validate().unwrap();
        let p = crate::release::segpool::Prepared::make(
            &layout,
            Some(&gpu),
            crate::release::segpool::Staging::AtFirstCopy,
        )
        .unwrap();
        let (fd, map, on) = p.hand_over();
        drop(fd);
        // SAFETY: the mapping is total_len bytes and moves into the ClientShared.
        let seg = unsafe { SegmentView::new(map.as_ptr(), layout) };
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut c = ClientShared::new(7, 0, "late".into(), map, seg, OwnedFd::from(ours), on);
        c.stage_at_first_copy();
        c
    }

    #[test]
    fn a_later_clients_staging_is_registered_at_its_first_copy_and_given_back() {
        let host = Arc::new(HostGpu::new(0, 1 << 20));
        let before = host.registered_ranges();
        let c = late_client(&host);
        let base = c.seg.base() as u64;
        let layout = c.seg.layout;
        let (ctl, _) = layout.control_range();
        assert!(
            host.registered_at(base + ctl as u64),
            "the channel headers are"
        );
        assert_eq!(host.registered_ranges(), before + 1, "and nothing else yet");
        let (s1, _) = layout.staging_range(1).unwrap();
        assert!(!host.registered_at(base + s1 as u64));
        c.staging_ready(1).unwrap();
        assert!(
            host.registered_at(base + s1 as u64),
            "channel 1 at its first copy"
        );
        c.staging_ready(1).unwrap();
        assert_eq!(host.registered_ranges(), before + 2, "once");
        assert_eq!(
            c.staging_ready(layout.params.num_channels as usize),
            Err(crate::gpu::code::INVALID_VALUE)
        );
        assert_eq!(
            c.segment_registrations(),
            vec![layout.control_range(), layout.staging_range(1).unwrap()]
        );
        drop(c);
        // Given back by the unpinner once the (idle) GPU is quiet.
        let t = std::time::Instant::now();
        while host.registered_ranges() != before && t.elapsed() < std::time::Duration::from_secs(5)
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(host.registered_ranges(), before, "both ranges unregistered");
    }

    #[test]
    fn a_segment_made_ahead_needs_no_registration_at_a_copy() {
        let host = Arc::new(HostGpu::new(0, 1 << 20));
        let gpu: Arc<dyn Gpu> = host.clone();
        let (c, _peer) = crate::testing::fake_client(&gpu, 1).unwrap();
        let n = host.registered_ranges();
        for ch in 0..c.seg.layout.params.num_channels as usize {
            c.staging_ready(ch).unwrap();
        }
        assert_eq!(host.registered_ranges(), n);
        assert_eq!(
            c.segment_registrations(),
            vec![c.seg.layout.registered_range()]
        );
    }
}
