//! Page-locked and managed host memory this process holds (cuMemHostAlloc, cuMemHostRegister,
//! cuMemAllocManaged) and the lookups copies, memsets, frees and the staging arena make on
//! it: below the memory families, which all ask whether a pointer is shared with the server.

use crate::cuda::*;
use crate::state::entry::live;
use omps_ring::shm::{self, Mapping};
use omps_ring::wire::hostmem;
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Mutex;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// Shared with the server and registered there: DMA and zero-copy.
    Shared,
    /// The shim's own memory (the fallback): staged.
    Private,
    /// The program's memory, registered with cuMemHostRegister: staged.
    Registered,
}

#[derive(Clone, Copy)]
pub(crate) struct HostRange {
    pub(crate) len: usize,
    pub(crate) flags: u32,
    pub(crate) kind: Kind,
}

pub(crate) static HOST: Mutex<BTreeMap<usize, HostRange>> = Mutex::new(BTreeMap::new());
pub(crate) static SHARED_MAPS: Mutex<Option<HashMap<usize, Mapping>>> = Mutex::new(None);

pub(crate) fn host_range(p: usize) -> Option<(usize, HostRange)> {
    let h = HOST.lock().unwrap_or_else(|e| e.into_inner());
    let (&s, &r) = h.range(..=p).next_back()?;
    (p < s + r.len).then_some((s, r))
}

/// Whether `[p, p+len)` lies in one shared (server-registered) allocation.
pub(crate) fn is_shared(p: u64, len: usize) -> bool {
    host_range(p as usize)
        .is_some_and(|(s, r)| r.kind == Kind::Shared && p as usize + len <= s + r.len)
}

/// Whether `[p, p+len)` lies in one page-locked range the server cannot reach (the
/// shim's own fallback memory, or program memory registered in place of nothing).
pub(crate) fn is_unshared_host(p: u64, len: usize) -> bool {
    host_range(p as usize).is_some_and(|(s, r)| {
        r.kind != Kind::Shared
            && (p as usize)
                .checked_add(len)
                .is_some_and(|e| e <= s + r.len)
    })
}

/// Whether `[p, p+len)` lies in one page-locked range of any kind: under unified
/// addressing such memory is a valid "device" pointer for the copies that name a
/// direction (cuMemcpyDtoD with a pinned buffer on one side, as XLA's autotuner does).
pub(crate) fn is_pinned_host(p: u64, len: usize) -> bool {
    is_shared(p, len) || is_unshared_host(p, len)
}

/// With unified addressing every page-locked allocation is mapped: the driver reports
/// CU_MEMHOSTALLOC_DEVICEMAP whether or not it was asked for.
pub(crate) const DEVICEMAP: u32 = 2;

pub(crate) fn shared_alloc(len: usize) -> Option<usize> {
    let c = live().ok()?;
    let fd = shm::create_segment("omps-pinned", len).ok()?;
    // The server maps the memfd at the same address, which may already be in use there
    // (its own mappings, the driver's address reservations): then try elsewhere, at
    // random addresses between the programs' heaps and their mmap areas.
    for attempt in 0..PIN_ATTEMPTS {
        let hint = if attempt == 0 { 0 } else { random_hint() };
        let map = Mapping::map_near(fd.as_fd(), len, hint).ok()?;
        let addr = map.as_ptr() as usize;
        if c.host_request(hostmem::PIN, addr as u64, len as u64, Some(fd.as_raw_fd()))
            .is_ok()
        {
            SHARED_MAPS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(HashMap::new)
                .insert(addr, map);
            return Some(addr);
        }
    }
    None
}

pub(crate) const PIN_ATTEMPTS: usize = 4;

/// A 2 MiB-aligned address in [16 TiB, 80 TiB): above the heaps of both processes and
/// below where Linux puts executables (about 85 TiB) and the mmap area (near 128 TiB).
pub(crate) fn random_hint() -> usize {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STATE: AtomicU64 = AtomicU64::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ (std::process::id() as u64) << 32;
    let mut x = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) ^ seed;
    x ^= x >> 33;
    x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x ^= x >> 33;
    const LOW: u64 = 16 << 40;
    const SPAN: u64 = 64 << 40;
    (LOW + (x % SPAN) / (2 << 20) * (2 << 20)) as usize
}

/// Whether `p` starts a shared allocation made by cuMemHostAlloc (not a registration).
pub(crate) fn allocated_here(p: usize) -> bool {
    SHARED_MAPS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|m| m.contains_key(&p))
}

/// Not a CUDA flag: marks managed memory (api/managed.rs), which is shared memory that
/// is also one of the client's device ranges.
pub(crate) const MANAGED: u32 = 1 << 31;

pub(crate) fn host_alloc(size: usize, flags: u32) -> Result<*mut c_void, CUresult> {
    live()?;
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let len = size
        .checked_next_multiple_of(4096)
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let (p, kind) = match shared_alloc(len) {
        Some(p) => (p, Kind::Shared),
        // Managed memory must be the GPU's to reach.
        None if flags & MANAGED != 0 => return Err(CUDA_ERROR_OUT_OF_MEMORY),
        None => {
            let layout = std::alloc::Layout::from_size_align(len, 4096)
                .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
            // SAFETY: non-zero size.
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            if p.is_null() {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            (p as usize, Kind::Private)
        }
    };
    HOST.lock().unwrap_or_else(|e| e.into_inner()).insert(
        p,
        HostRange {
            len,
            flags: flags | DEVICEMAP,
            kind,
        },
    );
    Ok(p as *mut c_void)
}

/// The managed allocation holding `p`: (start, length).
pub(crate) fn managed_range(p: usize) -> Option<(usize, usize)> {
    host_range(p).and_then(|(s, r)| (r.flags & MANAGED != 0).then_some((s, r.len)))
}

/// Frees what host_alloc made at `p`: page-locked memory (cuMemFreeHost) or, with
/// `managed`, managed memory (cuMemFree).
pub(crate) fn free_host(p: usize, managed: bool) -> Result<(), CUresult> {
    {
        let p = p as *mut c_void;
        let r = {
            let mut h = HOST.lock().unwrap_or_else(|e| e.into_inner());
            match h.get(&(p as usize)) {
                Some(r)
                    if (r.flags & MANAGED != 0) == managed
                        && (r.kind == Kind::Private
                            || (r.kind == Kind::Shared && allocated_here(p as usize))) =>
                {
                    h.remove(&(p as usize)).expect("present")
                }
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
        };
        match r.kind {
            Kind::Shared => {
                // The server releases its side once this client's queued work is done.
                let res = live()?.host_request(hostmem::UNPIN, p as u64, r.len as u64, None);
                SHARED_MAPS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(HashMap::new)
                    .remove(&(p as usize));
                res
            }
            _ => {
                // SAFETY: allocated by host_alloc with this size and alignment.
                unsafe {
                    std::alloc::dealloc(
                        p as *mut u8,
                        std::alloc::Layout::from_size_align_unchecked(r.len, 4096),
                    )
                };
                Ok(())
            }
        }
    }
}
