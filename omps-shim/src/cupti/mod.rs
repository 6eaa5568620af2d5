//! The CUPTI that a profiler in a client process talks to (docs/design.md, 12b). Under
//! omps the program's kernels run in the server's context, so the real libcupti, which
//! learns of work from inside the driver that owns the context, sees none: its first
//! request of libcuda (export table `2c8e0ad8...`) fails and torch.profiler records no
//! kernel. Instead the shim, preloaded ahead of libcupti.so, defines the `cupti*`
//! functions that profilers call (Kineto's set: activity kinds, buffers, flush, records,
//! external correlation, timestamps, subscription) and fills the profiler's buffers with
//! records in CUPTI's layouts, built from this process's own calls and timed by events
//! the server records around its own work.
//!
//! Owns: the `cupti*` entry points and the activity state behind them.
//! May use: `crate::api` (its timing events go through the driver entry points, as a
//! program's would), `crate::state` (the report seam, `state::profile`, and handles) and
//! `crate::cuda`. Nothing below calls up into it: it installs its hooks in
//! `state::profile`.
//!
//! Left out: RUNTIME and OVERHEAD records (their kinds are accepted and the absence said
//! once: the runtime's calls never reach the shim), callbacks (a subscription is accepted
//! and no callback is made), and, answering CUPTI_ERROR_NOT_SUPPORTED and naming
//! themselves once, other kinds (unified memory among them) and the counter families
//! (profiler, range profiler, PM and PC sampling, events, metrics: the stubs at the end),
//! which would need the GPU's counters of the shared context.

pub mod abi;
pub mod activity;
pub mod clock;
mod debug;
pub mod graphs;
mod records;
pub mod timing;

use abi::result;
use debug::debug;
use std::ffi::{c_char, c_void};

/// Names an unsupported CUPTI entry point once and answers CUPTI_ERROR_NOT_SUPPORTED.
fn not_supported(name: &str) -> u32 {
    crate::unsupported::say_once(name, || {
        format!("omps: {name} is not supported under omps; returning CUPTI_ERROR_NOT_SUPPORTED")
    });
    result::NOT_SUPPORTED
}

/// Writes through an out-pointer the caller gave, refusing null.
///
/// # Safety
/// `p` is null or valid for a write of T.
unsafe fn put<T>(p: *mut T, v: T) -> u32 {
    if p.is_null() {
        return result::INVALID_PARAMETER;
    }
    // SAFETY: non-null and, per the caller, writable.
    unsafe { p.write(v) };
    result::SUCCESS
}

/// The version of the libcupti loaded beside the shim, asked of it directly; CUDA 13.0's
/// when none is.
fn real_version() -> Option<u32> {
    const SONAMES: [&std::ffi::CStr; 3] = [c"libcupti.so.13", c"libcupti.so.12", c"libcupti.so"];
    for name in SONAMES {
        // SAFETY: a NUL-terminated name; RTLD_NOLOAD loads nothing new.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if h.is_null() {
            continue;
        }
        // SAFETY: a handle dlopen gave and a NUL-terminated name.
        let f = unsafe { libc::dlsym(h, c"cuptiGetVersion".as_ptr()) };
        let own = cuptiGetVersion as *const c_void;
        if f.is_null() || std::ptr::eq(f, own) {
            continue;
        }
        let mut v = 0u32;
        // SAFETY: cuptiGetVersion's signature in libcupti.
        let get: unsafe extern "C" fn(*mut u32) -> u32 = unsafe { std::mem::transmute(f) };
        // SAFETY: a valid out-pointer.
        if unsafe { get(&mut v) } == result::SUCCESS {
            return Some(v);
        }
    }
    None
}

