//! Stream-ordered allocation (cuMemAllocAsync, cuMemFreeAsync) and memory pools, as
//! PyTorch's `backend:cudaMallocAsync` uses them.
//!
//! A pool is the client's own: its blocks are allocated in the server like cuMemAlloc's
//! and count as the client's memory. An allocation is valid as soon as the call returns,
//! which satisfies every stream order. A freed block is kept in the pool while the pool's
//! release threshold allows (the default, 0, keeps nothing), and handed out again only to
//! work on the stream that freed it, where stream order makes reuse safe; a block freed on
//! one stream is never reused on another. Cached blocks beyond the threshold are freed at
//! once (the server frees them after the client's queued work), where the driver would
//! trim at the next synchronization.
//!
//! A pool made exportable (a POSIX descriptor handle type) is shared with other processes
//! through the server (pool_share.rs); its freed blocks are not kept, since another
//! process may still hold them.

/// The pool settings entry points, under the path they always had.
pub use super::pool_attr::{
    cuMemPoolGetAccess, cuMemPoolGetAttribute, cuMemPoolSetAccess, cuMemPoolSetAttribute,
};
use super::vmm::call_raw;
use super::vmm_share::POSIX_FD;
use crate::cuda::*;
use crate::handles::{leak, resolve, retire, POOL_MAGIC};
use crate::state::blocks::alloc;
use crate::state::entry::{entry, out};
use crate::state::streams::{per_thread, resolve_stream, CUstream};
use omps_ring::wire::vmm;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

#[derive(Default)]
pub(crate) struct PoolState {
    pub(crate) release_threshold: u64,
    /// REUSE_FOLLOW_EVENT_DEPENDENCIES, REUSE_ALLOW_OPPORTUNISTIC,
    /// REUSE_ALLOW_INTERNAL_DEPENDENCIES: kept and read back (reuse here is always the
    /// strictest, same-stream kind).
    pub(crate) reuse: [c_int; 3],
    /// Freed blocks kept for reuse: (address, size, stream that freed it).
    pub(crate) cached: Vec<(u64, u64, usize)>,
    pub(crate) used: u64,
    pub(crate) used_high: u64,
    pub(crate) reserved_high: u64,
    /// Other devices given read-write access (cuMemPoolSetAccess), bit per device.
    pub(crate) peers: u64,
}

impl PoolState {
    pub(crate) fn reserved(&self) -> u64 {
        self.used + self.cached.iter().map(|b| b.1).sum::<u64>()
    }
    fn note_high(&mut self) {
        self.used_high = self.used_high.max(self.used);
        self.reserved_high = self.reserved_high.max(self.reserved());
    }
}

#[repr(C)]
pub struct Pool {
    magic: AtomicU32,
    pub(crate) dev: usize,
    is_default: bool,
    pub(crate) state: Mutex<PoolState>,
    pub(crate) share: Share,
}

pub type CUmemoryPool = *mut Pool;

pub(crate) fn new_pool(dev: usize, is_default: bool, share: Share) -> &'static Pool {
    let reuse = [1, 1, 1]; // the driver's defaults
                           // SAFETY: freshly leaked, never freed (handles stay readable, see handles.rs).
    unsafe {
        &*leak(Pool {
            magic: AtomicU32::new(POOL_MAGIC),
            dev,
            is_default,
            state: Mutex::new(PoolState {
                reuse,
                ..Default::default()
            }),
            share,
        })
    }
}

struct Devices {
    default: Vec<&'static Pool>,
    current: Mutex<Vec<usize>>,
}

fn devices() -> Result<&'static Devices, CUresult> {
    static D: OnceLock<Devices> = OnceLock::new();
    let n = crate::state::entry::live()?.num_devices();
    Ok(D.get_or_init(|| {
        let default: Vec<_> = (0..n)
            .map(|d| new_pool(d, true, Default::default()))
            .collect();
        let current = default.iter().map(|p| *p as *const Pool as usize).collect();
        Devices {
            default,
            current: Mutex::new(current),
        }
    }))
}

