//! Where a client stream's work goes: which of the GPU's work streams carries it.
//!
//! The server owns a fixed set of CUDA streams per GPU (see [`Layout`]); a client stream is
//! bound to one of them at its first work. The driver spreads streams over the device's
//! hardware queues (`CUDA_DEVICE_MAX_CONNECTIONS`, at most 32) in creation order, and a
//! queue runs its commands in order: a stream's work can wait behind another stream's
//! pending work when both use one queue. So the binding keeps two things apart: a client
//! stream never shares a CUDA stream with another client's (that would order their work),
//! and, while it can, never shares a hardware queue with another client's either.

/// What a client asked for, or an operator set: its share of the GPU's attention.
/// `CUDA_MPS_CLIENT_PRIORITY` gives the first two; latency-critical is omps's own.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Qos {
    #[default]
    Normal = 0,
    BelowNormal = 1,
    LatencyCritical = 2,
}

impl Qos {
    pub fn from_u8(v: u8) -> Option<Qos> {
        match v {
            0 => Some(Qos::Normal),
            1 => Some(Qos::BelowNormal),
            2 => Some(Qos::LatencyCritical),
            _ => None,
        }
    }

    /// As omps-ctl and the environment spell it: MPS's 0 and 1, and `latency-critical`
    /// (or `lc`, or 2).
    pub fn parse(s: &str) -> Option<Qos> {
        match s {
            "0" | "normal" => Some(Qos::Normal),
            "1" | "below-normal" | "below_normal" => Some(Qos::BelowNormal),
            "2" | "latency-critical" | "latency_critical" | "lc" => Some(Qos::LatencyCritical),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Qos::Normal => "normal",
            Qos::BelowNormal => "below-normal",
            Qos::LatencyCritical => "latency-critical",
        }
    }
}

/// The stream priority classes, least urgent first. Every client stream runs on a work
/// stream of one class; the GPU's block scheduler starts a waiting block of a more urgent
/// stream before any of a less urgent one, which, all clients sharing one context, holds
/// across clients (under MPS it cannot: priorities order streams within one context).
pub const CLASSES: usize = 4;
/// A below-normal client's streams.
pub const BACKGROUND: usize = 0;
/// A normal client's streams.
pub const NORMAL: usize = 1;
/// A normal client's streams created with a priority above the lowest (PyTorch's
/// high-priority streams, NCCL's).
pub const RAISED: usize = 2;
/// A latency-critical client's streams, all of them.
pub const CRITICAL: usize = 3;

/// The class a client stream's work runs in.
pub fn class_of(qos: Qos, stream_priority: i32) -> usize {
    match qos {
        Qos::LatencyCritical => CRITICAL,
        Qos::BelowNormal => BACKGROUND,
        Qos::Normal if stream_priority < 0 => RAISED,
        Qos::Normal => NORMAL,
    }
}

/// The CUDA priority of class `c` on a device whose range is `least..=greatest`
/// (greatest is the more negative): spread evenly, the classes keep their order where
/// the device has enough levels (an H100 has 6).
pub fn class_priority(c: usize, least: i32, greatest: i32) -> i32 {
    let span = (least - greatest).max(0) as f64;
    least - (span * c as f64 / (CLASSES - 1) as f64).round() as i32
}

/// CU_LAUNCH_ATTRIBUTE_PRIORITY: a kernel's own priority, over its stream's.
const LAUNCH_ATTR_PRIORITY: u32 = 8;

/// Launch attributes (72-byte records, as on the wire) with any kernel priority held to
/// `floor..=least`: a kernel may be less urgent than its work stream's class, never more,
/// so no client lifts its launches over its QoS class (issue 23, review).
pub fn hold_launch_priority(attrs: &[u8], floor: i32, least: i32) -> std::borrow::Cow<'_, [u8]> {
    let n = omps_ring::wire::LAUNCH_ATTR_BYTES;
    let asks = |a: &[u8]| u32::from_le_bytes([a[0], a[1], a[2], a[3]]) == LAUNCH_ATTR_PRIORITY;
    if !attrs.chunks_exact(n).any(asks) || floor > least {
        return std::borrow::Cow::Borrowed(attrs);
    }
    let mut own = attrs.to_vec();
    for a in own.chunks_exact_mut(n).filter(|a| asks(a)) {
        let v = i32::from_le_bytes([a[8], a[9], a[10], a[11]]);
        a[8..12].copy_from_slice(&v.clamp(floor, least).to_le_bytes());
    }
    std::borrow::Cow::Owned(own)
}

