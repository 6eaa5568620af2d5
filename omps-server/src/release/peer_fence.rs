//! What a client with peer access frees waits for its work on every GPU it sees.
//!
//! Once a client has enabled direct peer access, a kernel of its on GPU B may read or
//! write memory its session on GPU A holds. A free on A fenced only against the client's
//! work on A could then hand the memory to another client while B's kernel still uses it.
//! So such a release is held by a [`CrossRelease`]: A's worker fences its own work, every
//! other GPU's worker that serves the client fences the client's work there, and the last
//! fence to pass frees the memory on A as A's worker would have. B's worker takes the
//! request from the client's [`CrossQueue`] for B once it has read the client's ring for B
//! as far as the client had written it when A's worker read the free: a kernel queued on
//! B before the free is then queued before B's fence. (The position is the client's word;
//! a client that lies about it delays only its own frees, at most until it is gone.)
//!
//! A session that ends moves its queue to `Retired`: requests that arrive then wait for
//! the fence of the session's last work, and once that fence passes (`settle`) the queue is
//! `Released` and requests are answered at once. Only a fence passing moves a queue on, so
//! two GPUs' final releases that wait on each other's queues cannot wait in a circle.

use crate::client::ClientShared;
use crate::release::cross::{CrossPart, CrossQueue, CrossRelease};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Asks GPU `g`'s worker to fence `client`'s work there for `token`.
pub fn ask(client: &ClientShared, g: usize, token: &Arc<CrossRelease>) {
    let Some(q) = client.cross.get(g) else {
        return token.done();
    };
    let mut q = q.lock().unwrap_or_else(|e| e.into_inner());
    match &mut *q {
        CrossQueue::Open(v) => {
            v.push((token.clone(), client.ring_tail(g)));
            client.cross_waiting[g].store(true, Ordering::Release);
        }
        CrossQueue::Retired(v) => v.push(token.clone()),
        CrossQueue::Released => {
            drop(q);
            token.done();
        }
    }
}

/// The requests waiting for this GPU's worker (`g`) that its reading of the client's ring
/// (up to `read`) has caught up with.
pub fn take(client: &ClientShared, g: usize, read: u64) -> Vec<Arc<CrossRelease>> {
    // Read before it is cleared: on every pass of every session, a write would bounce
    // the line between workers. SYNC POINT: pairs with the Release store in `ask`; the
    // queue's lock orders the rest.
    if !client.cross_waiting[g].load(Ordering::Relaxed)
        || !client.cross_waiting[g].swap(false, Ordering::Acquire)
    {
        return Vec::new();
    }
    let mut q = client.cross[g].lock().unwrap_or_else(|e| e.into_inner());
    let CrossQueue::Open(v) = &mut *q else {
        return Vec::new();
    };
    let (ready, later): (Vec<_>, Vec<_>) = std::mem::take(v)
        .into_iter()
        .partition(|&(_, until)| until.wrapping_sub(read) as i64 <= 0);
    if !later.is_empty() {
        client.cross_waiting[g].store(true, Ordering::Relaxed);
    }
    *v = later;
    ready.into_iter().map(|(t, _)| t).collect()
}

/// The session on GPU `g` starts: requests go to its worker.
pub fn open(client: &ClientShared, g: usize) {
    if let Some(q) = client.cross.get(g) {
        let mut q = q.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(*q, CrossQueue::Released) {
            *q = CrossQueue::Open(Vec::new());
        }
    }
}

/// The session on GPU `g` ends: what was asked of it so far goes with its final release
/// (returned), and what is asked from now on waits for that release's fence.
pub fn retire(client: &ClientShared, g: usize) -> Vec<Arc<CrossRelease>> {
    let Some(q) = client.cross.get(g) else {
        return Vec::new();
    };
    let mut q = q.lock().unwrap_or_else(|e| e.into_inner());
    match std::mem::replace(&mut *q, CrossQueue::Retired(Vec::new())) {
        CrossQueue::Open(v) => v.into_iter().map(|(t, _)| t).collect(),
        CrossQueue::Retired(v) => {
            *q = CrossQueue::Retired(v);
            Vec::new()
        }
        CrossQueue::Released => {
            *q = CrossQueue::Released;
            Vec::new()
        }
    }
}

/// The fence of the session's last work on GPU `g` has passed.
pub fn settle(client: &ClientShared, g: usize) {
    let Some(q) = client.cross.get(g) else {
        return;
    };
    let waiting = {
        let mut q = q.lock().unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(&mut *q, CrossQueue::Released) {
            CrossQueue::Open(v) => v.into_iter().map(|(t, _)| t).collect(),
            CrossQueue::Retired(v) => v,
            CrossQueue::Released => Vec::new(),
        }
    };
    for t in waiting {
        t.done();
    }
}

/// A release's fence (its part `part`) has passed on `g`.
pub fn passed(part: CrossPart, client: &ClientShared, g: usize) {
    if part.settles {
        settle(client, g);
    }
    for t in part.tokens {
        t.done();
    }
}