/// How a pool is shared (pool_share.rs shares it).
#[derive(Default)]
pub struct Share {
    /// The handle types it was made exportable as (0: not exportable).
    pub(crate) handle_types: c_uint,
    /// This process's number for it, which the server knows it by.
    pub(crate) number: u32,
    /// The server's key of the pool it was imported as.
    pub(crate) imported: Option<u64>,
    /// The server's key of this process's pool, once exported.
    pub(crate) exported: Mutex<Option<u64>>,
}

impl Share {
    /// Sharing for a new pool of `handle_types` (CUmemPoolProps::handleTypes).
    pub(crate) fn new(handle_types: c_uint) -> Result<Self, CUresult> {
        const FABRIC: c_uint = 8;
        const NOT_PERMITTED: CUresult = 800;
        match handle_types {
            0 => Ok(Share::default()),
            POSIX_FD => {
                static NEXT: AtomicU32 = AtomicU32::new(1);
                Ok(Share {
                    handle_types,
                    number: NEXT.fetch_add(1, Ordering::Relaxed),
                    ..Default::default()
                })
            }
            // As the driver answers where no fabric is set up (api/vmm.rs).
            t if t & FABRIC != 0 => Err(NOT_PERMITTED),
            _ => Err(crate::unsupported::unsupported(
                "cuMemPoolCreate with a handle type other than a POSIX descriptor",
            )),
        }
    }

    /// Whether other processes may hold its blocks: they are not kept for reuse.
    pub(crate) fn exportable(&self) -> bool {
        self.handle_types != 0
    }
}

/// A pool is destroyed: the server forgets this process's part in sharing it.
pub(crate) fn destroyed(p: &Pool) {
    let exported = *p.share.exported.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(key) = exported.or(p.share.imported) {
        let _ = call_raw::<[u64; 3]>(p.dev, vmm::POOL_RELEASE, 0, [key, 0, 0]);
    }
}

/// What the driver answers the stream-ordered allocator's calls on a device without it
/// (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED 0, as on Pascal-like GPUs):
/// CUDA_ERROR_NOT_SUPPORTED. The pools here are the shim's own, so no driver says it.
pub(crate) fn pools_on(dev: usize) -> Result<(), CUresult> {
    const MEMORY_POOLS_SUPPORTED: usize = 115;
    let d = crate::state::device::device(
        CUdevice::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?,
    )?;
    match d.attribute(MEMORY_POOLS_SUPPORTED) {
        Some(0) => Err(CUDA_ERROR_NOT_SUPPORTED),
        _ => Ok(()),
    }
}

pub(crate) fn pool(p: CUmemoryPool) -> Result<&'static Pool, CUresult> {
    // SAFETY: a handle from this shim, as the API requires.
    unsafe { resolve(p, POOL_MAGIC) }
}

/// Which pool each live pool allocation came from, and its size.
static ALLOCS: Mutex<Option<HashMap<u64, (usize, u64)>>> = Mutex::new(None);

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn stream_key(s: CUstream) -> Result<(usize, usize), CUresult> {
    let st = resolve_stream(s)?;
    let dev = match st {
        Some(st) => st.dev,
        None => crate::state::ctx::current_dev()?,
    };
    Ok((st.map_or(0, |st| st as *const _ as usize), dev))
}

fn alloc_from(p: &'static Pool, size: usize, s: CUstream) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (key, dev) = stream_key(s)?;
    // An imported pool's memory is its exporter's to allocate.
    if dev != p.dev || p.share.imported.is_some() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let size = size as u64;
    let reused = {
        let mut st = lock(&p.state);
        let best = st
            .cached
            .iter()
            .enumerate()
            .filter(|(_, b)| b.2 == key && b.1 >= size && b.1 <= size.saturating_mul(2))
            .min_by_key(|(_, b)| b.1)
            .map(|(i, _)| i);
        best.map(|i| st.cached.swap_remove(i))
    };
    let (ptr, len) = match reused {
        Some((ptr, len, _)) => (ptr, len),
        None => (alloc(p.dev, size as usize)?, size),
    };
    let mut st = lock(&p.state);
    st.used += len;
    st.note_high();
    lock(&ALLOCS)
        .get_or_insert_with(HashMap::new)
        .insert(ptr, (p as *const Pool as usize, len));
    Ok(ptr)
}

