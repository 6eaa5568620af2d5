//! CUPTI's activity API as the shim keeps it: which kinds are on, the profiler's buffer
//! callbacks, correlation ids and the external ids a profiler pushes, and the records
//! from the moment their work is queued to their delivery into the profiler's buffers.
//!
//! A record of GPU work waits in `pending` until its events tell its times; every other
//! record (API calls, external correlations, waits) has its times at once and waits in
//! `ready`. A flush moves what has finished from the one to the other and delivers
//! `ready`, its times converted into the profiler's clock. Only this process's own work
//! is ever recorded: the records are built from the calls it makes, and its timing events
//! are its own.

use super::abi::{self, kind, off, Record};
use super::clock::{self, Pair};
use super::records::*;
use super::timing::{self, Span};
use crate::cuda::*;
use crate::state::profile::{self, monotonic_ns, Hooks, Wait, Work};
use crate::state::streams::{CUevent, CUstream};
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// `void (*)(uint8_t **buffer, size_t *size, size_t *maxNumRecords)`
pub type RequestFn = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
/// `void (*)(CUcontext, uint32_t streamId, uint8_t *buffer, size_t size, size_t validSize)`
pub type CompleteFn = unsafe extern "C" fn(*mut c_void, u32, *mut u8, usize, usize);

/// External correlation kinds CUDA 13.0 defines (`CUpti_ExternalCorrelationKind`, below
/// its SIZE).
pub const EXTERNAL_KINDS: usize = 6;

/// Work queued and not yet timed past which what has finished is timed, and past which
/// the oldest is waited for: a trace of any length then holds at most 2 x PENDING_MAX
/// events, well inside the least event quota a client is granted (4,096).
const PENDING_SOFT: usize = 256;
const PENDING_MAX: usize = 1024;
/// Reports between two passes over the untimed spans (a pass asks the server about the
/// oldest of each stream: a round trip each, not to be paid on every launch).
const PASS_EVERY: u32 = 64;
/// Records ready past which they are delivered at once (when the profiler gave buffer
/// callbacks), and past which new ones are dropped and counted.
const READY_DELIVER: usize = 16 << 10;
const READY_MAX: usize = 1 << 20;

struct Open {
    stream: CUstream,
    correlation: u32,
    cbid: u32,
    start_ns: u64,
    /// The records of the work and their spans: one for a kernel, copy or memset, one a
    /// timed node for a graph replay (None: its kind is off).
    records: Vec<(Option<Record>, Span)>,
    /// The spans' events are recorded by the server (a graph's twin), not by `after`.
    recorded_by_server: bool,
}

struct Pending {
    /// None: a graph node whose kind is off, timed only because the replay records
    /// every node's events (its span keeps them from reuse until they are done).
    record: Option<Record>,
    span: Span,
    stream: usize,
}

// SAFETY: a stream handle is the address of the shim's leaked stream record (or a
// constant), valid on every thread; Span is Send.
unsafe impl Send for Open {}

/// A buffer the profiler gave and the shim has not handed back yet. One is always held
/// while a kind is on, as CUPTI holds one from the first record: Kineto flushes only
/// when it has given out a buffer that is not back (it skips the flush otherwise, and
/// every record with it).
struct Held {
    buf: *mut u8,
    size: usize,
    max: usize,
}

// SAFETY: the profiler's buffer, written only by whoever holds it (it is taken out of
// the state before it is written) and then handed back.
unsafe impl Send for Held {}

#[derive(Default)]
struct State {
    enabled: HashSet<u32>,
    driver_off: HashSet<u32>,
    request: Option<RequestFn>,
    complete: Option<CompleteFn>,
    held: Option<Held>,
    first_pair: Option<Pair>,
    open: HashMap<u64, Open>,
    pending: Vec<Pending>,
    ready: Vec<Record>,
    dropped: usize,
    next_token: u64,
    since_pass: u32,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
static CORRELATION: AtomicU32 = AtomicU32::new(0);

thread_local! {
    static EXTERNAL: std::cell::RefCell<[Vec<u64>; EXTERNAL_KINDS]> =
        std::cell::RefCell::new(Default::default());
}

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(State::default))
}

static HOOKS: Hooks = Hooks {
    before,
    after,
    waited,
    graph,
};

/// The kinds whose work the shim times or whose calls it records.
fn traced(k: u32) -> bool {
    matches!(
        k,
        kind::MEMCPY
            | kind::MEMSET
            | kind::KERNEL
            | kind::CONCURRENT_KERNEL
            | kind::DRIVER
            | kind::SYNCHRONIZATION
    )
}

