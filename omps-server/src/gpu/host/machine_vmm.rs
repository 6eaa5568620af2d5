//! Virtual memory of the host GPUs of one machine, as the driver has it: one address space
//! for all of them, physical memory that any of them may map, and access set per GPU.
//!
//! A reservation is a range of this process's address space (PROT_NONE, no memory), at a
//! made-up device address; a handle's physical memory is a memfd; a mapping maps the memfd
//! into the reservation, so two mappings of one handle (an exporter's and an importer's)
//! share their bytes, and a copy may cross the seam of two mappings, as on a GPU. A GPU
//! reaches a mapped range only where access was set for it (`cuMemSetAccess`): the tests of
//! peer access see a kernel on another GPU fault where the driver's would.

use crate::gpu::{code, CuError, GpuResult};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};

/// One mapping: its size, the GPU whose session made it, the GPU its memory lives on, and
/// the GPUs with read-write access (bit per ordinal).
struct Mapping {
    size: u64,
    via: usize,
    home: usize,
    access: u64,
}

/// What the GPUs of one machine share of virtual memory.
#[derive(Default)]
pub struct VmmSpace {
    /// Reservation start -> (host address of its bytes, size).
    reservations: BTreeMap<u64, (usize, u64)>,
    /// Handle -> (its memfd, size, the GPU it was made on).
    handles: BTreeMap<u64, (OwnedFd, u64, usize)>,
    mappings: BTreeMap<u64, Mapping>,
    next_handle: u64,
}

fn bad() -> CuError {
    CuError(code::INVALID_VALUE)
}

