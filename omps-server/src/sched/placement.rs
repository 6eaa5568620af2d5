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
mod tests;