/// Every kind the shim can deliver (the rest answer CUPTI_ERROR_NOT_SUPPORTED).
pub fn supported(k: u32) -> bool {
    traced(k) || k == kind::EXTERNAL_CORRELATION
}

pub fn enable(k: u32, on: bool) {
    with(|s| {
        if on {
            s.enabled.insert(k);
            s.first_pair.get_or_insert_with(clock::pair);
        } else {
            s.enabled.remove(&k);
        }
        profile::set_hooks(&HOOKS, s.enabled.iter().any(|&k| traced(k)));
    });
    ensure_buffer();
}

/// Asks the profiler for the buffer the shim holds while a kind is on, if none is held;
/// outside the state's lock (the profiler's callback may call back into CUPTI).
fn ensure_buffer() {
    let request = with(|s| {
        let on = !s.enabled.is_empty() && s.complete.is_some();
        s.request.filter(|_| on && s.held.is_none())
    });
    let Some(request) = request else { return };
    let held = ask(request);
    if held.buf.is_null() {
        super::debug::debug(|| "the profiler gave no buffer".into());
        return;
    }
    // Another thread may have been given one meanwhile: the second goes back empty.
    if let Some(extra) = with(|s| s.held.replace(held)) {
        give_back_empty(extra);
    }
}

/// A buffer from the profiler's request callback (null: it gave none).
fn ask(request: RequestFn) -> Held {
    let (mut buf, mut size, mut max) = (std::ptr::null_mut::<u8>(), 0usize, 0usize);
    // SAFETY: the profiler's callback, with valid out-pointers.
    unsafe { request(&mut buf, &mut size, &mut max) };
    Held { buf, size, max }
}

/// Hands a buffer the profiler gave back to it, with `valid` bytes of records written.
fn hand_back(complete: CompleteFn, h: &Held, valid: usize) {
    // SAFETY: the profiler's callback, with a buffer it gave and what was written in it.
    unsafe { complete(std::ptr::null_mut(), 0, h.buf, h.size, valid) };
}

fn give_back_empty(h: Held) {
    if let Some(complete) = with(|s| s.complete) {
        hand_back(complete, &h, 0);
    }
}

/// The profiler changed the clock records are delivered in: conversion starts again
/// from a reading of the new one.
pub fn clock_changed() {
    with(|s| {
        if s.first_pair.is_some() {
            s.first_pair = Some(clock::pair());
        }
    });
}

pub fn enable_driver_api(cbid: u32, on: bool) {
    with(|s| {
        if on {
            s.driver_off.remove(&cbid)
        } else {
            s.driver_off.insert(cbid)
        }
    });
}

pub fn register(request: Option<RequestFn>, complete: Option<CompleteFn>) {
    with(|s| {
        s.request = request;
        s.complete = complete;
    });
    ensure_buffer();
}

pub fn push_external(k: usize, id: u64) {
    EXTERNAL.with(|e| e.borrow_mut()[k].push(id));
}

pub fn pop_external(k: usize) -> Option<u64> {
    EXTERNAL.with(|e| e.borrow_mut()[k].pop())
}

pub fn dropped() -> usize {
    with(|s| s.dropped)
}

/// A new correlation id, and the external-correlation records the ids pushed on this
/// thread give it.
fn correlate(s: &mut State) -> u32 {
    let c = CORRELATION.fetch_add(1, Ordering::Relaxed) + 1;
    if s.enabled.contains(&kind::EXTERNAL_CORRELATION) {
        EXTERNAL.with(|e| {
            for (k, stack) in e.borrow().iter().enumerate() {
                if let Some(&top) = stack.last() {
                    let mut r = Record::new(kind::EXTERNAL_CORRELATION);
                    r.u32(off::external::EXTERNAL_KIND, k as u32)
                        .u64(off::external::EXTERNAL_ID, top)
                        .u32(off::external::CORRELATION_ID, c);
                    keep(s, r);
                }
            }
        });
    }
    c
}

fn keep(s: &mut State, r: Record) {
    if s.ready.len() < READY_MAX {
        s.ready.push(r);
    } else {
        s.dropped += 1;
    }
}