impl VmmSpace {
    /// A reservation of `size` bytes at device address `at`.
    pub fn reserve(&mut self, at: u64, size: u64) -> GpuResult<()> {
        // SAFETY: a new anonymous mapping that touches nothing of ours; no memory is
        // committed for it (PROT_NONE, MAP_NORESERVE).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CuError(code::OUT_OF_MEMORY));
        }
        self.reservations.insert(at, (p as usize, size));
        Ok(())
    }

    pub fn address_free(&mut self, at: u64, size: u64) -> GpuResult<()> {
        match self.reservations.get(&at) {
            Some(&(host, n)) if n == size && !self.overlaps(at, size) => {
                self.reservations.remove(&at);
                // SAFETY: the reservation's own host range, made by `reserve`; nothing is
                // mapped in it any more, so no range of it is handed out (`bytes`).
                unsafe { libc::munmap(host as *mut libc::c_void, n as usize) };
                Ok(())
            }
            _ => Err(bad()),
        }
    }

    /// Physical memory of `size` bytes on GPU `home`: its handle.
    pub fn create(&mut self, size: u64, home: usize) -> GpuResult<u64> {
        let fd = omps_ring::shm::create_segment("omps-host-vmm", size as usize)
            .map_err(|_| CuError(code::OUT_OF_MEMORY))?;
        // Apart from the GPUs' other handles, so that a mix-up shows.
        self.next_handle += 1;
        let h = (1 << 40) + self.next_handle;
        self.handles.insert(h, (fd, size, home));
        Ok(h)
    }

    /// The memory lives on in its mappings, as the driver's does.
    pub fn release(&mut self, h: u64) -> GpuResult<()> {
        self.handles
            .remove(&h)
            .map(drop)
            .ok_or(CuError(code::INVALID_HANDLE))
    }

    fn overlaps(&self, at: u64, size: u64) -> bool {
        let end = at.saturating_add(size);
        self.mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&s, m)| s + m.size > at)
    }

    /// The reservation holding all of `[at, at+size)`: (start, host address).
    fn reservation(&self, at: u64, size: u64) -> Option<(u64, usize)> {
        let (&s, &(host, n)) = self.reservations.range(..=at).next_back()?;
        (at.checked_add(size)? <= s + n).then_some((s, host))
    }

    pub fn map(&mut self, at: u64, size: u64, offset: u64, h: u64, via: usize) -> GpuResult<()> {
        let (fd, hsize, home) = self.handles.get(&h).ok_or(CuError(code::INVALID_HANDLE))?;
        let page = 4096;
        if size == 0
            || offset.checked_add(size).is_none_or(|e| e > *hsize)
            || !offset.is_multiple_of(page)
            || self.overlaps(at, size)
        {
            return Err(bad());
        }
        let (start, host) = self.reservation(at, size).ok_or_else(bad)?;
        if !(at - start).is_multiple_of(page) {
            return Err(bad());
        }
        let target = host + (at - start) as usize;
        // SAFETY: replaces pages of our own reservation (checked to hold the range) with
        // the handle's memfd, which stays valid while mapped.
        let p = unsafe {
            libc::mmap(
                target as *mut libc::c_void,
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CuError(code::OUT_OF_MEMORY));
        }
        // Every mapping starts with no access, as the driver's do.
        let (home, access) = (*home, 0);
        self.mappings.insert(
            at,
            Mapping {
                size,
                via,
                home,
                access,
            },
        );
        Ok(())
    }

    pub fn unmap(&mut self, at: u64) -> GpuResult<()> {
        let m = self.mappings.remove(&at).ok_or_else(bad)?;
        let (start, host) = self.reservation(at, m.size).ok_or_else(bad)?;
        // SAFETY: our reservation's pages; anonymous memory in their place (not a hole), so
        // a range handed out before the unmap cannot reach the handle's memory any more.
        unsafe {
            libc::mmap(
                (host + (at - start) as usize) as *mut libc::c_void,
                m.size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        Ok(())
    }

    /// Read-write access to `[at, at+size)` (whole mappings) for each GPU of `gpus`;
    /// `reaches(a, b)`: whether GPU a's memory can be reached from GPU b.
    pub fn set_access(
        &mut self,
        at: u64,
        size: u64,
        gpus: &[usize],
        reaches: impl Fn(usize, usize) -> bool,
    ) -> GpuResult<()> {
        let end = at.checked_add(size).ok_or_else(bad)?;
        let starts: Vec<u64> = self.mappings.range(at..end).map(|(&s, _)| s).collect();
        let covered: u64 = starts.iter().map(|s| self.mappings[s].size).sum();
        if starts.first() != Some(&at) || covered != size {
            return Err(bad());
        }
        for s in &starts {
            let home = self.mappings[s].home;
            if gpus.iter().any(|&g| g >= 64 || !reaches(home, g)) {
                return Err(CuError(code::INVALID_DEVICE));
            }
        }
        for s in starts {
            let m = self.mappings.get_mut(&s).expect("listed above");
            m.access |= gpus.iter().fold(0, |a, &g| a | 1 << g);
        }
        Ok(())
    }

    /// Whether `addr` lies in a reservation (then only `bytes` reaches it).
    pub fn reserved(&self, addr: u64) -> bool {
        self.reservation(addr, 0).is_some()
    }

    /// The bytes of `[addr, addr+len)` as GPU `gpu` sees them: mapped throughout, with
    /// access set for it.
    pub fn bytes(&self, addr: u64, len: usize, gpu: usize) -> GpuResult<(*mut u8, usize)> {
        let (start, host) = self.reservation(addr, len as u64).ok_or_else(bad)?;
        let (mut at, end) = (addr, addr + len as u64);
        while at < end {
            match self.mappings.range(..=at).next_back() {
                Some((&s, m)) if s + m.size > at && m.access & (1 << gpu) != 0 => at = s + m.size,
                _ => return Err(bad()),
            }
        }
        Ok(((host + (addr - start) as usize) as *mut u8, len))
    }

    /// Reservations, handles and mappings alive now.
    pub fn counts(&self) -> (usize, usize, usize) {
        (
            self.reservations.len(),
            self.handles.len(),
            self.mappings.len(),
        )
    }

    /// Bytes mapped through GPU `gpu`'s sessions.
    pub fn mapped_via(&self, gpu: usize) -> u64 {
        self.mappings
            .values()
            .filter(|m| m.via == gpu)
            .map(|m| m.size)
            .sum()
    }
}
