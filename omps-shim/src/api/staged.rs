//! Copies with a pageable host side inside a stream capture (a captured `cuMemcpyAsync`,
//! or a memcpy node of a graph built by hand, which instantiation captures). The driver
//! stages such a copy on every replay, reading or writing the program's memory when the
//! node runs; omps' own staging chunks belong to the moment of the call, so the graph gets
//! what does the same from parts it replays: host to device is a host node copying the
//! program's bytes into a pinned staging buffer owned by the graph, then a DMA from that
//! buffer; device to host the DMA into the buffer, then a host node copying out; host to
//! host one host node doing the copy. The host nodes run on the shim's host-function
//! thread (crate::hostfn) through two words in pinned memory (op `HostNodeAt`), so a
//! process may hold as many as it has graphs. The buffers and words come from a pinned
//! arena of this process (they count against its pinned-memory limit) and live as long as
//! the graph and the executable graphs made from it: they are held as user objects are.

use crate::cuda::*;
use crate::hostfn::NodeWords;
use crate::state::copies::{copy_dtoh_queued, copy_htod_queued, deliver_printf};
use crate::state::host_ranges::is_shared;
use crate::state::ranges::range_dev;
use crate::state::streams::CUstream;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Mutex;

/// The capture id of stream `s` when it is capturing (and not invalidated) now.
pub(crate) fn capturing(s: CUstream) -> Result<Option<u64>, CUresult> {
    if !crate::state::capture::any_capture() {
        return Ok(None);
    }
    let (status, id) = crate::state::capture::capture_info(s)?;
    Ok((status == omps_ring::wire::graph::STATUS_ACTIVE).then_some(id))
}

/// Which way a staged copy goes.
#[derive(Clone, Copy)]
enum Dir {
    /// Program memory -> staging, before the DMA to the device.
    In,
    /// Staging -> program memory, after the DMA from the device.
    Out,
    /// Program memory -> program memory.
    HostToHost,
}

/// What a staged copy's host node does on every replay.
struct Job {
    dir: Dir,
    /// The program's address (for HostToHost: the destination).
    host: usize,
    /// The staging buffer (for HostToHost: the program's source).
    other: usize,
    len: usize,
}

/// One staged copy's resources, freed when the last graph holding it is gone.
struct Stage {
    words: usize,
    /// Arena extents: (address, bytes).
    extents: Vec<(usize, usize)>,
    job: Job,
}

unsafe extern "C" fn run_job(data: *mut c_void) {
    // SAFETY: a Job of a live Stage (the graph being replayed holds it).
    let j = unsafe { &*(data as *const Job) };
    let (src, dst) = match j.dir {
        Dir::In => (j.host, j.other),
        Dir::Out => (j.other, j.host),
        Dir::HostToHost => (j.other, j.host),
    };
    // SAFETY: the program promised these host bytes for as long as the graph replays (as
    // the driver requires of a memcpy node's memory); the staging buffer is ours.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, j.len) };
}

unsafe extern "C" fn destroy(p: *mut c_void) {
    // SAFETY: made by Box::into_raw in `stage`, destroyed once (the last reference).
    let st = unsafe { Box::from_raw(p as *mut Stage) };
    // SAFETY: the words are the stage's, still allocated.
    crate::hostfn::drop_node_at(unsafe { &*(st.words as *const NodeWords) });
    for &(a, n) in &st.extents {
        arena_free(a, n);
    }
}

/// A copy of `len` bytes between device memory and pageable memory (`host`), or two host
/// ranges, on stream `s`, which is capturing (capture `id`): the graph's parts queued.
/// `dptr` is the device side (unused for host to host, where `other` is the source).
pub(crate) fn capture_copy(
    to_device: Option<bool>,
    dptr: u64,
    host: usize,
    other: usize,
    len: usize,
    s: CUstream,
    id: u64,
) -> Result<(), CUresult> {
    let g =
        crate::state::capture::capture_graph(id).ok_or(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)?;
    let (stream, dev) = crate::state::streams::stream_dev(s)?;
    let mut extents = Vec::new();
    let made = (|| {
        let words = arena_alloc(std::mem::size_of::<NodeWords>())?;
        extents.push(words);
        let (dir, other) = match to_device {
            None => (Dir::HostToHost, other),
            Some(d) => {
                let buf = arena_alloc(len)?;
                extents.push(buf);
                (if d { Dir::In } else { Dir::Out }, buf.0)
            }
        };
        Ok::<_, CUresult>((words.0, dir, other))
    })();
    let (words, dir, other) = match made {
        Ok(m) => m,
        Err(e) => {
            extents.iter().for_each(|&(a, n)| arena_free(a, n));
            return Err(e);
        }
    };
    let stage = Box::into_raw(Box::new(Stage {
        words,
        extents,
        job: Job {
            dir,
            host,
            other,
            len,
        },
    }));
    // The graph holds the stage from now on, whatever comes of the rest.
    super::user_object::hold_internal(g, stage as usize, destroy);
    // SAFETY: the stage lives until the graph holding it goes.
    let (w, job) = unsafe {
        (
            &*((*stage).words as *const NodeWords),
            &(*stage).job as *const Job as usize,
        )
    };
    let node = || crate::hostfn::enqueue_node_at(dev, stream, w, run_job, job);
    match to_device {
        None => node(),
        Some(true) => {
            node()?;
            copy_htod(dptr, other as *const u8, len, s, false)
        }
        Some(false) => {
            copy_dtoh(other as *mut u8, dptr, len, s, false)?;
            node()
        }
    }
}

