//! The host GPU's stream and event family: events created, recorded, waited on and
//! queried.

use super::state::HostGpu;
use crate::gpu::{code, CuError, GpuResult};
use std::sync::atomic::Ordering;

pub(super) fn event_create(gpu: &HostGpu, _flags: u32) -> GpuResult<u64> {
    let mut st = gpu.state.lock().unwrap();
    let h = st.next_handle;
    st.next_handle += 1;
    st.events.insert(h, ());
    Ok(h)
}

pub(super) fn event_record(gpu: &HostGpu, ev: u64, s: usize) -> GpuResult<()> {
    gpu.queued(s);
    gpu.recorded
        .lock()
        .unwrap()
        .insert(ev, std::time::Instant::now());
    let mut st = gpu.state.lock().unwrap();
    st.check()?;
    st.events.get(&ev).ok_or(CuError(code::INVALID_HANDLE))?;
    // Recorded in a capture, the event forks it into whichever stream waits on it.
    let origin = st.origin(s);
    if st.capturing.contains_key(&origin) {
        st.event_capture.insert(ev, origin);
    } else {
        st.event_capture.remove(&ev);
    }
    Ok(())
}

pub(super) fn stream_wait_event(gpu: &HostGpu, s: usize, ev: u64) -> GpuResult<()> {
    gpu.queued(s);
    let mut st = gpu.state.lock().unwrap();
    st.check()?;
    st.events.get(&ev).ok_or(CuError(code::INVALID_HANDLE))?;
    if let Some(&o) = st.event_capture.get(&ev) {
        if o != s && st.capturing.contains_key(&o) && !st.capturing.contains_key(&s) {
            st.joined.insert(s, o);
        }
    }
    Ok(())
}

pub(super) fn event_query(gpu: &HostGpu, ev: u64) -> GpuResult<bool> {
    gpu.run_queues();
    {
        let st = gpu.state.lock().unwrap();
        st.check()?;
        st.events.get(&ev).ok_or(CuError(code::INVALID_HANDLE))?;
    }
    let lag = gpu.fence_lag_us.load(Ordering::Relaxed);
    if lag > 0 {
        let recorded = gpu.recorded.lock().unwrap().get(&ev).copied();
        if recorded.is_some_and(|t| (t.elapsed().as_micros() as u64) < lag) {
            return Ok(false);
        }
    }
    // The stuck switch plays a kernel that runs long: nothing recorded completes.
    Ok(!*gpu.stuck.lock().unwrap())
}
