//! Host functions (`cuLaunchHostFunc`, `cuStreamAddCallback`) in stream order, without
//! blocking the caller. Each takes a slot of the segment's host-function page: the server
//! queues, on the stream, a write of the slot's `done` word and a wait for its `ack` word
//! (omps-server/src/session/sync.rs). A thread of this process runs each function once
//! its `done` word shows the GPU got there, then writes `ack`, and the stream goes on. A
//! function that never returns holds up only this client's stream.
//!
//! A host function queued on a capturing stream becomes a host node of the graph: it keeps
//! a slot for the process's life, and on every replay the GPU sets `done = 1`, this
//! process's thread clears it, runs the function and sets `ack = 1`, and the GPU, having
//! waited for that, sets `ack` back to 0 for the next replay.

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

/// Runs `f` now on a thread of its own, not the caller's (a user object's destructor,
/// which the driver too runs on a thread of its own).
pub fn run_detached(f: Call) {
    let _ = std::thread::Builder::new()
        .name("omps-destructor".into())
        .spawn(move || (f.0)());
}

/// A graph's host node: run on every replay.
#[derive(Clone, Copy)]
struct HostNode {
    f: unsafe extern "C" fn(*mut std::ffi::c_void),
    data: usize,
}

struct Slots {
    pending: Vec<Option<(u32, Call)>>,
    /// Slots held by host nodes of captured graphs.
    nodes: Vec<Option<HostNode>>,
    /// Host nodes whose words lie in pinned memory (staged copies, api/staged.rs): the
    /// `done` word's address -> the node. They are given back when their graphs go.
    word_nodes: std::collections::HashMap<usize, HostNode>,
    /// The last sequence number each slot used (never 0: the words start at 0).
    seq: Vec<u32>,
    running: bool,
}

impl Slots {
    /// A slot neither a queued function nor a host node holds.
    fn free(&self) -> Option<usize> {
        (0..HOSTFN_SLOTS).find(|&i| self.pending[i].is_none() && self.nodes[i].is_none())
    }
}

static SLOTS: Mutex<Option<Slots>> = Mutex::new(None);
/// Signalled when a function is queued (for the runner) or a slot frees (for callers).
static CHANGED: Condvar = Condvar::new();

