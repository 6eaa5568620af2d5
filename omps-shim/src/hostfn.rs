//! Host functions (`cuLaunchHostFunc`, `cuStreamAddCallback`) in stream order, without
//! blocking the caller. Each takes a slot of the segment's host-function page: the server
//! queues, on the stream, a write of the slot's `done` word and a wait for its `ack` word
//! (omps-server/src/session/sync.rs). A thread of this process runs each function once
//! its `done` word shows the GPU got there, then writes `ack`, and the stream goes on. A
//! function that never returns holds up only this client's stream.

use crate::cuda::*;
use omps_ring::segment::HOSTFN_SLOTS;
use omps_ring::wire::{self, Op};
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A host function and what it needs, moved to the thread that runs it.
pub struct Call(Box<dyn FnOnce() + Send>);

impl Call {
    /// # Safety
    /// `f` may run on another thread, as the driver runs host functions.
    pub unsafe fn new(f: impl FnOnce() + 'static) -> Call {
        struct AssertSend<F>(F);
        // SAFETY: the caller's promise (CUDA's contract for host functions).
        unsafe impl<F> Send for AssertSend<F> {}
        impl<F: FnOnce()> AssertSend<F> {
            fn call(self) {
                (self.0)()
            }
        }
        let f = AssertSend(f);
        // The closure captures the whole wrapper (a method call), so it is Send.
        Call(Box::new(move || f.call()))
    }
}

struct Slots {
    pending: Vec<Option<(u32, Call)>>,
    /// The last sequence number each slot used (never 0: the words start at 0).
    seq: Vec<u32>,
    running: bool,
}

static SLOTS: Mutex<Option<Slots>> = Mutex::new(None);
/// Signalled when a function is queued (for the runner) or a slot frees (for callers).
static CHANGED: Condvar = Condvar::new();

/// Queues `f` on stream `stream` of device `dev`, in stream order.
pub fn enqueue(dev: usize, stream: u32, f: Call) -> Result<(), CUresult> {
    let c = crate::api::live()?;
    let mut guard = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    let (slot, seq) = loop {
        let s = guard.get_or_insert_with(|| Slots {
            pending: (0..HOSTFN_SLOTS).map(|_| None).collect(),
            seq: vec![0; HOSTFN_SLOTS],
            running: false,
        });
        if !s.running {
            s.running = true;
            std::thread::Builder::new()
                .name("omps-hostfn".into())
                .spawn(run)
                .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        }
        if let Some(i) = s.pending.iter().position(Option::is_none) {
            let seq = s.seq[i].wrapping_add(1).max(1);
            s.seq[i] = seq;
            s.pending[i] = Some((seq, f));
            break (i, seq);
        }
        // Every slot waits for its stream: wait for one to free.
        guard = CHANGED.wait(guard).unwrap_or_else(|e| e.into_inner());
    };
    drop(guard);
    CHANGED.notify_all();
    let r = c.push(
        dev,
        Op::HostFunc,
        &[bytemuck::bytes_of(&wire::HostFunc {
            stream,
            slot: slot as u32,
            seq,
            _pad: 0,
        })],
    );
    if r.is_err() {
        let mut g = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = g.as_mut() {
            s.pending[slot] = None;
        }
    }
    r
}

/// Runs each queued function once the GPU reached it, then lets its stream go on.
fn run() {
    let Ok(c) = crate::api::live() else { return };
    let seg = c.seg();
    let mut idle_since = Instant::now();
    loop {
        let mut ready = Vec::new();
        {
            let mut g = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
            while g
                .as_ref()
                .is_some_and(|s| s.pending.iter().all(Option::is_none))
            {
                g = CHANGED.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            let Some(s) = g.as_mut() else { return };
            for (i, p) in s.pending.iter_mut().enumerate() {
                let landed = p.as_ref().is_some_and(|(seq, _)| {
                    seg.hostfn(i)
                        .is_some_and(|w| w.done.load(Ordering::Acquire) == *seq)
                });
                if landed {
                    ready.push((i, p.take().expect("checked")));
                }
            }
        }
        if ready.is_empty() {
            // Spin briefly after the last function, then poll gently.
            if idle_since.elapsed() < Duration::from_micros(200) {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
            continue;
        }
        for (i, (seq, call)) in ready {
            (call.0)();
            if let Some(w) = seg.hostfn(i) {
                w.ack.store(seq, Ordering::Release);
            }
        }
        idle_since = Instant::now();
        CHANGED.notify_all();
    }
}