/// Frees cached blocks of `p` until it holds at most `keep` bytes.
pub(crate) fn trim(p: &Pool, keep: u64) {
    let gone: Vec<u64> = {
        let mut st = lock(&p.state);
        let mut gone = Vec::new();
        while st.reserved() > keep {
            match st.cached.pop() {
                Some((ptr, _, _)) => gone.push(ptr),
                None => break,
            }
        }
        gone
    };
    for ptr in gone {
        let _ = free(ptr);
    }
}

/// The pool handle an allocation starting at `ptr` came from, or 0.
pub(crate) fn pool_of(ptr: u64) -> usize {
    lock(&ALLOCS)
        .as_ref()
        .and_then(|m| m.get(&ptr))
        .map_or(0, |&(p, _)| p)
}

/// A pool allocation freed with cuMemFree: it leaves its pool's books.
pub(crate) fn forget(ptr: u64) {
    let Some((p, len)) = lock(&ALLOCS).as_mut().and_then(|m| m.remove(&ptr)) else {
        return;
    };
    // SAFETY: recorded from a live pool; pools are never freed.
    let p = unsafe { &*(p as *const Pool) };
    let mut st = lock(&p.state);
    st.used = st.used.saturating_sub(len);
}

/// cuMemFree's work, for frees the capture modes do not restrict (cuMemFreeAsync's).
pub(crate) fn free(ptr: CUdeviceptr) -> Result<(), CUresult> {
    if ptr == 0 || crate::api::graph_mem::freed(ptr, false) {
        // Graph memory is its graphs' to free (graph_mem.rs).
        return Ok(());
    }
    if let Some(r) = crate::api::managed::free(ptr) {
        return r;
    }
    if let Some(r) = crate::state::blocks::free_imported(ptr) {
        return r;
    }
    crate::state::entry::live()?;
    forget(ptr);
    crate::state::blocks::free_block(ptr)
}

fn free_async(ptr: u64, s: CUstream) -> Result<(), CUresult> {
    let (key, dev) = stream_key(s)?;
    pools_on(dev)?;
    if super::graph_mem::is_graph_alloc(ptr) {
        // A free during a capture (a free node), or graph memory freed outside its
        // graph: its graphs free it.
        let in_graph = crate::state::capture::any_capture()
            && crate::state::capture::capture_info(s)?.0 == omps_ring::wire::graph::STATUS_ACTIVE;
        super::graph_mem::freed(ptr, in_graph);
        return Ok(());
    }
    let Some((p, len)) = lock(&ALLOCS).as_mut().and_then(|m| m.remove(&ptr)) else {
        // Memory from cuMemAlloc may be freed this way too; the server's free waits for
        // all of the client's queued work, which covers this stream's.
        return free(ptr);
    };
    // SAFETY: recorded from a live pool; pools are never freed.
    let p = unsafe { &*(p as *const Pool) };
    let threshold = {
        let mut st = lock(&p.state);
        st.used = st.used.saturating_sub(len);
        if p.share.exportable() {
            // Another process may hold it: the server frees it after the last importer.
            drop(st);
            return free(ptr);
        }
        st.cached.push((ptr, len, key));
        st.release_threshold
    };
    trim(p, threshold);
    Ok(())
}

/// An allocation on a capturing stream is graph memory (graph_mem.rs): Some(address).
fn captured_alloc(dev: usize, size: usize, s: CUstream) -> Result<Option<u64>, CUresult> {
    if !crate::state::capture::any_capture() {
        return Ok(None);
    }
    let (status, id) = crate::state::capture::capture_info(s)?;
    if status != omps_ring::wire::graph::STATUS_ACTIVE {
        return Ok(None);
    }
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    super::graph_mem::allocate_captured(dev, size, id).map(Some)
}

/// # Safety
/// `dptr` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    s: CUstream,
) -> CUresult {
    entry(|| {
        let (_, dev) = stream_key(s)?;
        pools_on(dev)?;
        if let Some(p) = captured_alloc(dev, size, s)? {
            // SAFETY: the caller's pointer.
            return unsafe { out(dptr, p) };
        }
        let cur = lock(&devices()?.current)[dev];
        let p = alloc_from(pool(cur as CUmemoryPool)?, size, s)?;
        // SAFETY: the caller's pointer.
        unsafe { out(dptr, p) }
    })
}

