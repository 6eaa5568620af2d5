//! The objects behind the opaque handles the shim gives out.
//!
//! A handle is a pointer to a leaked box whose first field is a per-kind magic, so a
//! handle of the wrong kind, or one already destroyed, is refused instead of used: boxes
//! are never freed (the magic is cleared on destroy), which costs a few bytes per object
//! and keeps a stale handle readable.

use crate::cuda::*;
use std::ffi::CString;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

pub const CTX_MAGIC: u32 = 0x6374_7821;
pub const STREAM_MAGIC: u32 = 0x7374_7221;
pub const EVENT_MAGIC: u32 = 0x6576_7421;
pub const MODULE_MAGIC: u32 = 0x6d6f_6421;
pub const FUNC_MAGIC: u32 = 0x6675_6e21;
pub const POOL_MAGIC: u32 = 0x706f_6f21;
pub const GRAPH_MAGIC: u32 = 0x6772_6121;
pub const EXEC_MAGIC: u32 = 0x6578_6521;
pub const NODE_MAGIC: u32 = 0x6e6f_6421;

/// Node `index` of graph `graph` (the server's ids), as cuGraphGetNodes hands them out.
#[repr(C)]
pub struct GraphNode {
    pub magic: AtomicU32,
    pub graph: u32,
    pub index: u32,
    pub dev: usize,
}

/// A graph or an executable graph: the server's id for it, on one device. A graph built
/// by hand lives in the shim (api/graph_build.rs) and has no server id; an executable
/// graph's id changes when an update instantiates it again.
#[repr(C)]
pub struct GraphHandle {
    pub magic: AtomicU32,
    pub id: AtomicU32,
    pub dev: usize,
    /// An executable graph's last launch stream (`NEVER` before the first), and an event
    /// (0: none) its next launch waits for, left by an update that made it anew.
    pub last_stream: AtomicUsize,
    pub wait_first: AtomicUsize,
}

/// [`GraphHandle::last_stream`] of an executable graph never launched.
pub const NEVER: usize = usize::MAX;

impl GraphHandle {
    pub fn new(magic: u32, id: u32, dev: usize) -> GraphHandle {
        GraphHandle {
            magic: AtomicU32::new(magic),
            id: AtomicU32::new(id),
            dev,
            last_stream: AtomicUsize::new(NEVER),
            wait_first: AtomicUsize::new(0),
        }
    }

    pub fn id(&self) -> u32 {
        self.id.load(Ordering::Acquire)
    }
}

#[repr(C)]
pub struct Ctx {
    pub magic: AtomicU32,
    pub dev: usize,
    pub primary: bool,
}

#[repr(C)]
pub struct Stream {
    pub magic: AtomicU32,
    pub id: u32,
    pub dev: usize,
    pub flags: u32,
    pub priority: i32,
}

#[repr(C)]
pub struct Event {
    pub magic: AtomicU32,
    pub id: u32,
    /// The GPU whose session holds the event: for one opened from an IPC handle, the GPU
    /// that made it, which need not be the opener's current one.
    pub dev: usize,
    pub flags: u32,
    /// Opened from an IPC handle (cuIpcOpenEventHandle): natively such an event belongs to
    /// the opener's context, so any GPU's streams of this process may record it.
    pub opened: bool,
}

#[repr(C)]
pub struct Function {
    pub magic: AtomicU32,
    pub id: u32,
    pub dev: usize,
    pub name: CString,
    pub params: Vec<(u32, u32)>,
    pub args_size: usize,
    pub max_threads_per_block: i32,
    pub static_shared: i32,
    pub max_dynamic_shared: std::sync::atomic::AtomicI32,
    pub module: *const Module,
    /// Attribute values the server answered, and the last value set of each attribute.
    pub attrs: FuncAttrs,
}

/// Slots for CU_FUNC_ATTRIBUTE_* values (16 are defined in CUDA 13).
const FUNC_ATTR_SLOTS: usize = 32;
const UNKNOWN: i64 = i64::MIN;

/// What the shim remembers of a function's attributes, so that the questions and settings
/// libraries repeat before every launch (cuBLASLt and attention kernels set the dynamic
/// shared memory size each time) cost no round trip after the first.
pub struct FuncAttrs {
    known: [std::sync::atomic::AtomicI64; FUNC_ATTR_SLOTS],
    set: [std::sync::atomic::AtomicI64; FUNC_ATTR_SLOTS],
    /// Bumped by every change: an answer asked before a change is not kept after it.
    changes: std::sync::atomic::AtomicU64,
    /// Held across a set and its bookkeeping, so that the value remembered as set is the
    /// one the driver has when two threads set the same attribute.
    setting: std::sync::Mutex<()>,
}

