//! The control thread's messages to one worker lane (a client added or gone, a pinned
//! range to release, quit). The control thread must never wait on a lane: a lane can sit
//! in the driver for as long as a kernel runs, and a control thread waiting on it answers
//! no one (handshakes, pins, operators). So a message the lane's queue has no room for
//! waits here, in order, and goes at the control thread's next pass; and a lane that has
//! messages waiting here is given no new client (issue 23, finding 3).

use crate::worker::ToWorker;
use std::collections::VecDeque;

pub struct LaneQueue {
    tx: rtrb::Producer<ToWorker>,
    /// What the lane's queue had no room for, oldest first.
    backlog: VecDeque<ToWorker>,
}

impl LaneQueue {
    pub fn new(tx: rtrb::Producer<ToWorker>) -> Self {
        LaneQueue {
            tx,
            backlog: VecDeque::new(),
        }
    }

    /// Queues `msg` for the lane without waiting: behind what waits here already, if
    /// anything does.
    pub fn send(&mut self, msg: ToWorker) {
        self.flush();
        if !self.backlog.is_empty() {
            self.backlog.push_back(msg);
            return;
        }
        if let Err(rtrb::PushError::Full(m)) = self.tx.push(msg) {
            self.backlog.push_back(m);
        }
    }

    /// Moves what waits here into the lane's queue, as far as it has room.
    pub fn flush(&mut self) {
        while let Some(m) = self.backlog.pop_front() {
            if let Err(rtrb::PushError::Full(m)) = self.tx.push(m) {
                self.backlog.push_front(m);
                break;
            }
        }
    }

    /// The lane has not taken its messages: its queue is full and more wait here.
    pub fn stalled(&self) -> bool {
        !self.backlog.is_empty()
    }

    /// Messages waiting here.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.backlog.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_that_takes_nothing_never_holds_up_the_sender() {
        let (tx, mut rx) = rtrb::RingBuffer::new(4);
        let mut q = LaneQueue::new(tx);
        let t = std::time::Instant::now();
        for id in 0..1000 {
            q.send(ToWorker::Remove(id));
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert!(q.stalled());
        assert_eq!(q.waiting(), 996);
        // Once the lane takes its messages, they all arrive, in order.
        let mut got = Vec::new();
        while got.len() < 1000 {
            q.flush();
            while let Ok(ToWorker::Remove(id)) = rx.pop() {
                got.push(id);
            }
        }
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
        assert!(!q.stalled());
    }
}
