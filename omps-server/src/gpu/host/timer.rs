//! The host GPU's timing of traced clients' work (docs/design.md 12b, design S): its work
//! runs while the lane's call runs, so the host time around the call is the work's.

use crate::gpu::work_times::{monotonic_ns, WorkTimes};
use std::cell::Cell;
use std::sync::Mutex;

static TIMES: Mutex<Option<WorkTimes>> = Mutex::new(None);

thread_local! {
    /// The key and start of the work this thread is queueing.
    static BEGUN: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

fn with_times<R>(f: impl FnOnce(&mut WorkTimes) -> R) -> R {
    let mut g = TIMES.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(WorkTimes::default))
}

pub(super) fn begin(key: u64) {
    BEGUN.set(Some((key, monotonic_ns())));
}

pub(super) fn end() {
    if let Some((key, start)) = BEGUN.take() {
        let end = monotonic_ns();
        with_times(|t| t.keyed(key, start, end));
    }
}

pub(super) fn take(key: u64) -> Option<(u64, u64)> {
    with_times(|t| t.take(key))
}