fn work_kind(work: &Work, enabled: &HashSet<u32>) -> Option<u32> {
    match work {
        Work::Kernel { .. } => [kind::CONCURRENT_KERNEL, kind::KERNEL]
            .into_iter()
            .find(|k| enabled.contains(k)),
        Work::Copy { .. } => enabled.contains(&kind::MEMCPY).then_some(kind::MEMCPY),
        Work::Memset { .. } => enabled.contains(&kind::MEMSET).then_some(kind::MEMSET),
    }
}

/// Keeps what is held bounded, from a point where the program's thread holds no channel
/// and no lock: times finished work, waits for the oldest past PENDING_MAX, and delivers
/// a full load of ready records.
fn housekeep() {
    let (pending, ready, pass) = with(|s| {
        s.since_pass += 1;
        let pass = s.pending.len() > PENDING_SOFT && s.since_pass >= PASS_EVERY;
        if pass {
            s.since_pass = 0;
        }
        (s.pending.len(), s.ready.len(), pass)
    });
    if pending > PENDING_MAX {
        time_pending(true, pending - PENDING_MAX / 2);
    } else if pass {
        time_pending(false, usize::MAX);
    }
    if ready >= READY_DELIVER {
        deliver(false);
    }
}

fn before(stream: CUstream, dev: usize, work: &Work) -> Option<u64> {
    housekeep();
    let cbid = match work {
        Work::Kernel { cbid, .. } => *cbid,
        _ => 0,
    };
    let (timed, api, correlation) = with(|s| {
        let timed = work_kind(work, &s.enabled);
        let api = cbid != 0 && s.enabled.contains(&kind::DRIVER) && !s.driver_off.contains(&cbid);
        if timed.is_none() && !api {
            return (None, false, 0);
        }
        (timed, api, correlate(s))
    });
    if timed.is_none() && !api {
        return None;
    }
    let start_ns = monotonic_ns();
    let records = timed
        .and_then(|k| {
            timing::begin(stream, dev)
                .map(|span| (Some(work_record(work, k, dev, stream, correlation)), span))
        })
        .into_iter()
        .collect();
    Some(open(Open {
        stream,
        correlation,
        cbid: if api { cbid } else { 0 },
        start_ns,
        records,
        recorded_by_server: false,
    }))
}

fn open(o: Open) -> u64 {
    with(|s| {
        s.next_token += 1;
        s.open.insert(s.next_token, o);
        s.next_token
    })
}

/// A graph replay: one kernel record per timed node of the graph's twin, all with the
/// launch's correlation id, as CUPTI gives them.
fn graph(stream: CUstream, dev: usize, exec: u32) -> Option<profile::GraphReport> {
    housekeep();
    let (kernel, copies, memsets) = with(|s| {
        let kernel = [kind::CONCURRENT_KERNEL, kind::KERNEL]
            .into_iter()
            .find(|k| s.enabled.contains(k));
        let on = |k| s.enabled.contains(&k);
        (kernel, on(kind::MEMCPY), on(kind::MEMSET))
    });
    if kernel.is_none() && !copies && !memsets {
        return None;
    }
    let nodes = super::graphs::timed_nodes(dev, exec)?;
    let start_ns = monotonic_ns();
    let spans = timing::graph_spans(stream, dev, nodes.len())?;
    let mut ids = Vec::with_capacity(2 * spans.len());
    for sp in &spans {
        ids.extend(timing::event_ids(sp)?);
    }
    let (correlation, cbid) = with(|s| {
        let api = s.enabled.contains(&kind::DRIVER)
            && !s.driver_off.contains(&profile::CBID_GRAPH_LAUNCH);
        (
            correlate(s),
            if api { profile::CBID_GRAPH_LAUNCH } else { 0 },
        )
    });
    let records = nodes
        .iter()
        .zip(spans)
        .map(|(n, sp)| {
            let r = match n.kind {
                0 => kernel.map(|k| {
                    let func = crate::state::modules::function_by_id(dev, n.func);
                    let mut r = Record::new(k);
                    kernel_fields(&mut r, func, n.grid, n.block, n.shared);
                    ids_fields(&mut r, dev, stream, correlation);
                    r
                }),
                1 if copies => {
                    let work = graph_copy(n.src_type, n.dst_type, n.bytes);
                    Some(work_record(&work, kind::MEMCPY, dev, stream, correlation))
                }
                2 if memsets => {
                    let work = Work::Memset {
                        value: n.value,
                        bytes: n.bytes,
                    };
                    Some(work_record(&work, kind::MEMSET, dev, stream, correlation))
                }
                _ => None,
            };
            (r, sp)
        })
        .collect();
    let token = open(Open {
        stream,
        correlation,
        cbid,
        start_ns,
        records,
        recorded_by_server: true,
    });
    Some((token, ids))
}