impl Default for FuncAttrs {
    fn default() -> Self {
        FuncAttrs {
            known: std::array::from_fn(|_| UNKNOWN.into()),
            set: std::array::from_fn(|_| UNKNOWN.into()),
            changes: Default::default(),
            setting: Default::default(),
        }
    }
}

impl FuncAttrs {
    fn slot(attr: i32) -> Option<usize> {
        usize::try_from(attr).ok().filter(|&a| a < FUNC_ATTR_SLOTS)
    }

    pub fn known(&self, attr: i32) -> Option<i32> {
        let v = self.known[Self::slot(attr)?].load(Ordering::Relaxed);
        (v != UNKNOWN).then_some(v as i32)
    }

    /// The count of changes so far, read before asking the server.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    /// Keeps an answer asked after `changes` changes, unless one happened since.
    pub fn learn(&self, attr: i32, value: i32, changes: u64) {
        if let Some(a) = Self::slot(attr) {
            if self.changes.load(Ordering::SeqCst) == changes {
                self.known[a].store(value as i64, Ordering::Relaxed);
            }
        }
    }

    /// Serializes sets of this function's attributes (held across the round trip).
    pub fn setting(&self) -> std::sync::MutexGuard<'_, ()> {
        self.setting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Something changed that attribute `attr` may depend on: read it again.
    pub fn forget(&self, attr: i32) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        if let Some(a) = Self::slot(attr) {
            self.known[a].store(UNKNOWN, Ordering::Relaxed);
        }
    }

    /// Whether `value` is what the attribute was last successfully set to (setting it
    /// again changes nothing, so the driver would only say yes).
    pub fn already_set(&self, attr: i32, value: i32) -> bool {
        Self::slot(attr).is_some_and(|a| self.set[a].load(Ordering::Relaxed) == value as i64)
    }

    /// A set succeeded: a later read asks the driver again, a repeat of it is free.
    pub fn was_set(&self, attr: i32, value: i32) {
        self.forget(attr);
        if let Some(a) = Self::slot(attr) {
            self.set[a].store(value as i64, Ordering::Relaxed);
        }
    }
}

#[repr(C)]
pub struct Module {
    pub magic: AtomicU32,
    pub id: u32,
    pub dev: usize,
    pub functions: Vec<&'static Function>,
    /// Its code calls device printf: a launch leaves text to collect at the next sync.
    pub prints: bool,
    /// Set on the modules of a library (cuLibraryLoadData): the family it belongs to.
    pub library: std::sync::OnceLock<std::sync::Arc<Library>>,
}

/// A library, which the driver loads in every context that uses it, kept when the
/// process sees more than one device.
pub struct Library {
    /// The handle cuLibraryLoadData gave out (its module on the first device).
    pub root: usize,
    pub state: std::sync::Mutex<LibraryState>,
}

pub struct LibraryState {
    /// The image, to load on other devices; None once the library is unloaded.
    pub image: Option<Vec<u8>>,
    /// Per device: its module there (a leaked `Module`), 0 while not loaded.
    pub on: Vec<usize>,
}

/// Gives out a handle for `v`.
pub fn leak<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// Resolves a handle of kind `T` whose magic is `magic`.
///
/// # Safety
/// `h` is null or a handle this shim gave out (possibly destroyed since), as the CUDA API
/// requires of callers; a pointer from elsewhere is undefined behaviour, as with libcuda.
pub unsafe fn resolve<'a, T>(h: *const T, magic: u32) -> Result<&'a T, CUresult> {
    if h.is_null() {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    // SAFETY: per the contract, h points at a leaked box of T whose first field (repr(C))
    // is the magic word.
    let m = unsafe { &*(h as *const AtomicU32) };
    if m.load(Ordering::Acquire) != magic {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    // SAFETY: the magic matched, so this is a live T that is never freed.
    Ok(unsafe { &*h })
}

/// Marks a handle destroyed; later uses get CUDA_ERROR_INVALID_HANDLE.
pub fn retire(magic: &AtomicU32, expected: u32) -> Result<(), CUresult> {
    magic
        .compare_exchange(expected, 0, Ordering::AcqRel, Ordering::Relaxed)
        .map(drop)
        .map_err(|_| CUDA_ERROR_INVALID_HANDLE)
}

/// Client-chosen ids for streams and events; 0 is the default stream.
pub fn next_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
