//! The lane context's work for one [`Session`]: fencing its releases, the fences other
//! GPUs ask of it, and its end. A child of ctx.rs (it reaches the lane's deferred frees
//! and markers) that only it and the lane loop know of, so that the lane context itself
//! does not depend on the sessions that use it.

use super::WorkerCtx;
use crate::release::cross::CrossPart;
use crate::release::given::Release;
use crate::release::peer_fence;
use crate::session::Session;
use crate::worker::free::hold;
use std::sync::atomic::Ordering;

impl WorkerCtx {
    /// Frees `release` once everything the session queued so far has finished.
    pub fn release_later(&mut self, s: &mut Session, release: Release) {
        let Some(m) = s.sync_stream(self) else {
            // Unreachable (see sync_stream); kept, never freed early: its work may run.
            tracing::error!(client = s.client.id, "no stream to fence a release on");
            return;
        };
        let left = s.left_events(self);
        // The fence's joins and its record count toward the client's depth (depth.rs):
        // frees behind a long kernel fill its streams as launches do.
        s.queued_join(self, &s.fence_streams(), left.len(), m, 1);
        self.defer(
            s.client.clone(),
            &s.fence_streams(),
            &left,
            m,
            release,
            false,
        );
    }

    /// Releases `rel` of session `s` once the client's work on every GPU it sees has
    /// passed a fence (it enabled peer access: crate::release::peer_fence).
    pub fn release_everywhere(&mut self, s: &mut Session, rel: Release) {
        let token = hold(
            &self.shared,
            &self.gpu,
            self.generation,
            &s.client,
            rel,
            false,
        );
        self.release_later(s, Release::fencing(vec![token], false));
    }

    /// Fences other GPUs asked of session `s` (crate::release::peer_fence), once its ring has been
    /// read as far as the client had written it when they asked.
    pub fn fence_for_peers(&mut self, s: &mut Session) {
        let tokens = peer_fence::take(&s.client, self.gpu.ordinal(), s.ring_position());
        if !tokens.is_empty() {
            self.release_later(s, Release::fencing(tokens, false));
        }
    }

    pub fn retire(&mut self, mut s: Session) {
        // Captures it left going end here: their streams go back clean; host functions it
        // never ran are acknowledged.
        s.end_captures(self);
        s.release_host_functions();
        let (host_nodes, host_words) = (s.take_host_nodes(), s.take_host_words());
        if !host_nodes.is_empty() || !host_words.is_empty() {
            self.dead_host_nodes
                .push((s.client.clone(), host_nodes, host_words));
        }
        let _ = self
            .shared
            .sessions
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        // Always there (see sync_stream); else one of its own streams carries the fence.
        let (m, extra) = match s.sync_stream(self) {
            Some(m) => (m, None),
            None => {
                tracing::error!(client = s.client.id, "no sync stream to fence its end on");
                let m = s.fence_streams().iter().next().unwrap_or(0);
                (m, Some(m))
            }
        };
        let (fence_streams, left) = (s.fence_streams(), s.left_events(self));
        // A profiler that was tracing stops with it.
        s.end_timing(&*self.gpu);
        // Blocks kept for its next allocations go with the rest of what it held.
        s.adopt_kept(self.kept_of(s.client.id));
        let bound = s.bound_work_streams();
        let raised_limits = !s.limits_set().is_empty();
        let (client, mut rel) = s.into_release(&self.shared);
        if raised_limits {
            rel.limits = Some(self.shared.limits.clone());
        }
        self.markers.retain(|mk| mk.client.id != client.id);
        // Fences other GPUs asked of it pass with its last work; so does, for a client with
        // peer access, what it held here, once its work on the other GPUs is done too.
        let asked = peer_fence::retire(&client, self.gpu.ordinal());
        client.forget_allocs(self.gpu.ordinal());
        if client.leaves_wait_everywhere() {
            let held = hold(&self.shared, &self.gpu, self.generation, &client, rel, true);
            let mut tokens = asked;
            tokens.push(held);
            let rel = Release::fencing(tokens, true);
            self.defer(client, &fence_streams, &left, m, rel, false);
        } else {
            rel.cross = CrossPart {
                tokens: asked,
                settles: true,
            };
            self.defer(client, &fence_streams, &left, m, rel, true);
        }
        // Only now, its fence queued: a stream given back earlier could be bound (and
        // captured) by another client before the fence joins it. Handed out again only
        // once idle.
        for i in bound {
            self.unbind_work_stream(i);
        }
        if extra.is_none() {
            self.unbind_work_stream(m);
        }
    }
}