/// The layout of one GPU's streams: each class's work streams in class order (on the whole device), then, per confinement slot
/// ([`crate::sched::confine`]), `confined_per_class` streams of each class in that slot's green
/// context, made at first use. Each count is a multiple of `connections`, so stream `i`
/// uses hardware queue `i % connections` whether the driver counts queues per priority or
/// over all streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub classes: [usize; CLASSES],
    pub connections: usize,
    pub confined: usize,
    pub confined_per_class: usize,
}

impl Layout {
    /// The server's layout: several work streams per hardware queue in the normal class,
    /// so a client with many streams (PyTorch, a hog with 40) gets a CUDA stream for each.
    pub const SERVER: Layout = Layout {
        classes: [64, 128, 64, 64],
        connections: 32,
        confined: 32,
        confined_per_class: 32,
    };

    /// Whole-device work streams, made when the context is.
    pub fn base(&self) -> usize {
        self.classes.iter().sum::<usize>()
    }

    pub fn total(&self) -> usize {
        self.base() + self.confined * CLASSES * self.confined_per_class
    }

    /// The whole-device work streams of class `c`; an empty class falls back to the
    /// normal one.
    pub fn class(&self, c: usize) -> std::ops::Range<usize> {
        let c = if self.classes.get(c).copied().unwrap_or(0) == 0 {
            NORMAL
        } else {
            c
        };
        let start = self.classes[..c].iter().sum::<usize>();
        start..start + self.classes[c]
    }

    /// The work streams of class `c` in confinement `slot`, or on the whole device.
    pub fn class_in(&self, slot: Option<usize>, c: usize) -> std::ops::Range<usize> {
        match slot {
            Some(s) if s < self.confined && c < CLASSES => {
                let start = self.base() + (s * CLASSES + c) * self.confined_per_class;
                start..start + self.confined_per_class
            }
            _ => self.class(c),
        }
    }

    /// The class of stream `i`, None beyond the last.
    pub fn class_at(&self, i: usize) -> Option<usize> {
        if i >= self.base() {
            return (i < self.total())
                .then(|| (i - self.base()) / self.confined_per_class.max(1) % CLASSES);
        }
        (0..CLASSES).find(|&c| self.class(c).contains(&i) && self.classes[c] > 0)
    }

    /// The confinement slot of stream `i`, None on the whole device.
    pub fn slot_at(&self, i: usize) -> Option<usize> {
        (i >= self.base() && i < self.total())
            .then(|| (i - self.base()) / (CLASSES * self.confined_per_class.max(1)))
    }

    /// The class range (of its confinement, or of the whole device) stream `i` belongs to.
    pub fn range_of(&self, i: usize) -> Option<std::ops::Range<usize>> {
        Some(self.class_in(self.slot_at(i), self.class_at(i)?))
    }

    /// The hardware queue stream `i` uses.
    pub fn queue(&self, i: usize) -> usize {
        i % self.connections.max(1)
    }
}

/// Where a client's work runs: its QoS and its confinement slot, if any. Packed into one
/// word that the control thread publishes and the workers compare at each piece of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Placement {
    pub qos: Qos,
    pub slot: Option<usize>,
}

impl Placement {
    pub fn pack(self) -> u32 {
        self.qos as u32 | (self.slot.map_or(0, |s| s as u32 + 1) << 8)
    }

    pub fn unpack(v: u32) -> Placement {
        Placement {
            qos: Qos::from_u8(v as u8).unwrap_or_default(),
            slot: match v >> 8 {
                0 => None,
                s => Some(s as usize - 1),
            },
        }
    }
}

/// Who holds a work stream: the client whose streams are bound to it, and how many.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Binding {
    pub client: u32,
    pub refs: u32,
    /// Held by one client stream alone (a capture): never shared, by anyone.
    pub exclusive: bool,
}