/// # Safety
/// `dptr` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    p: CUmemoryPool,
    s: CUstream,
) -> CUresult {
    entry(|| {
        let pl = pool(p)?;
        let ptr = match captured_alloc(pl.dev, size, s)? {
            Some(ptr) => ptr,
            None => alloc_from(pl, size, s)?,
        };
        // SAFETY: the caller's pointer.
        unsafe { out(dptr, ptr) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, s: CUstream) -> CUresult {
    entry(|| free_async(ptr, s))
}

/// # Safety
/// As the entry point without the suffix.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    d: *mut CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuMemAllocAsync(d, n, s) })
}

/// # Safety
/// As the entry point without the suffix.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    d: *mut CUdeviceptr,
    n: usize,
    p: CUmemoryPool,
    s: CUstream,
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuMemAllocFromPoolAsync(d, n, p, s) })
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync_ptsz(ptr: CUdeviceptr, s: CUstream) -> CUresult {
    per_thread(|| cuMemFreeAsync(ptr, s))
}

/// The fields of CUmemPoolProps that omps reads.
#[repr(C)]
pub struct PoolProps {
    alloc_type: c_uint,
    handle_types: c_uint,
    location_type: c_uint,
    location_id: c_int,
}

const ALLOC_PINNED: c_uint = 1;
pub(crate) const LOCATION_DEVICE: c_uint = 1;

/// # Safety
/// `out_pool` is null or writable; `props` is null or a CUmemPoolProps.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    out_pool: *mut CUmemoryPool,
    props: *const PoolProps,
) -> CUresult {
    entry(|| {
        if props.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null; the caller's CUmemPoolProps, which starts with these fields.
        let pr = unsafe { &*props };
        if pr.alloc_type != ALLOC_PINNED || pr.location_type != LOCATION_DEVICE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let share = Share::new(pr.handle_types)?;
        crate::state::device::device(pr.location_id)?;
        pools_on(pr.location_id as usize)?;
        let p = new_pool(pr.location_id as usize, false, share);
        // SAFETY: the caller's pointer.
        unsafe { out(out_pool, p as *const Pool as CUmemoryPool) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemPoolDestroy(p: CUmemoryPool) -> CUresult {
    entry(|| {
        let pl = pool(p)?;
        if pl.is_default {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        trim(pl, 0);
        retire(&pl.magic, POOL_MAGIC)?;
        destroyed(pl);
        // A destroyed current pool leaves its device with the default one.
        let d = devices()?;
        let mut cur = lock(&d.current);
        if cur[pl.dev] == p as usize {
            cur[pl.dev] = d.default[pl.dev] as *const Pool as usize;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuMemPoolTrimTo(p: CUmemoryPool, keep: usize) -> CUresult {
    entry(|| {
        trim(pool(p)?, keep as u64);
        Ok(())
    })
}

/// # Safety
/// `out_pool` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    out_pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        crate::state::device::device(dev)?;
        pools_on(dev as usize)?;
        let p = devices()?.default[dev as usize];
        // SAFETY: the caller's pointer.
        unsafe { out(out_pool, p as *const Pool as CUmemoryPool) }
    })
}

/// # Safety
/// `out_pool` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(
    out_pool: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        crate::state::device::device(dev)?;
        pools_on(dev as usize)?;
        let p = lock(&devices()?.current)[dev as usize];
        // SAFETY: the caller's pointer.
        unsafe { out(out_pool, p as CUmemoryPool) }
    })
}

#[no_mangle]
pub extern "C" fn cuDeviceSetMemPool(dev: CUdevice, p: CUmemoryPool) -> CUresult {
    entry(|| {
        crate::state::device::device(dev)?;
        pools_on(dev as usize)?;
        if pool(p)?.dev != dev as usize {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        lock(&devices()?.current)[dev as usize] = p as usize;
        Ok(())
    })
}
