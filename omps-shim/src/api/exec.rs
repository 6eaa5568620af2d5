//! Streams, events and kernel launches.

use crate::cuda::*;
use crate::handles::{leak, next_id, retire, Event, Stream, EVENT_MAGIC, STREAM_MAGIC};
use crate::state::capture::ordered_on_host;
use crate::state::ctx::current_dev;
use crate::state::entry::{entry, live, out};
use crate::state::profile::{waiting, Wait};
use crate::state::streams::*;
use omps_ring::wire::{self, EventCreate, EventElapsed, EventRecord, Handle, Op, StreamCreate};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::AtomicU32;

/// The kernel launch entry points, under the path they always had.
pub use super::kernel_launch::*;
/// The handle types of this family, named where the program sees them.
pub use crate::state::launch::LaunchConfig;
pub use crate::state::streams::{CUevent, CUfunction, CUstream};

fn create_stream(ph: *mut CUstream, flags: c_uint, priority: c_int) -> Result<(), CUresult> {
    if ph.is_null() || flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = current_dev()?;
    // Out-of-range priorities are clamped into the device's range, as the driver does.
    let [least, greatest] = crate::state::device::device(dev as CUdevice)?.stream_priority;
    let priority = priority.clamp(greatest.min(least), least.max(greatest));
    if let Some(h) = crate::state::green::stream_in_current(flags, priority)? {
        // SAFETY: ph checked non-null; the caller's pointer.
        return unsafe { out(ph, h as *const Stream as CUstream) };
    }
    let id = next_id();
    let rec = StreamCreate {
        id,
        flags,
        priority,
        _pad: 0,
    };
    let c = live()?;
    c.streams.take()?;
    c.push(dev, Op::StreamCreate, &[bytemuck::bytes_of(&rec)])?;
    let h = leak(Stream {
        magic: AtomicU32::new(STREAM_MAGIC),
        id,
        dev,
        flags,
        priority,
    });
    // SAFETY: ph checked non-null; the caller's pointer.
    unsafe { out(ph, h) }
}

/// # Safety
/// `ph` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) -> CUresult {
    entry(|| create_stream(ph, flags, 0))
}

/// # Safety
/// `s` is a stream handle from this shim.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(s: CUstream) -> CUresult {
    if let Some(r) = crate::state::green::destroy_detached(s) {
        return r;
    }
    entry(|| {
        let st = resolve_stream(s)?.ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        retire(&st.magic, STREAM_MAGIC)?;
        let c = live()?;
        c.streams.give_back();
        c.push(
            st.dev,
            Op::StreamDestroy,
            &[bytemuck::bytes_of(&Handle { id: st.id, _pad: 0 })],
        )
    })
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    waiting(Wait::Stream(s), || {
        entry(|| {
            crate::state::capture::unsafe_call_allowed()?;
            stream_sync(s)
        })
    })
}