fn after(token: u64, result: CUresult) {
    let end_ns = monotonic_ns();
    let Some(mut open) = with(|s| s.open.remove(&token)) else {
        return;
    };
    // Refused: the spans' events go back as they are dropped.
    let mut pending = Vec::new();
    if result == CUDA_SUCCESS {
        for (record, mut span) in std::mem::take(&mut open.records) {
            if !open.recorded_by_server {
                timing::end(&mut span, open.stream);
            }
            pending.push(Pending {
                record,
                span,
                stream: open.stream as usize,
            });
        }
    }
    with(|s| {
        if open.cbid != 0 {
            use off::api::*;
            let mut r = Record::new(kind::DRIVER);
            r.u32(CBID, open.cbid)
                .u64(START, open.start_ns)
                .u64(END, end_ns)
                .u32(PROCESS_ID, std::process::id())
                .u32(THREAD_ID, thread_id())
                .u32(CORRELATION_ID, open.correlation)
                .u32(RETURN_VALUE, result as u32);
            keep(s, r);
        }
        s.pending.append(&mut pending);
    });
}

fn waited(wait: Wait, start_ns: u64, end_ns: u64, result: CUresult) {
    if !with(|s| s.enabled.contains(&kind::SYNCHRONIZATION)) {
        return;
    }
    let ctx = crate::state::ctx::current_dev().map_or(abi::INVALID_ID, context_id);
    let event_id = |e: CUevent| crate::state::streams::event(e).map_or(abi::INVALID_ID, |e| e.id);
    let (ty, stream, event) = match wait {
        Wait::Stream(st) => (
            abi::sync_type::STREAM_SYNCHRONIZE,
            stream_id(st),
            abi::INVALID_ID,
        ),
        Wait::Event(e) => (
            abi::sync_type::EVENT_SYNCHRONIZE,
            abi::INVALID_ID,
            event_id(e),
        ),
        Wait::Context => (
            abi::sync_type::CONTEXT_SYNCHRONIZE,
            abi::INVALID_ID,
            abi::INVALID_ID,
        ),
        Wait::StreamWaitEvent(st, e) => (
            abi::sync_type::STREAM_WAIT_EVENT,
            stream_id(st),
            event_id(e),
        ),
    };
    with(|s| {
        let c = correlate(s);
        use off::sync::*;
        let mut r = Record::new(kind::SYNCHRONIZATION);
        r.u32(TYPE, ty)
            .u64(START, start_ns)
            .u64(END, end_ns)
            .u32(CORRELATION_ID, c)
            .u32(CONTEXT_ID, ctx)
            .u32(STREAM_ID, stream)
            .u32(EVENT_ID, event)
            .u32(RETURN_VALUE, result as u32);
        keep(s, r);
    });
}

/// Times the pending records of work that has finished; with `wait`, first waits for
/// the oldest `limit` (for each stream, its last among them). What has not finished
/// stays, in order.
fn time_pending(wait: bool, limit: usize) {
    let batch: Vec<Pending> = with(|s| std::mem::take(&mut s.pending));
    if wait {
        let mut last: HashMap<usize, usize> = HashMap::new();
        for (i, p) in batch.iter().take(limit).enumerate() {
            last.insert(p.stream, i);
        }
        for &i in last.values() {
            timing::wait(&batch[i].span);
        }
    }
    let answers = timing::resolve_all(&batch.iter().map(|p| &p.span).collect::<Vec<_>>());
    let mut back = Vec::new();
    let mut timed = Vec::new();
    for (p, answer) in batch.into_iter().zip(answers) {
        match answer {
            Ok(Some((start, end))) => {
                let Pending {
                    record: Some(mut record),
                    ..
                } = p
                else {
                    continue;
                };
                let (s_off, e_off, c_off) = match record.kind() {
                    kind::MEMCPY => (off::memcpy::START, off::memcpy::END, None),
                    kind::MEMSET => (off::memset::START, off::memset::END, None),
                    _ => (
                        off::kernel::START,
                        off::kernel::END,
                        Some(off::kernel::COMPLETED),
                    ),
                };
                record.u64(s_off, start).u64(e_off, end);
                if let Some(c) = c_off {
                    record.u64(c, end);
                }
                timed.push(record);
            }
            // Failed on the GPU or never ended: no record; its events go back.
            Ok(None) => {}
            Err(timing::NotReady) => back.push(p),
        }
    }
    with(|s| {
        for r in timed {
            keep(s, r);
        }
        // Work queued meanwhile goes after what was held back.
        back.append(&mut s.pending);
        s.pending = back;
    });
}