/// # Safety
/// `v` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiGetVersion(v: *mut u32) -> u32 {
    static VERSION: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let version = *VERSION.get_or_init(|| {
        let v = real_version().unwrap_or(abi::API_VERSION);
        // CUDA 13.1's CUPTI writes CUpti_ActivityKernel11; a profiler built against it
        // reads that layout, which the shim does not write.
        if v / 100 > abi::API_VERSION / 100 {
            eprintln!(
                "omps: libcupti reports version {v}; the shim writes CUDA 13.0's records (CUpti_ActivityKernel10), which a profiler built for a later CUPTI may read wrongly"
            );
        }
        v
    });
    // SAFETY: the caller's pointer.
    unsafe { put(v, version) }
}

/// # Safety
/// `s` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiGetResultString(r: u32, s: *mut *const c_char) -> u32 {
    let text: &'static std::ffi::CStr = match r {
        result::SUCCESS => c"CUPTI_SUCCESS",
        result::INVALID_PARAMETER => c"CUPTI_ERROR_INVALID_PARAMETER",
        result::MAX_LIMIT_REACHED => c"CUPTI_ERROR_MAX_LIMIT_REACHED",
        result::NOT_INITIALIZED => c"CUPTI_ERROR_NOT_INITIALIZED",
        result::INVALID_KIND => c"CUPTI_ERROR_INVALID_KIND",
        result::QUEUE_EMPTY => c"CUPTI_ERROR_QUEUE_EMPTY",
        result::NOT_SUPPORTED => c"CUPTI_ERROR_NOT_SUPPORTED (omps)",
        result::MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => {
            c"CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
        }
        _ => c"CUPTI_ERROR_UNKNOWN",
    };
    // SAFETY: the caller's pointer.
    unsafe { put(s, text.as_ptr()) }
}

fn enable(k: u32, on: bool) -> u32 {
    debug(|| format!("activity kind {k} {}", if on { "on" } else { "off" }));
    // Kineto turns these on with the rest: accepted, and said once, so that a profile
    // without runtime rows is explained.
    if on && (k == abi::kind::RUNTIME || k == abi::kind::OVERHEAD) {
        crate::unsupported::say_once("CUPTI RUNTIME and OVERHEAD records", || {
            "omps: CUPTI RUNTIME and OVERHEAD records are not produced under omps (the runtime's calls do not reach the shim); kernel, memcpy, memset, synchronization, driver and external-correlation records are".to_string()
        });
        return result::SUCCESS;
    }
    if !activity::supported(k) {
        return if on {
            not_supported(&format!("cuptiActivityEnable(kind {k})"))
        } else {
            result::SUCCESS
        };
    }
    activity::enable(k, on);
    result::SUCCESS
}

#[no_mangle]
pub extern "C" fn cuptiActivityEnable(k: u32) -> u32 {
    enable(k, true)
}

#[no_mangle]
pub extern "C" fn cuptiActivityDisable(k: u32) -> u32 {
    enable(k, false)
}

/// One context serves every client, so a context's kinds are the process's.
#[no_mangle]
pub extern "C" fn cuptiActivityEnableContext(_ctx: *mut c_void, k: u32) -> u32 {
    enable(k, true)
}

#[no_mangle]
pub extern "C" fn cuptiActivityDisableContext(_ctx: *mut c_void, k: u32) -> u32 {
    enable(k, false)
}

#[no_mangle]
pub extern "C" fn cuptiActivityRegisterCallbacks(
    request: Option<activity::RequestFn>,
    complete: Option<activity::CompleteFn>,
) -> u32 {
    if request.is_none() || complete.is_none() {
        return result::INVALID_PARAMETER;
    }
    debug(|| "the profiler registered its buffer callbacks".into());
    activity::register(request, complete);
    result::SUCCESS
}

/// Flag 1 is CUPTI_ACTIVITY_FLAG_FLUSH_FORCED.
#[no_mangle]
pub extern "C" fn cuptiActivityFlushAll(flag: u32) -> u32 {
    debug(|| format!("flush (flag {flag})"));
    activity::flush(flag & 1 != 0)
}

