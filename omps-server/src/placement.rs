//! Where a client stream's work goes: which of the GPU's work streams carries it.
//!
//! The server owns a fixed set of CUDA streams per GPU (see [`Layout`]); a client stream is
//! bound to one of them at its first work. The driver spreads streams over the device's
//! hardware queues (`CUDA_DEVICE_MAX_CONNECTIONS`, at most 32) in creation order, and a
//! queue runs its commands in order: a stream's work can wait behind another stream's
//! pending work when both use one queue. So the binding keeps two things apart: a client
//! stream never shares a CUDA stream with another client's (that would order their work),
//! and, while it can, never shares a hardware queue with another client's either.

/// The layout of one GPU's streams: `work` normal-priority work streams, then `markers`
/// marker streams, then `priority` work streams at the device's greatest priority. Each
/// count is a multiple of `connections`, so stream `i` of every class uses hardware queue
/// `i % connections` whether the driver counts queues per class or over all streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub work: usize,
    pub markers: usize,
    pub priority: usize,
    pub connections: usize,
}

impl Layout {
    /// The server's layout: several work streams per hardware queue in each priority
    /// class, so a client with many streams (PyTorch, a hog with 40) gets a CUDA stream
    /// for each.
    pub const SERVER: Layout = Layout {
        work: 128,
        markers: 32,
        priority: 64,
        connections: 32,
    };

    pub fn total(&self) -> usize {
        self.work + self.markers + self.priority
    }

    pub fn normal(&self) -> std::ops::Range<usize> {
        0..self.work
    }

    pub fn marker_range(&self) -> std::ops::Range<usize> {
        self.work..self.work + self.markers
    }

    pub fn high(&self) -> std::ops::Range<usize> {
        let s = self.work + self.markers;
        s..s + self.priority
    }

    /// The hardware queue stream `i` uses.
    pub fn queue(&self, i: usize) -> usize {
        i % self.connections.max(1)
    }
}

/// Who holds a work stream: the client whose streams are bound to it, and how many.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Binding {
    pub client: u32,
    pub refs: u32,
}

/// Picks the work stream in `class` for a new stream of `client`, in this order:
/// 1. a stream no one holds and that is idle (a destroyed stream's last work may still run
///    there), on a queue where no other client holds a stream, fewest of the client's own
///    there first;
/// 2. such a free stream on the queue other clients use least;
/// 3. the client's own least-bound stream (more streams than the class has);
/// 4. the least-bound stream of all (more active clients than streams).
///
/// `rotate` spreads equal choices over the class; returns the stream and whether it is
/// shared with another client (case 4, which the caller reports).
pub fn pick(
    layout: &Layout,
    bindings: &[Binding],
    class: std::ops::Range<usize>,
    client: u32,
    rotate: usize,
    idle: &mut dyn FnMut(usize) -> bool,
) -> (usize, bool) {
    let n = class.len().max(1);
    let queues = layout.connections.max(1);
    // Per queue: streams held by other clients, and by this one.
    let mut others = vec![0u32; queues];
    let mut own = vec![0u32; queues];
    for i in class.clone() {
        let b = bindings[i];
        if b.refs > 0 {
            let q = layout.queue(i);
            if b.client == client {
                own[q] += 1;
            } else {
                others[q] += 1;
            }
        }
    }
    let rotated = (0..n).map(|k| class.start + (rotate + k) % n);
    let mut free: Vec<((u32, u32), usize, usize)> = rotated
        .clone()
        .enumerate()
        .filter(|&(_, i)| bindings[i].refs == 0)
        .map(|(k, i)| ((others[layout.queue(i)], own[layout.queue(i)]), k, i))
        .collect();
    free.sort_unstable();
    // Best first, so only the candidates that could win are asked whether they are idle
    // (a driver call each).
    if let Some(&(_, _, i)) = free.iter().find(|c| idle(c.2)) {
        return (i, false);
    }
    let mine = class
        .clone()
        .filter(|&i| bindings[i].refs > 0 && bindings[i].client == client)
        .min_by_key(|&i| bindings[i].refs);
    if let Some(i) = mine {
        return (i, false);
    }
    let least = rotated
        .min_by_key(|&i| bindings[i].refs)
        .unwrap_or(class.start);
    (least, true)
}

/// A set of stream indices (which streams a client's work has used).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamSet(Vec<u64>);

impl StreamSet {
    pub fn insert(&mut self, i: usize) {
        let w = i / 64;
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        self.0[w] |= 1 << (i % 64);
    }

    pub fn contains(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &bits)| {
            (0..64)
                .filter(move |b| bits & (1u64 << b) != 0)
                .map(move |b| w * 64 + b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Layout = Layout {
        work: 8,
        markers: 4,
        priority: 4,
        connections: 4,
    };

    fn bind(b: &mut [Binding], client: u32, rotate: usize) -> (usize, bool) {
        let r = pick(&L, b, L.normal(), client, rotate, &mut |_| true);
        let x = &mut b[r.0];
        if x.refs == 0 {
            x.client = client;
        }
        x.refs += 1;
        r
    }

    #[test]
    fn a_client_never_shares_a_queue_while_one_is_free_of_others() {
        let mut b = vec![Binding::default(); L.total()];
        let a0 = bind(&mut b, 1, 0).0;
        // Client 2's streams avoid client 1's queue, even though a stream on it is free.
        for r in 0..3 {
            let (s, shared) = bind(&mut b, 2, r);
            assert!(!shared);
            assert_ne!(L.queue(s), L.queue(a0), "client 2 placed on client 1's queue");
        }
        // Client 2 now holds the other three queues: its fourth stream goes onto one of its
        // own queues, on a stream of its own, rather than onto client 1's queue.
        let (s, _) = bind(&mut b, 2, 0);
        assert_ne!(L.queue(s), L.queue(a0));
        assert_eq!(b[s].refs, 1, "a CUDA stream of its own");
    }

    #[test]
    fn many_streams_of_one_client_get_a_cuda_stream_each() {
        let mut b = vec![Binding::default(); L.total()];
        let picks: Vec<usize> = (0..L.work).map(|r| bind(&mut b, 7, r).0).collect();
        let mut sorted = picks.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), L.work, "one CUDA stream per client stream");
        // Then it doubles up on its own streams, never reported as shared.
        let (_, shared) = bind(&mut b, 7, 0);
        assert!(!shared);
    }

    #[test]
    fn a_busy_free_stream_is_passed_over_and_sharing_is_the_last_resort() {
        let mut b = vec![Binding::default(); L.total()];
        // Stream 0 is unbound but still runs a destroyed stream's work.
        let (s, _) = pick(&L, &b, L.normal(), 1, 0, &mut |i| i != 0);
        assert_ne!(s, 0);
        for i in L.normal() {
            b[i] = Binding { client: 9, refs: 1 };
        }
        let (s, shared) = pick(&L, &b, L.normal(), 1, 3, &mut |_| true);
        assert!(shared && L.normal().contains(&s));
    }

    #[test]
    fn stream_sets_hold_any_index() {
        let mut s = StreamSet::default();
        for i in [0, 63, 64, 200] {
            s.insert(i);
        }
        assert!(s.contains(200) && !s.contains(1));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 63, 64, 200]);
    }
}
