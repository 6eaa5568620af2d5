//! How a lane binds its clients' streams to the GPU's work streams: the pick of a work
//! stream for a client stream's first work, one held alone for a capture, and giving them
//! back. A child of ctx.rs (it reaches the lane's own counter of picks), apart from the
//! rest of the lane context so that the placement rules read on their own.

use super::WorkerCtx;
use crate::sched::placement::Binding;
use std::sync::atomic::Ordering;

impl WorkerCtx {
    /// Binds a client stream, at its first work, to a work stream of its class
    /// ([`crate::sched::placement::pick`]: no other client's work on its CUDA stream, nor on its
    /// hardware queue while the queues allow). `capped`: within the client's share of the
    /// hardware queues (all but its sync stream, which only waits for its own work). None:
    /// nothing is left to it (the caller refuses the work).
    pub fn bind_work_stream(
        &mut self,
        client: u32,
        place: crate::sched::placement::Placement,
        stream_priority: i32,
        capped: bool,
    ) -> Option<usize> {
        let c = crate::sched::placement::class_of(place.qos, stream_priority);
        let class = self.gpu.layout().class_in(place.slot, c);
        self.next_work += 1;
        let mut bindings = self.shared.bindings();
        let gpu = self.gpu.clone();
        let picked = crate::sched::placement::pick(
            &gpu.layout(),
            &bindings,
            class,
            client,
            capped.then_some(self.shared.queue_share.load(Ordering::Relaxed)),
            self.next_work,
            // A stream whose query fails (a capture left on it) is not idle.
            &mut |i| gpu.stream_query(i).unwrap_or(false),
        );
        let Some((pick, shared)) = picked else {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    client,
                    "a client's streams hold every work stream left to it \
                     (OMPS_CLIENT_QUEUES); its further streams are refused"
                )
            });
            return None;
        };
        if shared {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!("every work stream is held by other clients; sharing one")
            });
        }
        let b = &mut bindings[pick];
        if b.refs == 0 {
            b.client = client;
        }
        b.refs += 1;
        Some(pick)
    }

    /// A work stream that only this client stream will use (for a capture): `old` if it
    /// is bound to it alone, else a free idle one of its class within the client's share
    /// of the queues, bound now; None when there is none. Neither may be the last stream of
    /// its class that is not held for a capture ([`crate::sched::placement::may_capture`]).
    pub fn bind_alone(
        &mut self,
        client: u32,
        place: crate::sched::placement::Placement,
        stream_priority: i32,
        old: Option<usize>,
    ) -> Option<usize> {
        use crate::sched::placement::{may_capture, queues_held, within_share};
        let c = crate::sched::placement::class_of(place.qos, stream_priority);
        let layout = self.gpu.layout();
        let class = layout.class_in(place.slot, c);
        let mut bindings = self.shared.bindings();
        if let Some(o) = old.filter(|&o| {
            bindings.get(o).is_some_and(|b| b.refs == 1) && may_capture(&layout, &bindings, o)
        }) {
            bindings[o].exclusive = true;
            return Some(o);
        }
        let held = queues_held(&layout, &bindings, client);
        let share = self.shared.queue_share.load(Ordering::Relaxed);
        let free = class.clone().find(|&i| {
            bindings[i].refs == 0
                && within_share(&layout, &held, share, i)
                && may_capture(&layout, &bindings, i)
                && self.gpu.stream_query(i).unwrap_or(false)
        })?;
        bindings[free] = Binding {
            client,
            refs: 1,
            exclusive: true,
        };
        Some(free)
    }

    /// A client stream bound to work stream `i` is gone.
    pub fn unbind_work_stream(&mut self, i: usize) {
        let mut bindings = self.shared.bindings();
        if let Some(b) = bindings.get_mut(i) {
            b.refs = b.refs.saturating_sub(1);
            if b.refs == 0 {
                b.exclusive = false;
            }
        }
    }

    /// A capture on work stream `i` ended: it may be shared again.
    pub fn share_again(&mut self, i: usize) {
        let mut bindings = self.shared.bindings();
        if let Some(b) = bindings.get_mut(i) {
            b.exclusive = false;
        }
    }
}
