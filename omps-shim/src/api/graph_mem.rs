//! Graph memory: what `cuMemAllocAsync` makes during a capture, and what
//! `cuGraphAddMemAllocNode` adds to a graph built by hand.
//!
//! omps does not make the driver's memory nodes. Such an allocation is an ordinary
//! allocation of the client's (so it counts against the client's memory), made when the
//! node is made, so its address is fixed as the driver's is. The graph that holds it, and
//! every executable graph made from that graph, keep it: it is freed once the last of
//! them is destroyed, after the client's queued work (the server's free waits for it).
//! A free node, a free during the capture, and a free outside any graph of an address
//! still held by a graph do not free it: a replay would need it again. An allocation a
//! launch left to the program outlives its graphs, as natively, until the program frees
//! it (`State::orphans`). The footprint is
//! the sum of a graph's allocations, where the driver would reuse memory between an
//! allocation freed inside the graph and a later one (docs/design.md, section 7).

use crate::cuda::*;
use crate::state::blocks::{alloc, free_block};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

/// One allocation held by graphs.
pub(crate) struct GraphAlloc {
    pub ptr: u64,
    pub size: u64,
    /// A free node (or a free during its capture) frees it inside the graph.
    pub freed_in_graph: AtomicBool,
    /// A launch allocated it and nothing has freed it since: the graph may not be
    /// launched again until it is freed (unless instantiated to free on launch).
    outstanding: AtomicBool,
}

impl Drop for GraphAlloc {
    fn drop(&mut self) {
        lock().by_ptr.remove(&self.ptr);
        COUNT.fetch_sub(1, Ordering::AcqRel);
        USED.fetch_sub(self.size, Ordering::AcqRel);
        let _ = free_block(self.ptr);
    }
}