/// Hardware queues one client may hold work streams on: `asked` (the server's
/// `OMPS_CLIENT_QUEUES`), by default half of them, so a client whose streams all wait
/// forever (host functions it never acknowledges) leaves the other half to everyone else.
pub fn queue_share(layout: &Layout, asked: Option<usize>) -> usize {
    let queues = layout.connections.max(1);
    asked.unwrap_or(queues / 2).clamp(1, queues)
}

/// The hardware queues `client` holds a work stream on, in any class or confinement (the
/// driver may count queues over all streams, so one class's queue is another's too).
pub fn queues_held(layout: &Layout, bindings: &[Binding], client: u32) -> Vec<bool> {
    let mut held = vec![false; layout.connections.max(1)];
    for (i, b) in bindings.iter().enumerate() {
        if b.refs > 0 && b.client == client {
            held[layout.queue(i)] = true;
        }
    }
    held
}

/// Whether `client`, holding `held`, may bind a stream on the queue of stream `i`: any queue
/// while it holds fewer than `share`, then only those it holds. A stream that waits forever
/// holds up its whole queue; capped, a client can block no more than its share.
pub fn within_share(layout: &Layout, held: &[bool], share: usize, i: usize) -> bool {
    held.iter().filter(|&&h| h).count() < share.max(1) || held[layout.queue(i)]
}

/// Whether stream `i` may be held for a capture: some other stream of its class range stays
/// shareable, so a stream can always be bound without entering anyone's capture.
pub fn may_capture(layout: &Layout, bindings: &[Binding], i: usize) -> bool {
    layout
        .range_of(i)
        .is_some_and(|r| r.into_iter().any(|j| j != i && !bindings[j].exclusive))
}