#[no_mangle]
pub extern "C" fn cuptiActivityFlush(_ctx: *mut c_void, _stream: u32, flag: u32) -> u32 {
    debug(|| format!("flush (flag {flag})"));
    activity::flush(flag & 1 != 0)
}

/// # Safety
/// `buf` holds `valid` bytes the shim wrote; `rec` is null or writable, and holds null or
/// a record of this buffer.
#[no_mangle]
pub unsafe extern "C" fn cuptiActivityGetNextRecord(
    buf: *mut u8,
    valid: usize,
    rec: *mut *mut c_void,
) -> u32 {
    if buf.is_null() || rec.is_null() {
        return result::INVALID_PARAMETER;
    }
    // SAFETY: the caller's buffer of `valid` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(buf, valid) };
    // SAFETY: the caller's pointer.
    let prev = unsafe { *rec } as usize;
    let prev = (prev != 0).then(|| prev.wrapping_sub(buf as usize));
    if prev.is_some_and(|p| p >= valid) {
        return result::INVALID_PARAMETER;
    }
    match abi::next_record(bytes, prev) {
        Some(at) => {
            // SAFETY: the caller's pointer; `at` lies inside the buffer.
            unsafe { *rec = buf.add(at) as *mut c_void };
            result::SUCCESS
        }
        None => result::MAX_LIMIT_REACHED,
    }
}

/// # Safety
/// `dropped` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiActivityGetNumDroppedRecords(
    _ctx: *mut c_void,
    _stream: u32,
    dropped: *mut usize,
) -> u32 {
    // SAFETY: the caller's pointer.
    unsafe { put(dropped, activity::dropped()) }
}

#[no_mangle]
pub extern "C" fn cuptiActivityPushExternalCorrelationId(k: u32, id: u64) -> u32 {
    if k as usize >= activity::EXTERNAL_KINDS || k == 0 {
        return result::INVALID_PARAMETER;
    }
    activity::push_external(k as usize, id);
    result::SUCCESS
}

/// # Safety
/// `last` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiActivityPopExternalCorrelationId(k: u32, last: *mut u64) -> u32 {
    if k as usize >= activity::EXTERNAL_KINDS || k == 0 {
        return result::INVALID_PARAMETER;
    }
    match activity::pop_external(k as usize) {
        Some(id) if !last.is_null() => {
            // SAFETY: non-null: the caller's pointer.
            unsafe { *last = id };
            result::SUCCESS
        }
        Some(_) => result::SUCCESS,
        None => result::QUEUE_EMPTY,
    }
}

#[no_mangle]
pub extern "C" fn cuptiActivityRegisterTimestampCallback(
    f: Option<unsafe extern "C" fn() -> u64>,
) -> u32 {
    debug(|| {
        format!(
            "timestamp callback {}",
            if f.is_some() { "registered" } else { "removed" }
        )
    });
    clock::set_callback(f);
    activity::clock_changed();
    result::SUCCESS
}

/// # Safety
/// `t` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiGetTimestamp(t: *mut u64) -> u32 {
    // SAFETY: the caller's pointer.
    unsafe { put(t, clock::now()) }
}

/// Runtime calls never reach the shim (the runtime is linked into the program and calls
/// the driver), so there are no RUNTIME records to turn off: accepted.
#[no_mangle]
pub extern "C" fn cuptiActivityEnableRuntimeApi(_cbid: u32, _on: u8) -> u32 {
    result::SUCCESS
}

#[no_mangle]
pub extern "C" fn cuptiActivityEnableDriverApi(cbid: u32, on: u8) -> u32 {
    activity::enable_driver_api(cbid, on != 0);
    result::SUCCESS
}