/// `cuptiActivityFlushAll`: times what has finished (a forced flush waits up to 2 s for
/// the rest, then leaves it for the next flush) and delivers every record held.
pub fn flush(forced: bool) -> u32 {
    let deadline = monotonic_ns() + 2_000_000_000;
    loop {
        time_pending(false, 0);
        let left = with(|s| s.pending.len());
        if left == 0 || !forced || monotonic_ns() > deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let r = deliver(forced);
    // Tracing over and nothing left to time: the pooled events stop counting against the
    // client's quota.
    if with(|s| s.pending.is_empty() && !s.enabled.iter().any(|&k| traced(k))) {
        timing::drain();
    }
    r
}

/// Hands the ready records to the profiler, in the buffer held and others it gives:
/// external correlations first (a profiler may map them before it reads the work they
/// name). `forced` hands the held buffer back even when nothing is ready, as a forced
/// flush of CUPTI does; a new one is then asked for while a kind is on.
fn deliver(forced: bool) -> u32 {
    let (mut records, request, complete, first, held) = with(|s| {
        let held = if forced || !s.ready.is_empty() {
            s.held.take()
        } else {
            None
        };
        (
            std::mem::take(&mut s.ready),
            s.request,
            s.complete,
            s.first_pair,
            held,
        )
    });
    if records.is_empty() {
        if let Some(h) = held {
            give_back_empty(h);
        }
        ensure_buffer();
        return abi::result::SUCCESS;
    }
    let (Some(request), Some(complete)) = (request, complete) else {
        with(|s| s.dropped += records.len());
        return abi::result::SUCCESS;
    };
    let last = clock::pair();
    let first = first.unwrap_or(last);
    for r in &mut records {
        r.convert_times(times_of(r.kind()), &|t| clock::convert(first, last, t));
    }
    records.sort_by_key(|r| r.kind() != kind::EXTERNAL_CORRELATION);
    super::debug::debug(|| describe(&records, last));
    let mut held = held;
    let mut rest = &records[..];
    while !rest.is_empty() {
        let h = held.take().unwrap_or_else(|| ask(request));
        let Held { buf, size, max } = h;
        if buf.is_null() || size < rest[0].bytes().len() {
            if !buf.is_null() {
                hand_back(complete, &h, 0);
            }
            with(|s| s.dropped += rest.len());
            break;
        }
        let mut valid = 0usize;
        let mut n = 0usize;
        while let Some(r) = rest.get(n) {
            let b = r.bytes();
            if valid + b.len() > size || (max != 0 && n >= max) {
                break;
            }
            // SAFETY: the profiler's buffer holds `size` bytes; valid + len <= size.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), buf.add(valid), b.len()) };
            valid += b.len();
            n += 1;
        }
        rest = &rest[n..];
        hand_back(complete, &h, valid);
    }
    ensure_buffer();
    abi::result::SUCCESS
}

/// What a delivery holds, for OMPS_CUPTI_DEBUG: records per kind and the span of their
/// times against the profiler's clock now.
fn describe(records: &[Record], now: clock::Pair) -> String {
    let mut kinds: std::collections::BTreeMap<u32, usize> = Default::default();
    let (mut lo, mut hi) = (u64::MAX, 0u64);
    for r in records {
        *kinds.entry(r.kind()).or_default() += 1;
        for &o in times_of(r.kind()) {
            let v = u64::from_le_bytes(r.bytes()[o..o + 8].try_into().expect("8 bytes"));
            if v != 0 {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
    }
    format!(
        "delivering {} records (kind: count {kinds:?}), times {lo}..{hi}, profiler clock now {}",
        records.len(),
        now.out
    )
}

/// `cuptiFinalize`: delivers what is held and forgets the rest (kinds, callbacks).
pub fn finalize() {
    flush(true);
    let mut pending = with(|s| {
        profile::set_hooks(&HOOKS, false);
        std::mem::take(&mut *s)
    });
    if let (Some(h), Some(complete)) = (pending.held.take(), pending.complete) {
        hand_back(complete, &h, 0);
    }
    // Dropped outside the lock: each span's events go back to the pool, then the pool
    // is destroyed.
    drop(pending);
    timing::drain();
}