// ---- The pinned arena -------------------------------------------------------------------

/// Blocks are pinned allocations of this size; larger requests get a block of their own.
const BLOCK: usize = 1 << 20;
const ALIGN: usize = 64;

struct Block {
    base: usize,
    len: usize,
    /// Free extents: offset -> length.
    free: BTreeMap<usize, usize>,
}

static ARENA: Mutex<Vec<Block>> = Mutex::new(Vec::new());

/// `n` bytes of pinned memory the server reaches at the same address: (address, size).
fn arena_alloc(n: usize) -> Result<(usize, usize), CUresult> {
    let n = n.max(1).next_multiple_of(ALIGN);
    let mut a = ARENA.lock().unwrap_or_else(|e| e.into_inner());
    for b in a.iter_mut() {
        let fit = b.free.iter().find(|&(_, &l)| l >= n).map(|(&o, &l)| (o, l));
        if let Some((o, l)) = fit {
            b.free.remove(&o);
            if l > n {
                b.free.insert(o + n, l - n);
            }
            return Ok((b.base + o, n));
        }
    }
    let len = if n > BLOCK / 2 {
        n.next_multiple_of(4096)
    } else {
        BLOCK
    };
    let base = crate::state::host_ranges::host_alloc(len, 0)? as usize;
    if !crate::state::host_ranges::is_shared(base as u64, len) {
        // The server could not map it: useless for staging.
        let _ = crate::state::host_ranges::free_host(base, false);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let mut free = BTreeMap::new();
    if len > n {
        free.insert(n, len - n);
    }
    a.push(Block { base, len, free });
    Ok((base, n))
}

fn arena_free(addr: usize, n: usize) {
    let mut a = ARENA.lock().unwrap_or_else(|e| e.into_inner());
    let Some(i) = a
        .iter()
        .position(|b| (b.base..b.base + b.len).contains(&addr))
    else {
        return;
    };
    let b = &mut a[i];
    let (mut o, mut l) = (addr - b.base, n);
    // Joins the free neighbours on either side.
    if let Some((&po, &pl)) = b.free.range(..o).next_back() {
        if po + pl == o {
            b.free.remove(&po);
            (o, l) = (po, pl + l);
        }
    }
    if let Some(nl) = b.free.remove(&(o + l)) {
        l += nl;
    }
    b.free.insert(o, l);
    // A block wholly free goes back, unless it is the last one (kept for the next graph).
    if l == b.len && a.len() > 1 {
        let b = a.remove(i);
        drop(a);
        let _ = crate::state::host_ranges::free_host(b.base, false);
    }
}

/// Pinned bytes the arena holds now (tests).
pub fn arena_bytes() -> usize {
    ARENA
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|b| b.len)
        .sum()
}

// ---- Graphs built by hand ----------------------------------------------------------------

thread_local! {
    /// What the graphs captured for the instantiation going on in this thread held: the
    /// executable graph takes it (api/graph.rs).
    static ADOPTED: std::cell::RefCell<Vec<(usize, u64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The vehicle graph `g` of an instantiation's capture is let go: what it holds waits for
/// the executable graph.
pub(crate) fn adopt_from(g: usize) {
    let list = super::user_object::take(g);
    ADOPTED.with(|a| a.borrow_mut().extend(list));
}

/// What this thread's instantiation captured, for its executable graph.
pub(crate) fn take_adopted() -> Vec<(usize, u64)> {
    ADOPTED.with(|a| std::mem::take(&mut *a.borrow_mut()))
}

/// Host to device; a synchronous copy also delivers device printf output, as the driver's does.
pub(crate) fn copy_htod(
    dst: u64,
    src: *const u8,
    len: usize,
    stream: CUstream,
    sync: bool,
) -> Result<(), CUresult> {
    if !sync && len > 0 && !is_shared(src as u64, len) {
        if let Some(id) = capturing(stream)? {
            // A pageable source in a capture: read on every replay (api/staged.rs).
            range_dev(dst, len as u64)?;
            return capture_copy(Some(true), dst, src as usize, 0, len, stream, id);
        }
    }
    let r = copy_htod_queued(dst, src, len, stream, sync);
    if sync {
        deliver_printf(dst, len, r.is_err());
    }
    r
}

/// Device to host; a synchronous copy also delivers device printf output.
pub(crate) fn copy_dtoh(
    dst: *mut u8,
    src: u64,
    len: usize,
    stream: CUstream,
    sync: bool,
) -> Result<(), CUresult> {
    if !sync && len > 0 && !is_shared(dst as u64, len) {
        if let Some(id) = capturing(stream)? {
            // A pageable destination in a capture: written on every replay.
            range_dev(src, len as u64)?;
            return capture_copy(Some(false), src, dst as usize, 0, len, stream, id);
        }
    }
    let r = copy_dtoh_queued(dst, src, len, stream, sync);
    if sync {
        deliver_printf(src, len, r.is_err());
    }
    r
}
