//! CUPTI in the server: the GPU's own start and end of each traced client's kernel, copy
//! and memset (docs/design.md 12b, design S). The client's profiler cannot learn them
//! itself (its work runs in the server's context), and events recorded around the work
//! also count the time the GPU waited for the work to be queued, several microseconds a
//! launch. So while some client traces, the server loads libcupti, turns on its kernel,
//! memcpy, memset and external-correlation records, and pushes a key around every driver
//! call it makes for a traced client's work: CUPTI ties each record to that call, and
//! [`WorkTimes`] ties the call to the key.
//!
//! libcupti is found at `OMPS_CUPTI_LIB` (the library or its folder), else where the
//! dynamic loader finds `libcupti.so.13`, else in the CUDA toolkit's usual folders. With
//! none, or one that refuses, timing stays with events and the server says why once.
//! While on, CUPTI's records cost every client's launches a little (its kernel records
//! are made for all of the context's work); they are off again once no client traces.

use crate::gpu::work_times::{monotonic_ns, WorkTimes};
use omps_ring::cupti_layout::{kind, off};
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Activity kinds turned on. DRIVER's records are not read, but CUPTI makes
/// external-correlation records only for calls it records.
const KINDS: [u32; 5] = [
    kind::CONCURRENT_KERNEL,
    kind::MEMCPY,
    kind::MEMSET,
    kind::DRIVER,
    kind::EXTERNAL_CORRELATION,
];
/// CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0: the kind of the keys pushed.
const KEY_KIND: u32 = 3;
const FLUSH_FORCED: u32 = 1;
/// Bytes of each buffer given to CUPTI.
const BUFFER: usize = 4 << 20;
/// CUPTI delivers what it holds this often by itself (ms).
const FLUSH_PERIOD_MS: u32 = 5;

type RequestFn = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
type CompleteFn = unsafe extern "C" fn(*mut c_void, u32, *mut u8, usize, usize);

/// The libcupti entry points used, resolved once.
struct Cupti {
    enable: unsafe extern "C" fn(u32) -> u32,
    disable: unsafe extern "C" fn(u32) -> u32,
    flush_all: unsafe extern "C" fn(u32) -> u32,
    next_record: unsafe extern "C" fn(*mut u8, usize, *mut *mut c_void) -> u32,
    push: unsafe extern "C" fn(u32, u64) -> u32,
    pop: unsafe extern "C" fn(u32, *mut u64) -> u32,
}

static CUPTI: OnceLock<Option<Cupti>> = OnceLock::new();
static TIMES: Mutex<Option<WorkTimes>> = Mutex::new(None);
/// Traced sessions; the records are on while this is above 0.
static USERS: Mutex<usize> = Mutex::new(0);
/// When the last flush was asked for (monotonic ns).
static LAST_FLUSH: AtomicU64 = AtomicU64::new(0);
/// Records read of work, of keyed calls; keys asked for, found: said when tracing ends.
static COUNTS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

fn count(i: usize) {
    COUNTS[i].fetch_add(1, Ordering::Relaxed);
}

fn with_times<R>(f: impl FnOnce(&mut WorkTimes) -> R) -> R {
    let mut g = TIMES.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(WorkTimes::default))
}

/// The paths tried for libcupti, in order.
fn candidates() -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(p) = std::env::var("OMPS_CUPTI_LIB") {
        if std::path::Path::new(&p).is_dir() {
            out.push(format!("{p}/libcupti.so.13"));
            out.push(format!("{p}/libcupti.so"));
        } else {
            out.push(p);
        }
    }
    out.extend(
        [
            "libcupti.so.13",
            "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
            "/usr/local/cuda/lib64/libcupti.so.13",
        ]
        .map(String::from),
    );
    out
}