/// Buffer sizes, pool limits and per-thread buffers shape how CUPTI's own buffers work;
/// the shim delivers into the profiler's buffers at a flush and needs none of them.
/// Accepted for the attributes CUDA 13.0 defines, refused past them.
///
/// # Safety
/// `size` is null or readable.
#[no_mangle]
pub unsafe extern "C" fn cuptiActivitySetAttribute(
    attr: u32,
    size: *mut usize,
    value: *mut c_void,
) -> u32 {
    const ATTRIBUTES: u32 = 16;
    if size.is_null() || value.is_null() {
        return result::INVALID_PARAMETER;
    }
    if attr >= ATTRIBUTES {
        return result::INVALID_PARAMETER;
    }
    result::SUCCESS
}

#[no_mangle]
pub extern "C" fn cuptiActivityEnableLatencyTimestamps(_on: u8) -> u32 {
    result::SUCCESS
}

#[no_mangle]
pub extern "C" fn cuptiActivityEnableCudaEventDeviceTimestamps(_on: u8) -> u32 {
    result::SUCCESS
}

#[no_mangle]
pub extern "C" fn cuptiActivityEnableLaunchAttributes(_on: u8) -> u32 {
    result::SUCCESS
}

#[no_mangle]
pub extern "C" fn cuptiActivityEnableHWTrace(on: u8) -> u32 {
    if on == 0 {
        result::SUCCESS
    } else {
        not_supported("cuptiActivityEnableHWTrace")
    }
}

#[no_mangle]
pub extern "C" fn cuptiFinalize() -> u32 {
    activity::finalize();
    result::SUCCESS
}

/// The one subscriber CUPTI allows, as an address (0: none).
static SUBSCRIBER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A subscription is accepted, as CUPTI's first is, so that a profiler that subscribes
/// before it enables activity goes on; no callback is ever made (the driver's calls are
/// the server's). A second subscriber is refused, as CUPTI refuses it.
///
/// # Safety
/// `h` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiSubscribe(
    h: *mut *mut c_void,
    _cb: *mut c_void,
    _user: *mut c_void,
) -> u32 {
    use std::sync::atomic::Ordering;
    if h.is_null() {
        return result::INVALID_PARAMETER;
    }
    let token = &SUBSCRIBER as *const _ as usize;
    if SUBSCRIBER
        .compare_exchange(0, token, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return result::MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    }
    // SAFETY: non-null: the caller's pointer.
    unsafe { *h = token as *mut c_void };
    result::SUCCESS
}

#[no_mangle]
pub extern "C" fn cuptiUnsubscribe(h: *mut c_void) -> u32 {
    use std::sync::atomic::Ordering;
    match SUBSCRIBER.compare_exchange(h as usize, 0, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) if !h.is_null() => result::SUCCESS,
        _ => result::INVALID_PARAMETER,
    }
}

fn subscribed(h: *mut c_void) -> bool {
    !h.is_null() && SUBSCRIBER.load(std::sync::atomic::Ordering::Acquire) == h as usize
}

/// Accepted for the subscriber (Kineto asks to hear of context teardown, which never
/// happens to the shared context while the process lives).
#[no_mangle]
pub extern "C" fn cuptiEnableCallback(_on: u32, h: *mut c_void, _domain: u32, _cbid: u32) -> u32 {
    if subscribed(h) {
        result::SUCCESS
    } else {
        result::INVALID_PARAMETER
    }
}

#[no_mangle]
pub extern "C" fn cuptiEnableDomain(on: u32, h: *mut c_void, domain: u32) -> u32 {
    cuptiEnableCallback(on, h, domain, 0)
}

#[no_mangle]
pub extern "C" fn cuptiEnableAllDomains(on: u32, h: *mut c_void) -> u32 {
    cuptiEnableCallback(on, h, 0, 0)
}

/// # Safety
/// `id` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiGetDeviceId(_ctx: *mut c_void, id: *mut u32) -> u32 {
    match crate::state::ctx::current_dev() {
        // SAFETY: the caller's pointer.
        Ok(d) => unsafe { put(id, d as u32) },
        Err(_) => result::NOT_INITIALIZED,
    }
}