#[no_mangle]
pub extern "C" fn cuStreamQuery(s: CUstream) -> CUresult {
    entry(|| {
        crate::state::capture::unsafe_call_allowed()?;
        let (id, dev) = stream_dev(s)?;
        handle_call(dev, Op::StreamQuery, id)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(s: CUstream, e: CUevent, flags: c_uint) -> CUresult {
    waiting(Wait::StreamWaitEvent(s, e), || {
        stream_wait_event(s, e, flags)
    })
}

fn stream_wait_event(s: CUstream, e: CUevent, flags: c_uint) -> CUresult {
    // CU_EVENT_WAIT_EXTERNAL makes a difference only inside a capture: an event wait node.
    const EXTERNAL: c_uint = 1;
    entry(|| {
        let op = match flags {
            0 => Op::StreamWaitEvent,
            EXTERNAL if crate::state::capture::any_capture() => Op::StreamWaitEventExternal,
            EXTERNAL => Op::StreamWaitEvent,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        let ev = event(e)?;
        let (id, dev) = stream_dev(s)?;
        if dev != ev.dev {
            // Across GPUs the wait is kept on the host: the event's last record has
            // passed before anything queued after this call.
            ordered_on_host(s, "cuStreamWaitEvent across GPUs in a capture")?;
            return handle_call(ev.dev, Op::EventSync, ev.id);
        }
        queue_event_op(ev, id, dev, op)
    })
}

/// # Safety
/// `ph` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ph: *mut CUevent, flags: c_uint) -> CUresult {
    entry(|| {
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = current_dev()?;
        let id = next_id();
        let c = live()?;
        c.events.take()?;
        c.push(
            dev,
            Op::EventCreate,
            &[bytemuck::bytes_of(&EventCreate { id, flags })],
        )?;
        let h = leak(Event {
            magic: AtomicU32::new(EVENT_MAGIC),
            id,
            dev,
            flags,
            opened: false,
        });
        // SAFETY: ph checked non-null; the caller's pointer.
        unsafe { out(ph, h) }
    })
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(e: CUevent) -> CUresult {
    entry(|| {
        let ev = event(e)?;
        retire(&ev.magic, EVENT_MAGIC)?;
        let c = live()?;
        c.events.give_back();
        c.push(
            ev.dev,
            Op::EventDestroy,
            &[bytemuck::bytes_of(&Handle { id: ev.id, _pad: 0 })],
        )
    })
}

#[no_mangle]
pub extern "C" fn cuEventRecord(e: CUevent, s: CUstream) -> CUresult {
    entry(|| record_on_stream(e, s, Op::EventRecord))
}

/// Queues `op`, a record of event `e`, on stream `s` (of the event's device, as the
/// driver requires).
fn record_on_stream(e: CUevent, s: CUstream, op: Op) -> Result<(), CUresult> {
    let ev = event(e)?;
    let (id, dev) = stream_dev(s)?;
    if dev != ev.dev {
        if !ev.opened {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        // An event opened from an IPC handle of another GPU (simpleIPC records its
        // sibling's on its own stream). As cross-GPU waits, this is kept on the host: the
        // stream's work so far finishes, then the event is recorded on this process's
        // default stream of the event's GPU, where it completes once that stream's earlier
        // work has.
        ordered_on_host(s, "cuEventRecord of another GPU's IPC event in a capture")?;
        handle_call(dev, Op::StreamSync, id)?;
        return queue_event_op(ev, wire::STREAM_DEFAULT, ev.dev, op);
    }
    queue_event_op(ev, id, dev, op)
}

/// Queues `op` for event `ev` on stream `id` of its device `dev`.
fn queue_event_op(ev: &Event, id: u32, dev: usize, op: Op) -> Result<(), CUresult> {
    live()?.push(
        dev,
        op,
        &[bytemuck::bytes_of(&EventRecord {
            event: ev.id,
            stream: id,
        })],
    )
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(e: CUevent) -> CUresult {
    waiting(Wait::Event(e), || {
        entry(|| {
            crate::state::capture::unsafe_call_allowed()?;
            let ev = event(e)?;
            handle_call(ev.dev, Op::EventSync, ev.id)
        })
    })
}

#[no_mangle]
pub extern "C" fn cuEventQuery(e: CUevent) -> CUresult {
    entry(|| {
        crate::state::capture::unsafe_call_allowed()?;
        let ev = event(e)?;
        handle_call(ev.dev, Op::EventQuery, ev.id)
    })
}

/// # Safety
/// `ms` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    entry(|| {
        let (a, b) = (event(start)?, event(end)?);
        if ms.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = live()?;
        let mut ch = c.channel();
        ch.call(a.dev, Op::EventElapsed, |call| {
            bytemuck::bytes_of(&EventElapsed {
                call,
                start: a.id,
                end: b.id,
            })
            .to_vec()
        })?;
        let v = f32::from_bits(ch.reply::<wire::U64Reply>().value as u32);
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(ms, v) }
    })
}

/// # Safety
/// As cuEventElapsedTime_v2.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuEventElapsedTime_v2(ms, start, end) }
}

/// # Safety
/// `ph` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ph: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    entry(|| create_stream(ph, flags, priority))
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority(s: CUstream, p: *mut c_int) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(p, resolve_stream(s)?.map_or(0, |st| st.priority)) })
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(s: CUstream, p: *mut c_uint) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(p, resolve_stream(s)?.map_or(0, |st| st.flags)) })
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetId(s: CUstream, p: *mut u64) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(p, resolve_stream(s)?.map_or(0, |st| st.id as u64)) })
}

/// Host functions run in the client, in stream order. For now the call drains the stream
/// and runs the function before returning: everything queued before it has finished and
/// nothing queued after it can start early, as CUDA promises, but the caller waits.
///
/// # Safety
/// `f` is a host function taking `data`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(
    s: CUstream,
    f: Option<unsafe extern "C" fn(*mut c_void)>,
    data: *mut c_void,
) -> CUresult {
    entry(|| {
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let data = data as usize;
        if crate::state::capture::any_capture()
            && crate::state::capture::capture_info(s)?.0 == omps_ring::wire::graph::STATUS_ACTIVE
        {
            // In a capture: a host node of the graph, run on every replay.
            let (id, dev) = stream_dev(s)?;
            return crate::hostfn::enqueue_node(dev, id, f, data);
        }
        let (id, dev) = host_fn_stream(s)?;
        // SAFETY: the driver too calls host functions on a thread of its own.
        let call = unsafe { crate::hostfn::Call::new(move || f(data as *mut c_void)) };
        crate::hostfn::enqueue(dev, id, call)
    })
}