/// Resolves `name` in `lib`, as a function of type F.
///
/// # Safety
/// F is the C signature of `name`.
unsafe fn sym<F: Copy>(lib: *mut c_void, name: &CStr) -> Option<F> {
    // SAFETY: a handle dlopen gave and a NUL-terminated name.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: per the caller, F is the function pointer type of this symbol.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

fn load() -> Result<Cupti, String> {
    let mut lib = std::ptr::null_mut();
    let mut tried = Vec::new();
    for path in candidates() {
        let Ok(c) = std::ffi::CString::new(path.clone()) else {
            continue;
        };
        // SAFETY: a NUL-terminated path.
        lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !lib.is_null() {
            tracing::info!("CUPTI for profiled clients' timing: {path}");
            break;
        }
        tried.push(path);
    }
    if lib.is_null() {
        return Err(format!(
            "no libcupti (tried {}; set OMPS_CUPTI_LIB)",
            tried.join(", ")
        ));
    }
    let missing = |n: &str| format!("libcupti lacks {n}");
    // SAFETY: each type below is the C signature of its CUPTI function (cupti_activity.h).
    unsafe {
        let register: unsafe extern "C" fn(RequestFn, CompleteFn) -> u32 =
            sym(lib, c"cuptiActivityRegisterCallbacks").ok_or(missing("callbacks"))?;
        let clock: unsafe extern "C" fn(unsafe extern "C" fn() -> u64) -> u32 =
            sym(lib, c"cuptiActivityRegisterTimestampCallback")
                .ok_or(missing("cuptiActivityRegisterTimestampCallback"))?;
        let cupti = Cupti {
            enable: sym(lib, c"cuptiActivityEnable").ok_or(missing("cuptiActivityEnable"))?,
            disable: sym(lib, c"cuptiActivityDisable").ok_or(missing("cuptiActivityDisable"))?,
            flush_all: sym(lib, c"cuptiActivityFlushAll")
                .ok_or(missing("cuptiActivityFlushAll"))?,
            next_record: sym(lib, c"cuptiActivityGetNextRecord")
                .ok_or(missing("cuptiActivityGetNextRecord"))?,
            push: sym(lib, c"cuptiActivityPushExternalCorrelationId")
                .ok_or(missing("cuptiActivityPushExternalCorrelationId"))?,
            pop: sym(lib, c"cuptiActivityPopExternalCorrelationId")
                .ok_or(missing("cuptiActivityPopExternalCorrelationId"))?,
        };
        let r = clock(clock_ns);
        if r != 0 {
            return Err(format!(
                "cuptiActivityRegisterTimestampCallback: CUPTI error {r}"
            ));
        }
        let r = register(request, complete);
        if r != 0 {
            return Err(format!("cuptiActivityRegisterCallbacks: CUPTI error {r}"));
        }
        if let Some(period) =
            sym::<unsafe extern "C" fn(u32) -> u32>(lib, c"cuptiActivityFlushPeriod")
        {
            period(FLUSH_PERIOD_MS);
        }
        Ok(cupti)
    }
}

fn cupti() -> Option<&'static Cupti> {
    CUPTI
        .get_or_init(|| {
            load()
                .inspect_err(|e| {
                    tracing::warn!("profiled clients are timed by events: {e}");
                })
                .ok()
        })
        .as_ref()
}

/// CUPTI's clock for every record: CLOCK_MONOTONIC, the clients' shims' too.
unsafe extern "C" fn clock_ns() -> u64 {
    monotonic_ns()
}

unsafe extern "C" fn request(buf: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let b: Box<[u64]> = vec![0u64; BUFFER / 8].into_boxed_slice();
    // SAFETY: CUPTI's out-pointers; the buffer is reclaimed in `complete`.
    unsafe {
        *buf = Box::into_raw(b) as *mut u8;
        *size = BUFFER;
        *max = 0;
    }
}

unsafe extern "C" fn complete(_: *mut c_void, _: u32, buf: *mut u8, size: usize, valid: usize) {
    if buf.is_null() {
        return;
    }
    if let Some(c) = CUPTI.get().and_then(Option::as_ref) {
        with_times(|t| {
            let mut rec: *mut c_void = std::ptr::null_mut();
            // SAFETY: the buffer CUPTI filled, `valid` bytes of it.
            while unsafe { (c.next_record)(buf, valid, &mut rec) } == 0 {
                // SAFETY: a record CUPTI wrote inside the buffer.
                unsafe { read(t, rec as *const u8) };
            }
        });
    }
    // SAFETY: `request` made this buffer from a Box<[u64]> of size / 8 words.
    drop(unsafe {
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            buf as *mut u64,
            size / 8,
        ))
    });
}