/// # Safety
/// `id` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiGetContextId(_ctx: *mut c_void, id: *mut u32) -> u32 {
    match crate::state::ctx::current_dev() {
        // SAFETY: the caller's pointer.
        Ok(d) => unsafe { put(id, d as u32 + 1) },
        Err(_) => result::NOT_INITIALIZED,
    }
}

/// # Safety
/// `id` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiGetStreamIdEx(
    _ctx: *mut c_void,
    stream: *mut c_void,
    _per_thread: u8,
    id: *mut u32,
) -> u32 {
    let mut v = 0u64;
    // SAFETY: a valid out-pointer; the stream handle is the caller's.
    let r = unsafe { crate::api::exec::cuStreamGetId(stream as _, &mut v) };
    if r != 0 {
        return result::INVALID_PARAMETER;
    }
    // SAFETY: the caller's pointer.
    unsafe { put(id, v as u32) }
}

/// # Safety
/// As cuptiGetStreamIdEx.
#[no_mangle]
pub unsafe extern "C" fn cuptiGetStreamId(
    ctx: *mut c_void,
    stream: *mut c_void,
    id: *mut u32,
) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { cuptiGetStreamIdEx(ctx, stream, 0, id) }
}

/// # Safety
/// `name` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuptiGetCallbackName(
    _domain: u32,
    _cbid: u32,
    _name: *mut *const c_char,
) -> u32 {
    not_supported("cuptiGetCallbackName")
}

/// CUPTI's counter families: each answers CUPTI_ERROR_NOT_SUPPORTED and names itself
/// once (they would need the GPU's counters of the context every client shares). The
/// stubs take no arguments: under the C calling convention the caller owns its
/// arguments, so ignoring them is sound whatever the real signature is.
macro_rules! counters_not_supported {
    ($($name:ident)*) => {$(
        #[no_mangle]
        pub extern "C" fn $name() -> u32 {
            not_supported(stringify!($name))
        }
    )*};
}

counters_not_supported! {
    cuptiProfilerInitialize cuptiProfilerDeInitialize cuptiProfilerBeginSession
    cuptiProfilerEndSession cuptiProfilerSetConfig cuptiProfilerUnsetConfig
    cuptiProfilerBeginPass cuptiProfilerEndPass cuptiProfilerEnableProfiling
    cuptiProfilerDisableProfiling cuptiProfilerIsPassCollected cuptiProfilerFlushCounterData
    cuptiProfilerPushRange cuptiProfilerPopRange cuptiProfilerGetCounterAvailability
    cuptiProfilerCounterDataImageCalculateSize cuptiProfilerCounterDataImageInitialize
    cuptiProfilerCounterDataImageCalculateScratchBufferSize
    cuptiProfilerCounterDataImageInitializeScratchBuffer
    cuptiRangeProfilerEnable cuptiRangeProfilerDisable cuptiRangeProfilerStart
    cuptiRangeProfilerStop cuptiRangeProfilerSetConfig
    cuptiPmSamplingEnable cuptiPmSamplingDisable cuptiPmSamplingStart cuptiPmSamplingStop
    cuptiPmSamplingSetConfig cuptiPmSamplingGetCounterData cuptiPmSamplingDecodeData
    cuptiPCSamplingEnable cuptiPCSamplingDisable cuptiPCSamplingStart cuptiPCSamplingStop
    cuptiPCSamplingGetData cuptiPCSamplingSetConfigurationAttribute
    cuptiPCSamplingGetConfigurationAttribute cuptiPCSamplingGetNumStallReasons
    cuptiPCSamplingGetStallReasons
    cuptiEventGroupCreate cuptiEventGroupDestroy cuptiEventGroupEnable cuptiEventGroupDisable
    cuptiEventGroupReadEvent cuptiEventGroupReadAllEvents cuptiEventGetIdFromName
    cuptiMetricGetIdFromName cuptiMetricGetValue cuptiMetricCreateEventGroupSets
    cuptiSetEventCollectionMode
}