/// Picks the work stream in `class` for a new stream of `client`, in this order:
/// 1. a stream no one holds and that is idle (a destroyed stream's last work may still run
///    there), on a queue where no other client holds a stream, fewest of the client's own
///    there first;
/// 2. such a free stream on the queue other clients use least;
/// 3. the client's own least-bound stream (more streams than the class has);
/// 4. the least-bound stream of all (more active clients than streams).
///
/// With `share` (see [`queue_share`]), a client holding streams on that many queues gets
/// streams on those queues only. A stream held for a capture is never picked: a capture
/// takes in whatever is queued on its stream, so another client's work there would enter
/// the capturing client's graph (and its synchronization never return).
///
/// `rotate` spreads equal choices over the class; returns the stream and whether it is
/// shared with another client (case 4, which the caller reports), or None when the
/// client's share leaves it nothing (the caller refuses the work).
#[allow(clippy::too_many_arguments)]
pub fn pick(
    layout: &Layout,
    bindings: &[Binding],
    class: std::ops::Range<usize>,
    client: u32,
    share: Option<usize>,
    rotate: usize,
    idle: &mut dyn FnMut(usize) -> bool,
) -> Option<(usize, bool)> {
    let n = class.len().max(1);
    let queues = layout.connections.max(1);
    let held = queues_held(layout, bindings, client);
    let allowed = |i: usize| share.is_none_or(|s| within_share(layout, &held, s, i));
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
        .filter(|&(_, i)| bindings[i].refs == 0 && allowed(i))
        .map(|(k, i)| ((others[layout.queue(i)], own[layout.queue(i)]), k, i))
        .collect();
    free.sort_unstable();
    // Best first, so only the candidates that could win are asked whether they are idle
    // (a driver call each).
    if let Some(&(_, _, i)) = free.iter().find(|c| idle(c.2)) {
        return Some((i, false));
    }
    let mine = class
        .clone()
        .filter(|&i| bindings[i].refs > 0 && bindings[i].client == client)
        .filter(|&i| !bindings[i].exclusive)
        .min_by_key(|&i| bindings[i].refs);
    if let Some(i) = mine {
        return Some((i, false));
    }
    // Sharing a stream on a queue the client already holds exposes no one further: a wait
    // on that queue holds up all its streams anyway.
    rotated
        .filter(|&i| !bindings[i].exclusive && allowed(i))
        .min_by_key(|&i| bindings[i].refs)
        .map(|i| (i, true))
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

    pub fn remove_all(&mut self, ids: &[usize]) {
        for &i in ids {
            if let Some(w) = self.0.get_mut(i / 64) {
                *w &= !(1 << (i % 64));
            }
        }
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
        classes: [4, 8, 4, 4],
        connections: 4,
        confined: 2,
        confined_per_class: 4,
    };

    fn bind(b: &mut [Binding], client: u32, rotate: usize) -> (usize, bool) {
        let r = pick(&L, b, L.class(NORMAL), client, None, rotate, &mut |_| true)
            .expect("uncapped, nothing captured");
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
            assert_ne!(
                L.queue(s),
                L.queue(a0),
                "client 2 placed on client 1's queue"
            );
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
        let picks: Vec<usize> = L.class(NORMAL).map(|r| bind(&mut b, 7, r).0).collect();
        let mut sorted = picks.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            L.classes[NORMAL],
            "one CUDA stream per client stream"
        );
        // Then it doubles up on its own streams, never reported as shared.
        let (_, shared) = bind(&mut b, 7, 0);
        assert!(!shared);
    }

    #[test]
    fn a_busy_free_stream_is_passed_over_and_sharing_is_the_last_resort() {
        let mut b = vec![Binding::default(); L.total()];
        // Stream 0 is unbound but still runs a destroyed stream's work.
        let (s, _) = pick(&L, &b, L.class(NORMAL), 1, None, 0, &mut |i| {
            i != L.class(NORMAL).start
        })
        .unwrap();
        assert_ne!(s, L.class(NORMAL).start);
        for i in L.class(NORMAL) {
            b[i] = Binding {
                client: 9,
                refs: 1,
                exclusive: false,
            };
        }
        let (s, shared) = pick(&L, &b, L.class(NORMAL), 1, None, 3, &mut |_| true).unwrap();
        assert!(shared && L.class(NORMAL).contains(&s));
        // A stream held for a capture is never handed to anyone else.
        for i in L.class(NORMAL) {
            b[i].exclusive = i != L.class(NORMAL).start;
        }
        for r in 0..8 {
            let (s, _) = pick(&L, &b, L.class(NORMAL), 1, None, r, &mut |_| true).unwrap();
            assert_eq!(s, L.class(NORMAL).start);
        }
        // Every one held for a capture: nothing is picked, rather than a capturing stream.
        b[L.class(NORMAL).start].exclusive = true;
        for r in 0..8 {
            assert_eq!(
                pick(&L, &b, L.class(NORMAL), 1, None, r, &mut |_| true),
                None,
                "a capturing stream was handed to another client"
            );
        }
    }

    #[test]
    fn the_last_shareable_stream_of_a_class_is_never_captured() {
        let mut b = vec![Binding::default(); L.total()];
        let class = L.class(NORMAL);
        for i in class.clone().skip(1) {
            assert!(may_capture(&L, &b, i));
            b[i] = Binding {
                client: 9,
                refs: 1,
                exclusive: true,
            };
        }
        assert!(!may_capture(&L, &b, class.start));
        // Confined ranges are kept apart from the whole device's.
        let r = L.class_in(Some(1), NORMAL);
        assert_eq!(L.range_of(r.start + 1), Some(r.clone()));
        assert!(may_capture(&L, &b, r.start));
    }

    #[test]
    fn a_client_holds_no_more_queues_than_its_share() {
        let mut b = vec![Binding::default(); L.total()];
        let share = Some(2);
        let bind_capped = |b: &mut [Binding], client: u32, r: usize| {
            let got = pick(&L, b, L.class(NORMAL), client, share, r, &mut |_| true);
            if let Some((s, _)) = got {
                if b[s].refs == 0 {
                    b[s].client = client;
                }
                b[s].refs += 1;
            }
            got
        };
        // A client with more streams than queues (each stuck on a host function) stays on
        // two of the four queues.
        for r in 0..12 {
            bind_capped(&mut b, 1, r).expect("its own queues have room");
        }
        let held = queues_held(&L, &b, 1);
        assert_eq!(held.iter().filter(|&&h| h).count(), 2);
        // A newcomer gets a queue the first does not hold.
        let (s, shared) = bind_capped(&mut b, 2, 0).unwrap();
        assert!(
            !shared && !held[L.queue(s)],
            "the newcomer shares a blocked queue"
        );
        // Its own queues all captured, a capped client is refused rather than moved onto
        // another's queue.
        for (i, x) in b.iter_mut().enumerate() {
            if x.client == 1 && x.refs > 0 {
                x.exclusive = true;
                x.refs = 1;
            } else if held[L.queue(i)] && L.class(NORMAL).contains(&i) {
                *x = Binding {
                    client: 1,
                    refs: 1,
                    exclusive: true,
                };
            }
        }
        assert_eq!(
            pick(&L, &b, L.class(NORMAL), 1, share, 0, &mut |_| true),
            None
        );
    }

    #[test]
    fn classes_keep_their_order_in_cuda_priorities() {
        // An H100: 0 (least) to -5 (greatest).
        let p: Vec<i32> = (0..CLASSES).map(|c| class_priority(c, 0, -5)).collect();
        assert_eq!(p, vec![0, -2, -3, -5]);
        assert_eq!(class_priority(CRITICAL, 0, 0), 0, "no levels: all equal");
    }

    #[test]
    fn a_kernels_own_priority_is_never_above_its_class() {
        let attr = |id: u32, v: i32| {
            let mut a = vec![0u8; omps_ring::wire::LAUNCH_ATTR_BYTES];
            a[..4].copy_from_slice(&id.to_le_bytes());
            a[8..12].copy_from_slice(&v.to_le_bytes());
            a
        };
        let prio = |b: &[u8], i: usize| {
            let a = &b[i * omps_ring::wire::LAUNCH_ATTR_BYTES..];
            i32::from_le_bytes([a[8], a[9], a[10], a[11]])
        };
        // A background client (its class at -1 of 0..=-5) asks for -5, the greatest.
        let mut attrs = attr(2, 7);
        attrs.extend(attr(LAUNCH_ATTR_PRIORITY, -5));
        let held = hold_launch_priority(&attrs, -1, 0);
        assert_eq!(prio(&held, 1), -1, "held to its class");
        assert_eq!(prio(&held, 0), 7, "other attributes untouched");
        // Less urgent than its class is its to ask; out of range is brought back.
        assert_eq!(
            prio(
                &hold_launch_priority(&attr(LAUNCH_ATTR_PRIORITY, 0), -1, 0),
                0
            ),
            0
        );
        assert_eq!(
            prio(
                &hold_launch_priority(&attr(LAUNCH_ATTR_PRIORITY, 9), -1, 0),
                0
            ),
            0
        );
        // No priority asked: the same bytes, not a copy.
        let plain = attr(2, 7);
        assert!(matches!(
            hold_launch_priority(&plain, -1, 0),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(class_of(Qos::LatencyCritical, 0), CRITICAL);
        assert_eq!(class_of(Qos::BelowNormal, -5), BACKGROUND);
        assert_eq!(class_of(Qos::Normal, -1), RAISED);
        assert_eq!(class_of(Qos::Normal, 0), NORMAL);
        let l = Layout::SERVER;
        assert_eq!(l.class_at(l.class(CRITICAL).start), Some(CRITICAL));
        assert_eq!(l.class_at(0), Some(BACKGROUND));
        assert_eq!(l.class_at(l.total()), None);
        for c in 0..CLASSES {
            assert_eq!(l.class(c).start % l.connections, 0);
            let r = l.class_in(Some(3), c);
            assert_eq!(r.start % l.connections, 0);
            assert_eq!(
                (l.class_at(r.start), l.slot_at(r.end - 1)),
                (Some(c), Some(3))
            );
        }
        assert_eq!(l.slot_at(l.class(NORMAL).start), None);
        assert_eq!(
            l.class_in(Some(l.confined), NORMAL),
            l.class(NORMAL),
            "no such slot"
        );
        for p in [
            Placement::default(),
            Placement {
                qos: Qos::LatencyCritical,
                slot: Some(0),
            },
            Placement {
                qos: Qos::BelowNormal,
                slot: Some(31),
            },
        ] {
            assert_eq!(Placement::unpack(p.pack()), p);
        }
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