#[derive(Default)]
struct State {
    /// Address -> size, of every live graph allocation.
    by_ptr: HashMap<u64, u64>,
    /// Allocations made during a capture not yet ended, by capture id.
    pending: HashMap<u64, Vec<Arc<GraphAlloc>>>,
    /// Captured graphs and executable graphs made from them (handle address) -> what they
    /// hold. Graphs built by hand hold theirs in their nodes.
    held: HashMap<usize, Vec<Arc<GraphAlloc>>>,
    /// Executable graph (handle address) -> the allocations its launches leave to be
    /// freed outside it, and whether it was instantiated to free them on launch.
    launched: HashMap<usize, (Vec<Arc<GraphAlloc>>, bool)>,
    /// Allocations a launch left to the program whose graphs are all gone: the program
    /// still owns them until it frees them (PyTorch frees a replay's output after the
    /// graph, at exit).
    orphans: HashMap<u64, Arc<GraphAlloc>>,
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(Default::default);
/// Live graph allocations: while there are none, frees need not look here.
static COUNT: AtomicUsize = AtomicUsize::new(0);
static USED: AtomicU64 = AtomicU64::new(0);
static HIGH: AtomicU64 = AtomicU64::new(0);

fn lock() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A new graph allocation of `size` bytes on device `dev`.
pub(crate) fn allocate(dev: usize, size: usize) -> Result<Arc<GraphAlloc>, CUresult> {
    let ptr = alloc(dev, size)?;
    lock().by_ptr.insert(ptr, size as u64);
    COUNT.fetch_add(1, Ordering::AcqRel);
    let now = USED.fetch_add(size as u64, Ordering::AcqRel) + size as u64;
    HIGH.fetch_max(now, Ordering::AcqRel);
    Ok(Arc::new(GraphAlloc {
        ptr,
        size: size as u64,
        freed_in_graph: AtomicBool::new(false),
        outstanding: AtomicBool::new(false),
    }))
}

/// Whether `ptr` is the start of a live graph allocation.
pub(crate) fn is_graph_alloc(ptr: u64) -> bool {
    COUNT.load(Ordering::Acquire) > 0 && lock().by_ptr.contains_key(&ptr)
}

/// Every live allocation at `ptr`'s start, from any graph's books.
fn find(st: &State, ptr: u64) -> Option<Arc<GraphAlloc>> {
    st.held
        .values()
        .chain(st.pending.values())
        .chain(st.launched.values().map(|(v, _)| v))
        .flatten()
        .chain(st.orphans.values())
        .find(|a| a.ptr == ptr)
        .cloned()
}

/// Allocations a destroyed graph held: those a launch left to the program are kept for
/// it; the rest go when their last holder does (the caller drops them outside the lock).
fn keep_outstanding(st: &mut State, taken: &[Arc<GraphAlloc>]) {
    for a in taken {
        if a.outstanding.load(Ordering::Acquire) && !a.freed_in_graph.load(Ordering::Acquire) {
            st.orphans.insert(a.ptr, a.clone());
        }
    }
}

/// Graph memory `ptr` freed: by a free node or during its capture (`in_graph`), or by the
/// program outside any graph. Whether it is graph memory.
pub(crate) fn freed(ptr: u64, in_graph: bool) -> bool {
    if !is_graph_alloc(ptr) {
        return false;
    }
    let mut st = lock();
    let orphan = if let Some(a) = find(&st, ptr) {
        if in_graph {
            a.freed_in_graph.store(true, Ordering::Release);
            None
        } else {
            a.outstanding.store(false, Ordering::Release);
            st.orphans.remove(&ptr)
        }
    } else {
        None
    };
    drop(st);
    // Freed here, outside the lock (its Drop takes it).
    drop(orphan);
    true
}

/// Executable graph `e` was made from a graph with allocations `allocs`.
pub(crate) fn note_exec(e: usize, allocs: Vec<Arc<GraphAlloc>>, flags: u64) {
    const AUTO_FREE_ON_LAUNCH: u64 = 1;
    if !allocs.is_empty() {
        lock()
            .launched
            .insert(e, (allocs, flags & AUTO_FREE_ON_LAUNCH != 0));
    }
}

/// A launch of executable graph `e`: refused while an allocation an earlier launch left
/// to be freed outside the graph is not yet freed, as the driver refuses it.
pub(crate) fn launching(e: usize) -> Result<(), CUresult> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let st = lock();
    let Some((allocs, auto_free)) = st.launched.get(&e) else {
        return Ok(());
    };
    let left: Vec<&Arc<GraphAlloc>> = allocs
        .iter()
        .filter(|a| !a.freed_in_graph.load(Ordering::Acquire))
        .collect();
    if !auto_free && left.iter().any(|a| a.outstanding.load(Ordering::Acquire)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    left.iter()
        .for_each(|a| a.outstanding.store(true, Ordering::Release));
    Ok(())
}

/// cuMemAllocAsync on a stream capturing with id `capture`: held by the capture's graph.
pub(crate) fn allocate_captured(dev: usize, size: usize, capture: u64) -> Result<u64, CUresult> {
    let a = allocate(dev, size)?;
    let ptr = a.ptr;
    lock().pending.entry(capture).or_default().push(a);
    Ok(ptr)
}

/// Capture `capture` ended: in graph `graph` (handle address), or in nothing.
pub(crate) fn capture_ended(capture: u64, graph: Option<usize>) {
    let taken = {
        let mut st = lock();
        let taken = st.pending.remove(&capture);
        match (taken, graph) {
            (Some(v), Some(g)) => {
                st.held.insert(g, v);
                None
            }
            (taken, _) => taken,
        }
    };
    // Dropped here, outside the lock: a failed capture's allocations are freed.
    drop(taken);
}

/// Executable graph (or clone) `to` made from captured graph `from`: it holds what that
/// graph holds, besides what it held before.
pub(crate) fn share(from: usize, to: usize) {
    let mut st = lock();
    if let Some(v) = st.held.get(&from).cloned() {
        st.held.entry(to).or_default().extend(v);
    }
}

/// Executable graph `e` made anew from captured graph `g` (an update): it holds what `g`
/// holds instead of what it held (freed after the work already queued, as every free).
pub(crate) fn exec_remade(g: usize, e: usize, flags: u64) {
    let old = {
        let mut st = lock();
        let now = st.held.get(&g).cloned().unwrap_or_default();
        let old = (st.held.insert(e, now), st.launched.remove(&e));
        if let Some((v, _)) = &old.1 {
            keep_outstanding(&mut st, v);
        }
        old
    };
    drop(old);
    note_exec(e, held_by(g), flags);
}

/// Graph or executable graph `h` (handle address) destroyed.
pub(crate) fn release(h: usize) {
    let taken = {
        let mut st = lock();
        let taken = (st.held.remove(&h), st.launched.remove(&h));
        if let Some((v, _)) = &taken.1 {
            keep_outstanding(&mut st, v);
        }
        taken
    };
    drop(taken);
}

/// What captured graph `g` (handle address) holds.
pub(crate) fn held_by(g: usize) -> Vec<Arc<GraphAlloc>> {
    lock().held.get(&g).cloned().unwrap_or_default()
}

/// CUgraphMem_attribute: used and reserved, current and high.
const USED_MEM_CURRENT: u32 = 0;
const USED_MEM_HIGH: u32 = 1;
const RESERVED_MEM_CURRENT: u32 = 2;
const RESERVED_MEM_HIGH: u32 = 3;

/// # Safety
/// `value` is null or a writable u64.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    dev: CUdevice,
    attr: u32,
    value: *mut std::ffi::c_void,
) -> CUresult {
    crate::state::entry::entry(|| {
        crate::state::device::device(dev)?;
        // Memory is not reused between graphs, so what is reserved is what is used.
        let v = match attr {
            USED_MEM_CURRENT | RESERVED_MEM_CURRENT => USED.load(Ordering::Acquire),
            USED_MEM_HIGH | RESERVED_MEM_HIGH => HIGH.load(Ordering::Acquire),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: the caller's pointer.
        unsafe { crate::state::entry::out(value as *mut u64, v) }
    })
}

/// Only the high watermarks can be set, and only to 0 (which resets them to the current).
///
/// # Safety
/// `value` is null or a readable u64.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetGraphMemAttribute(
    dev: CUdevice,
    attr: u32,
    value: *mut std::ffi::c_void,
) -> CUresult {
    crate::state::entry::entry(|| {
        crate::state::device::device(dev)?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null; the caller's u64.
        let v = unsafe { (value as *const u64).read_unaligned() };
        match attr {
            USED_MEM_HIGH | RESERVED_MEM_HIGH if v == 0 => {
                HIGH.store(USED.load(Ordering::Acquire), Ordering::Release);
                Ok(())
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    })
}

/// Graph memory not held by a graph is freed when its last graph goes, so there is
/// nothing cached to give back.
#[no_mangle]
pub extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    crate::state::entry::entry(|| crate::state::device::device(dev).map(|_| ()))
}
