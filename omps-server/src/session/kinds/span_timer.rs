//! A traced client's spans as its session keeps them (session/timer.rs runs them): the
//! span each stream's next work belongs to, the span each event starts, and the spans
//! still waiting for the GPU's record of their work. Plain data, below the session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

/// How long after its end event completed a span waits for the GPU's record of its work
/// before the events answer for it (work no record is made for: a host-side copy).
pub const RECORD_WAIT_NS: u64 = 200_000_000;
/// Spans waited on at most at once (more answer from their events at once).
pub const WAITING_MAX: usize = 4096;

/// Sessions made so far: the upper half of every key.
static SESSIONS: AtomicU32 = AtomicU32::new(0);

#[derive(Default)]
pub struct SessionTimer {
    /// The backend times this session's work (Profiling on, and it could).
    pub timed: bool,
    pub uid: u32,
    pub seq: u32,
    /// Client stream -> the span its next work belongs to.
    pub by_stream: HashMap<u32, u32>,
    /// Client event -> the span that starts at it (its last record).
    pub by_event: HashMap<u32, u32>,
    /// Spans whose end event completed with no record yet: since when.
    pub waiting: HashMap<u32, u64>,
}

impl SessionTimer {
    /// Gives the session its number among sessions, once.
    pub fn number(&mut self) {
        if self.uid == 0 {
            self.uid = SESSIONS
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1)
                .max(1);
        }
    }

    pub fn key(&self, span: u32) -> u64 {
        (u64::from(self.uid) << 32) | u64::from(span)
    }

    /// The key of the next work on `stream` (spans are kept only while timed).
    pub fn key_for(&self, stream: u32) -> Option<u64> {
        self.by_stream.get(&stream).map(|&s| self.key(s))
    }
}