/// Takes what one record says into `t`.
///
/// # Safety
/// `r` is a record CUPTI wrote, of the size its kind has.
unsafe fn read(t: &mut WorkTimes, r: *const u8) {
    // SAFETY: each read is inside the record of its kind (omps_ring::cupti_layout).
    unsafe {
        let u32_at = |o: usize| (r.add(o) as *const u32).read_unaligned();
        let u64_at = |o: usize| (r.add(o) as *const u64).read_unaligned();
        // Start, end and correlation sit where every version of these records keeps them
        // (the memset record's as the memcpy record's).
        match u32_at(0) {
            kind::CONCURRENT_KERNEL | kind::KERNEL => {
                count(0);
                let (k, e, c) = (
                    off::kernel::START,
                    off::kernel::END,
                    off::kernel::CORRELATION_ID,
                );
                t.work(u32_at(c), u64_at(k), u64_at(e))
            }
            kind::MEMCPY | kind::MEMSET => {
                count(0);
                let (k, e, c) = (
                    off::memcpy::START,
                    off::memcpy::END,
                    off::memcpy::CORRELATION_ID,
                );
                t.work(u32_at(c), u64_at(k), u64_at(e))
            }
            kind::EXTERNAL_CORRELATION if u32_at(off::external::EXTERNAL_KIND) == KEY_KIND => {
                count(1);
                let c = u32_at(off::external::CORRELATION_ID);
                t.key(c, u64_at(off::external::EXTERNAL_ID))
            }
            _ => {}
        }
    }
}

/// A session starts tracing: true when CUPTI times its work.
pub fn start() -> bool {
    let Some(c) = cupti() else { return false };
    let mut users = USERS.lock().unwrap_or_else(|p| p.into_inner());
    if *users == 0 {
        for k in KINDS {
            // SAFETY: an activity kind of CUDA 13.0.
            let r = unsafe { (c.enable)(k) };
            if r != 0 {
                tracing::warn!("cuptiActivityEnable({k}): CUPTI error {r}; profiled clients are timed by events");
                for k in KINDS {
                    // SAFETY: as above.
                    unsafe { (c.disable)(k) };
                }
                return false;
            }
        }
    }
    *users += 1;
    true
}

/// A session stops tracing (or ends while tracing): the records go off with the last.
pub fn stop() {
    let Some(c) = cupti() else { return };
    let mut users = USERS.lock().unwrap_or_else(|p| p.into_inner());
    if *users == 0 {
        return;
    }
    *users -= 1;
    if *users == 0 {
        // SAFETY: flag and kinds of CUDA 13.0.
        unsafe {
            (c.flush_all)(FLUSH_FORCED);
            for k in KINDS {
                (c.disable)(k);
            }
        }
        let n = COUNTS.each_ref().map(|c| c.swap(0, Ordering::Relaxed));
        tracing::info!(
            "CUPTI tracing ends: {} records of work, {} of keyed calls; {} spans asked, {} answered from records",
            n[0], n[1], n[2], n[3]
        );
    }
}

pub fn begin(key: u64) {
    if let Some(c) = CUPTI.get().and_then(Option::as_ref) {
        // SAFETY: a kind of CUDA 13.0; pushed on this thread, popped by `end`.
        unsafe { (c.push)(KEY_KIND, key) };
    }
}

pub fn end() {
    if let Some(c) = CUPTI.get().and_then(Option::as_ref) {
        let mut last = 0u64;
        // SAFETY: as `begin`; a valid out-pointer.
        unsafe { (c.pop)(KEY_KIND, &mut last) };
    }
}

pub fn take(key: u64) -> Option<(u64, u64)> {
    let t = with_times(|t| t.take(key));
    count(if t.is_some() { 3 } else { 2 });
    t
}

/// Asks CUPTI for what it holds, at most every millisecond (a flush walks every buffer).
pub fn settle() {
    let Some(c) = CUPTI.get().and_then(Option::as_ref) else {
        return;
    };
    let now = monotonic_ns();
    let last = LAST_FLUSH.load(Ordering::Relaxed);
    if now.saturating_sub(last) < 1_000_000
        || LAST_FLUSH
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    // SAFETY: flag 0 asks for completed records.
    unsafe { (c.flush_all)(0) };
}
