//! What the host GPU keeps to play a real GPU's hardware queues and the driver's depth
//! bound (queues.rs says how they play): the memory operations each queue holds.
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};

/// Operations a stream takes before the driver blocks the caller (an H100 blocked the
/// 1,021st).
pub const DRIVER_DEPTH: usize = 1020;

/// A stream memory operation held on a queue behind an unmet wait.
#[derive(Clone, Copy)]
pub(super) enum Held {
    /// Wait until the word reaches `value` (wrap-around >=), or equals it.
    Wait {
        addr: usize,
        value: u32,
        eq: bool,
    },
    Write {
        addr: usize,
        value: u32,
    },
}

#[derive(Default)]
pub struct Model {
    pub(super) queues_on: bool,
    pub(super) connections: usize,
    pub(super) held: HashMap<usize, VecDeque<Held>>,
    pub(super) depth_on: bool,
    /// Operations queued per stream since the GPU got stuck, and the most any reached.
    pub(super) pending: HashMap<usize, usize>,
    pub(super) deepest: usize,
    /// Completion words written while stuck: they land when the GPU moves.
    pub(super) stuck_writes: Vec<(usize, u32)>,
}

pub(super) fn met(addr: usize, value: u32, eq: bool) -> bool {
    // SAFETY: the address is a registered host word (a segment slot or pinned memory the
    // server checked), 4-aligned, mapped while the client's work can reach it.
    let now = unsafe { (*(addr as *const AtomicU32)).load(Ordering::Acquire) };
    if eq {
        now == value
    } else {
        now.wrapping_sub(value) as i32 >= 0
    }
}

impl Model {
    /// Moves every queue as far as its waits allow.
    pub(super) fn run(&mut self) {
        for q in self.held.values_mut() {
            while let Some(&h) = q.front() {
                match h {
                    Held::Wait { addr, value, eq } if !met(addr, value, eq) => break,
                    Held::Wait { .. } => {}
                    Held::Write { addr, value } => {
                        // SAFETY: as in met(): a registered, aligned host word.
                        unsafe { (*(addr as *const AtomicU32)).store(value, Ordering::Release) }
                    }
                }
                q.pop_front();
            }
        }
        self.held.retain(|_, q| !q.is_empty());
    }
}