/// Queues `f` on stream `stream` of device `dev`, in stream order.
pub fn enqueue(dev: usize, stream: u32, f: Call) -> Result<(), CUresult> {
    let c = crate::state::entry::live()?;
    let mut guard = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    let (slot, seq) = loop {
        let s = slots(&mut guard)?;
        if let Some(i) = s.free() {
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

/// The slots, made (and the runner started) on first use.
fn slots(guard: &mut Option<Slots>) -> Result<&mut Slots, CUresult> {
    let s = guard.get_or_insert_with(|| Slots {
        pending: (0..HOSTFN_SLOTS).map(|_| None).collect(),
        nodes: vec![None; HOSTFN_SLOTS],
        word_nodes: Default::default(),
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
    Ok(s)
}

/// Makes `f(data)` a host node of the graph being captured on `stream`: a slot of its own
/// for the process's life. CUDA_ERROR_OUT_OF_MEMORY once every slot is taken.
pub fn enqueue_node(
    dev: usize,
    stream: u32,
    f: unsafe extern "C" fn(*mut std::ffi::c_void),
    data: usize,
) -> Result<(), CUresult> {
    let c = crate::state::entry::live()?;
    let mut guard = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    let s = slots(&mut guard)?;
    let slot = s.free().ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    // The words may hold an earlier function's sequence: start both at 0.
    let w = c.seg().hostfn(slot).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    w.done.store(0, Ordering::Release);
    w.ack.store(0, Ordering::Release);
    s.nodes[slot] = Some(HostNode { f, data });
    drop(guard);
    CHANGED.notify_all();
    let r = c.push(
        dev,
        Op::HostNode,
        &[bytemuck::bytes_of(&wire::HostFunc {
            stream,
            slot: slot as u32,
            seq: 0,
            _pad: 0,
        })],
    );
    if r.is_err() {
        let mut g = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = g.as_mut() {
            s.nodes[slot] = None;
        }
    }
    r
}

/// The two words of a host node in pinned memory: the GPU sets `done` to 1 and waits
/// for `ack == 1`, then clears `ack`.
#[repr(C, align(8))]
pub struct NodeWords {
    pub done: std::sync::atomic::AtomicU32,
    pub ack: std::sync::atomic::AtomicU32,
}

/// Makes `f(data)` a host node of the graph being captured on `stream`, through `words`
/// (pinned memory shared with the server, which outlives the node) rather than a slot:
/// such nodes are not limited in number. [`drop_node_at`] gives it back.
pub fn enqueue_node_at(
    dev: usize,
    stream: u32,
    words: &'static NodeWords,
    f: unsafe extern "C" fn(*mut std::ffi::c_void),
    data: usize,
) -> Result<(), CUresult> {
    let c = crate::state::entry::live()?;
    words.done.store(0, Ordering::Release);
    words.ack.store(0, Ordering::Release);
    let at = words as *const NodeWords as usize;
    {
        let mut guard = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
        slots(&mut guard)?
            .word_nodes
            .insert(at, HostNode { f, data });
    }
    CHANGED.notify_all();
    let r = c.push(
        dev,
        Op::HostNodeAt,
        &[bytemuck::bytes_of(&wire::HostNodeAt {
            stream,
            _pad: 0,
            words: at as u64,
        })],
    );
    if r.is_err() {
        drop_node_at(words);
    }
    r
}

/// Host nodes on pinned words that are live now (tests).
pub fn word_nodes() -> usize {
    let g = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    g.as_ref().map_or(0, |s| s.word_nodes.len())
}

/// The host node on `words` runs no more (its graphs and their launches are done).
pub fn drop_node_at(words: &NodeWords) {
    let at = words as *const NodeWords as usize;
    let mut g = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = g.as_mut() {
        s.word_nodes.remove(&at);
    }
}

/// Runs each queued function once the GPU reached it, then lets its stream go on.
fn run() {
    let Ok(c) = crate::state::entry::live() else {
        return;
    };
    let seg = c.seg();
    let mut idle_since = Instant::now();
    loop {
        let mut ready = Vec::new();
        let mut nodes = Vec::new();
        let mut word_ready = Vec::new();
        {
            let mut g = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
            while g.as_ref().is_some_and(|s| {
                s.pending.iter().all(Option::is_none)
                    && s.nodes.iter().all(Option::is_none)
                    && s.word_nodes.is_empty()
            }) {
                g = CHANGED.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            let Some(s) = g.as_mut() else { return };
            for (i, n) in s.nodes.iter().enumerate() {
                if let (Some(n), Some(w)) = (n, seg.hostfn(i)) {
                    if w.done.load(Ordering::Acquire) == 1 {
                        nodes.push((i, *n));
                    }
                }
            }
            for (&at, n) in &s.word_nodes {
                // SAFETY: listed words are live pinned memory (dropped from the list
                // before they are freed).
                let w = unsafe { &*(at as *const NodeWords) };
                if w.done.load(Ordering::Acquire) == 1 {
                    word_ready.push((at, *n));
                }
            }
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
        for (i, n) in nodes.iter().copied() {
            let Some(w) = seg.hostfn(i) else { continue };
            w.done.store(0, Ordering::Release);
            // SAFETY: the function and data the program gave cuLaunchHostFunc, called as
            // the driver calls a host node on every replay.
            unsafe { (n.f)(n.data as *mut std::ffi::c_void) };
            w.ack.store(1, Ordering::Release);
        }
        for &(at, n) in &word_ready {
            // SAFETY: as above; the node's graph holds the words until its launches are
            // done, and this runs inside one.
            let w = unsafe { &*(at as *const NodeWords) };
            w.done.store(0, Ordering::Release);
            // SAFETY: the function and data the node was made with (api/staged.rs).
            unsafe { (n.f)(n.data as *mut std::ffi::c_void) };
            w.ack.store(1, Ordering::Release);
        }
        if ready.is_empty() && nodes.is_empty() && word_ready.is_empty() {
            // Spin briefly after the last function, then poll gently; a process whose
            // graphs hold host nodes polls for ever, so after a while, more gently still.
            let idle = idle_since.elapsed();
            if idle < Duration::from_micros(200) {
                std::hint::spin_loop();
            } else if idle < Duration::from_millis(20) {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::thread::sleep(Duration::from_micros(500));
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