/// The stream a host function or callback goes on; refused during a capture (a callback
/// cannot be captured, natively either; cuLaunchHostFunc makes a host node first).
fn host_fn_stream(s: CUstream) -> Result<(u32, usize), CUresult> {
    if crate::state::capture::any_capture()
        && crate::state::capture::capture_info(s)?.0 != omps_ring::wire::graph::STATUS_NONE
    {
        return Err(crate::unsupported::unsupported(
            "a host function in a stream capture",
        ));
    }
    stream_dev(s)
}

type StreamCallback = unsafe extern "C" fn(CUstream, CUresult, *mut c_void);

/// As cuLaunchHostFunc; the callback learns the stream's status.
///
/// # Safety
/// `cb` is a callback taking `data`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamAddCallback(
    s: CUstream,
    cb: Option<StreamCallback>,
    data: *mut c_void,
    flags: c_uint,
) -> CUresult {
    entry(|| {
        let cb = cb.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (id, dev) = host_fn_stream(s)?;
        let (s, data) = (s as usize, data as usize);
        // SAFETY: as cuLaunchHostFunc. The status is the stream's at the callback:
        // an error of its work shows at the next synchronizing call instead.
        let call = unsafe {
            crate::hostfn::Call::new(move || cb(s as CUstream, CUDA_SUCCESS, data as *mut c_void))
        };
        crate::hostfn::enqueue(dev, id, call)
    })
}

#[no_mangle]
pub extern "C" fn cuEventRecordWithFlags(e: CUevent, s: CUstream, flags: c_uint) -> CUresult {
    const EXTERNAL: c_uint = 1;
    // CU_EVENT_RECORD_EXTERNAL makes a difference only inside a capture (an event record
    // node); elsewhere it is a plain record.
    match flags {
        0 => cuEventRecord(e, s),
        EXTERNAL if !crate::state::capture::any_capture() => cuEventRecord(e, s),
        EXTERNAL => entry(|| record_on_stream(e, s, Op::EventRecordExternal)),
        _ => CUDA_ERROR_INVALID_VALUE,
    }
}

/// # Safety
/// `pctx` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(s: CUstream, pctx: *mut *mut c_void) -> CUresult {
    entry(|| {
        let st = resolve_stream(s)?;
        if let Some(g) = st.and_then(crate::state::green::green_of_stream) {
            // SAFETY: the caller's pointer.
            return unsafe { out(pctx, g.ctx as *const _ as *mut c_void) };
        }
        let dev = match st {
            Some(st) => st.dev,
            None => current_dev()?,
        };
        // SAFETY: the caller's pointer.
        unsafe { out(pctx, crate::state::ctx::primary_handle(dev)) }
    })
}

/// # Safety
/// `dev` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetDevice(s: CUstream, dev: *mut c_int) -> CUresult {
    entry(|| {
        let d = match resolve_stream(s)? {
            Some(st) => st.dev,
            None => current_dev()?,
        };
        // SAFETY: the caller's pointer.
        unsafe { out(dev, d as c_int) }
    })
}

/// The pre-`_v2` names; the same contract.
///
/// # Safety
/// As [`cuStreamDestroy_v2`].
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy(s: CUstream) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { cuStreamDestroy_v2(s) }
}

#[no_mangle]
pub extern "C" fn cuEventDestroy(e: CUevent) -> CUresult {
    cuEventDestroy_v2(e)
}

/// The stream's context and green context; omps's clients have no green contexts.
///
/// # Safety
/// `pctx` and `pgreen` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx_v2(
    s: CUstream,
    pctx: *mut *mut c_void,
    pgreen: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded contract.
    let r = unsafe { cuStreamGetCtx(s, pctx) };
    if r == CUDA_SUCCESS && !pgreen.is_null() {
        let g = resolve_stream(s)
            .ok()
            .flatten()
            .and_then(crate::state::green::green_of_stream)
            .map_or(std::ptr::null_mut(), |g| g as *const _ as *mut c_void);
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { pgreen.write(g) };
    }
    r
}

/// # Safety
/// As [`cuStreamGetCtx_v2`].
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx_v2_ptsz(
    s: CUstream,
    pctx: *mut *mut c_void,
    pgreen: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamGetCtx_v2(s, pctx, pgreen) })
}

/// # Safety
/// As [`cuStreamAddCallback`].
#[no_mangle]
pub unsafe extern "C" fn cuStreamAddCallback_ptsz(
    s: CUstream,
    cb: Option<StreamCallback>,
    data: *mut c_void,
    flags: c_uint,
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamAddCallback(s, cb, data, flags) })
}
