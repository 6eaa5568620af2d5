//! A client's pinned host memory (cuMemHostRegister of its own pages): mapped into the
//! server, registered with the driver, looked up by copies, and given back.

use super::*;

impl ClientShared {
    /// Whether `[addr, addr+len)` lies inside one of the client's pinned allocations.
    pub fn pinned_contains(&self, addr: u64, len: u64) -> bool {
        let p = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
        p.range(..=addr)
            .next_back()
            .is_some_and(|(&s, &n)| addr.checked_add(len).is_some_and(|end| end <= s + n))
    }

    /// Runs `f` with the pinned ranges held still: `f` gets a test of whether a range lies
    /// in one, true as long as `f` runs (a range leaves the list before it is unmapped).
    pub fn with_pinned<R>(&self, f: impl FnOnce(&dyn Fn(u64, u64) -> bool) -> R) -> R {
        let p = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
        let inside = |addr: u64, len: u64| {
            p.range(..=addr)
                .next_back()
                .is_some_and(|(&s, &n)| addr.checked_add(len).is_some_and(|end| end <= s + n))
        };
        f(&inside)
    }

    /// Maps the client's memfd at `addr` (never over anything already mapped here) and
    /// registers it, so the GPU reaches the same pages at the same address.
    pub fn pin(&self, fd: std::os::fd::BorrowedFd, addr: u64, len: u64) -> Result<(), i32> {
        use crate::gpu::code;
        let page = 4096;
        if len == 0 || !len.is_multiple_of(page) || !addr.is_multiple_of(page) {
            return Err(code::INVALID_VALUE);
        }
        {
            let b = crate::client::bounds::bounds();
            let p = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
            let (_, gone_ranges) = *self.unpinning.lock().unwrap_or_else(|e| e.into_inner());
            // Bytes are bounded per process (what it holds through any connection, ranges
            // given back but not yet unregistered included), ranges per connection.
            let held = self.account.pinned.load(Ordering::Relaxed);
            if p.len() + gone_ranges >= b.pinned_ranges || held.saturating_add(len) > b.pinned_bytes
            {
                return Err(code::OUT_OF_MEMORY);
            }
        }
        omps_ring::shm::check_segment(fd, len as usize).map_err(|_| code::INVALID_VALUE)?;
        let gpu = self.registered_on.as_ref().ok_or(code::NOT_SUPPORTED)?;
        // And every client together: N clients may not pin N times the per-client bound.
        if !self.account.totals.take_pinned(len) {
            return Err(code::OUT_OF_MEMORY);
        }
        if let Err(e) = self.charge_pinned(len, MAX_DEVICES) {
            self.account.totals.give_pinned(len);
            return Err(e);
        }
        self.map_and_register(gpu, fd, addr, len)
            .inspect_err(|_| self.unpinned(len))
    }

    fn map_and_register(
        &self,
        gpu: &Arc<dyn Gpu>,
        fd: std::os::fd::BorrowedFd,
        addr: u64,
        len: u64,
    ) -> Result<(), i32> {
        use crate::gpu::code;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the kernel checks
        // the address range; the fd is sealed against shrinking.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(code::NOT_SUPPORTED);
        }
        if p as u64 != addr {
            // SAFETY: unmapping what this call just mapped (an old kernel ignored the hint).
            unsafe { libc::munmap(p, len as usize) };
            return Err(code::NOT_SUPPORTED);
        }
        // SAFETY: just mapped; stays mapped until unpin or drop, which unregister first.
        if let Err(e) = unsafe { gpu.register_host(p as *mut u8, len as usize) } {
            // SAFETY: unmapping what this call just mapped.
            unsafe { libc::munmap(p, len as usize) };
            return Err(e.0);
        }
        self.pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(addr, len);
        Ok(())
    }

    /// Unregisters and unmaps a pinned range once nothing uses it.
    /// Pinned ranges given back whose fences have not all passed yet.
    pub fn unpinning_ranges(&self) -> usize {
        self.unpinning.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    pub fn release_pinned(&self, addr: u64, len: u64) {
        if let Some(gpu) = &self.registered_on {
            // SAFETY: the range was registered by pin(); the caller fenced the client's work.
            if let Err(e) = unsafe { gpu.unregister_host(addr as *mut u8) } {
                tracing::warn!(
                    client = self.id,
                    "unregistering pinned memory failed: {}",
                    e.0
                );
            }
        }
        // SAFETY: the range was mapped by pin() and nothing references it any more.
        unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) };
    }
}

impl Drop for ClientShared {
    fn drop(&mut self) {
        // The client is gone: its pinned ranges and segment are unregistered once the GPU
        // is quiet, since unregistering waits for every running kernel and holds up every
        // client's launches meanwhile.
        let pinned = std::mem::take(&mut *self.pinned.lock().unwrap_or_else(|e| e.into_inner()));
        for &len in pinned.values() {
            self.unpinned(len);
        }
        let mapping = self.mapping.take();
        let Some(gpu) = self.registered_on.clone() else {
            for (addr, len) in pinned {
                drop(Unmap(addr, len));
            }
            return;
        };
        for (addr, len) in pinned {
            // SAFETY: registered by pin(); the last reference is gone, so every worker has
            // fenced this client's streams; Unmap keeps the range mapped until then.
            unsafe {
                crate::release::unpin::unpinner().unregister_later(
                    gpu.clone(),
                    addr as *mut u8,
                    len,
                    Box::new(Unmap(addr, len)),
                )
            };
        }
        // The segment's ranges (one, or the control range and each channel's staging that
        // a copy registered): the mapping stays until the last of them is unregistered.
        let mapping = Arc::new(mapping);
        for (off, len) in self.segment_registrations() {
            // SAFETY: as above, for a registered range of the segment; the mapping travels
            // along.
            unsafe {
                crate::release::unpin::unpinner().unregister_later(
                    gpu.clone(),
                    self.seg.base().add(off),
                    len as u64,
                    Box::new(mapping.clone()),
                )
            };
        }
    }
}

/// A pinned range mapped by [`ClientShared::pin`], unmapped when dropped.
struct Unmap(u64, u64);

impl Drop for Unmap {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by pin() and nothing references it any more.
        unsafe { libc::munmap(self.0 as *mut libc::c_void, self.1 as usize) };
    }
}
