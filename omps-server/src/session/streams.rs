//! A session's streams on the GPU: binding its client streams to work streams (with the
//! legacy default stream's implicit ordering), moving them to a new placement, its own
//! sync stream, and the work streams a fence waits for, including those it gave up.
//! Apart from state.rs, which holds the session, as one more family of its methods.

use super::*;

impl Session {
    /// The pool stream of client stream `id`, for questions about it (queries and
    /// synchronizing), which take no part in the legacy stream's ordering; None while
    /// nothing was ever queued on it.
    pub(super) fn stream_pool(&self, id: u32) -> Result<Option<usize>, Malformed> {
        self.streams
            .get(&id)
            .map(|s| s.pool)
            .ok_or_else(|| Malformed(format!("unknown stream {id}")))
    }

    /// The pool stream for work on client stream `id`, after the implicit ordering of
    /// the legacy default stream has been queued. None: the stream has no work stream and
    /// none is left to the client (its share of the hardware queues is taken by its own
    /// captures): the work is refused, and its next synchronization says
    /// CUDA_ERROR_OUT_OF_MEMORY, as a driver out of streams would.
    pub(super) fn stream(
        &mut self,
        ctx: &mut WorkerCtx,
        id: u32,
    ) -> Result<Option<usize>, Malformed> {
        let place = self.client.placement(self.dev);
        if place != self.placement {
            self.move_to(ctx, place);
        }
        let client = self.client.id;
        let group = self.streams.get(&id).map_or(0, |s| s.green);
        let (place, legacy_id) = self.green_place(ctx, group);
        let Some(st) = self.streams.get_mut(&id) else {
            return bad(format!("unknown stream {id}"));
        };
        let pool = match st.pool {
            Some(p) => p,
            None => match ctx.bind_work_stream(client, place, st.priority, true) {
                Some(p) => *st.pool.insert(p),
                None => {
                    self.note_error(CuError(code::OUT_OF_MEMORY));
                    return Ok(None);
                }
            },
        };
        st.submits += 1;
        let capturing = st.capturing;
        self.queued_as(ctx, pool, 1, capturing);
        self.submits += 1;
        // Work on a blocking stream is ordered after legacy work only once there is some,
        // and then the legacy stream is bound. A green context has its own legacy stream,
        // ordered against its own blocking streams only, as a context's is natively.
        let legacy = self
            .streams
            .get(&legacy_id)
            .and_then(|s| s.pool)
            .unwrap_or(pool);
        let mut r = Ok(());
        // Each order is an event record on the first stream and a wait on the second: the
        // legacy stream's side is counted as its (a mark is never recorded in a capture).
        let mut orders = Vec::new();
        if id == legacy_id {
            for b in self
                .streams
                .values_mut()
                .filter(|b| b.blocking && b.green == group)
            {
                match b.pool {
                    // A capturing stream joins no implicit ordering: it would pull the
                    // legacy stream into its graph. Each work stream is ordered once,
                    // however many client streams it carries: one record adds at most
                    // the client's share of work streams to the legacy one, never a
                    // wait per client stream (thousands, past the driver's bound).
                    Some(bp)
                        if b.dirty && bp != legacy && !b.capturing && !orders.contains(&bp) =>
                    {
                        r = r.and(ctx.order(bp, legacy));
                        orders.push(bp);
                    }
                    _ => {}
                }
                b.dirty = false;
                b.stale = true;
            }
        } else if let Some(b) = self.streams.get_mut(&id).filter(|b| b.blocking) {
            if b.stale && pool != legacy && !b.capturing {
                r = ctx.order(legacy, pool);
                orders.push(pool);
            }
            b.stale = false;
            b.dirty = true;
        }
        for other in orders {
            // Never a capturing stream (skipped above).
            self.queued_as(ctx, other, 1, false);
            self.queued(ctx, legacy_id, legacy, 1);
        }
        if let Err(e) = r {
            self.note_error(e);
        }
        Ok(Some(pool))
    }

    /// Moves every bound stream to the client's new placement (QoS class, SM confinement):
    /// later work goes to a work stream there, after what the old one still holds.
    pub(super) fn move_to(&mut self, ctx: &mut WorkerCtx, place: placement::Placement) {
        // Launches gathered on the old work streams go there first, before the ordering
        // events that make the new ones wait for them (kinds/launch_run.rs).
        self.flush_run(ctx);
        self.placement = place;
        let greens: HashMap<u32, placement::Placement> = self
            .greens
            .keys()
            .map(|&g| (g, self.green_place(ctx, g).0))
            .collect();
        let mut r = Ok(());
        for st in self.streams.values_mut() {
            // A capturing stream stays where its capture is.
            let Some(old) = st.pool.filter(|_| !st.capturing) else {
                continue;
            };
            let place = greens.get(&st.green).copied().unwrap_or(place);
            // Nothing left to it there: the stream stays where it is.
            let Some(new) = ctx.bind_work_stream(self.client.id, place, st.priority, true) else {
                continue;
            };
            r = r.and(ctx.order(old, new));
            ctx.unbind_work_stream(old);
            st.pool = Some(new);
        }
        if let Err(e) = r {
            self.note_error(e);
        }
    }

    /// The work streams this client's streams are bound to, one entry per binding.
    pub fn bound_work_streams(&self) -> Vec<usize> {
        self.streams
            .values()
            .chain(&self.parked)
            .filter_map(|s| s.pool)
            .collect()
    }

    /// The stream its synchronizations and fences wait on: a work stream of its own,
    /// bound at the first. Event and context synchronizations make it wait for the client's
    /// work, then write the done word; a shared marker stream would make one client's
    /// synchronization wait behind another's long kernel (the stream runs its waits in
    /// order), so each client has its own, placed like its work streams.
    /// It takes no part in the client's share of the queues: it holds only waits for the
    /// client's own work. None only if every stream of its class were held for captures,
    /// which captures never do (placement::may_capture).
    pub fn sync_stream(&mut self, ctx: &mut WorkerCtx) -> Option<usize> {
        if self.sync.is_none() {
            self.sync = ctx.bind_work_stream(self.client.id, self.placement, 0, false);
        }
        self.sync
    }

    /// The work streams a fence or a context synchronization of this client waits for:
    /// those it holds now, but none being captured (waiting on one would pull the sync
    /// stream into the client's graph). Work of streams it gave up is covered by `left`.
    pub fn fence_streams(&self) -> crate::sched::placement::StreamSet {
        let mut set = crate::sched::placement::StreamSet::default();
        for st in self.streams.values().filter(|s| !s.capturing) {
            if let Some(p) = st.pool {
                set.insert(p);
            }
        }
        set
    }

    /// Events marking the last work of streams the client gave up, still unfinished: a
    /// fence waits for them without touching the streams, which may be someone else's now.
    pub fn left_events(&mut self, ctx: &WorkerCtx) -> Vec<u64> {
        self.left.retain(|&e| {
            let done = ctx.gpu.event_query(e).unwrap_or(true);
            if done {
                let _ = ctx.gpu.event_destroy(e);
            }
            !done
        });
        self.left.clone()
    }

    /// Gives up work stream `pool` of a client stream, remembering its last work.
    pub(crate) fn leave_pool(&mut self, ctx: &mut WorkerCtx, pool: usize) {
        self.remember_last_work(ctx, pool);
        ctx.unbind_work_stream(pool);
    }

    /// Remembers the work queued on `pool` so far among the work fences wait for (`left`),
    /// for a stream that fences no longer join: one it gives up, or one a capture takes.
    pub(super) fn remember_last_work(&mut self, ctx: &mut WorkerCtx, pool: usize) {
        match ctx.gpu.event_create(0x2) {
            Ok(ev) if ctx.gpu.event_record(ev, pool).is_ok() => {
                // An operation of the stream (session/depth.rs).
                self.queued_as(ctx, pool, 1, false);
                self.left.push(ev)
            }
            Ok(ev) => {
                let _ = ctx.gpu.event_destroy(ev);
            }
            Err(_) => {}
        }
        if self.left.len() > MAX_LEFT {
            self.fold_left(ctx);
        }
    }

    /// Events of work fences wait for besides the streams they join (tests).
    #[cfg(test)]
    pub(crate) fn left_len(&self) -> usize {
        self.left.len()
    }

    /// Streams given up behind work that does not end (a client creating and destroying
    /// streams in a loop) would each leave a driver event, scanned at every fence: past
    /// [`MAX_LEFT`] unfinished ones, the client's sync stream waits for them all and one
    /// event recorded there stands for them. The sync stream carries only waits that
    /// cover that work anyway (fences, context synchronizations).
    pub(super) fn fold_left(&mut self, ctx: &mut WorkerCtx) {
        self.left_events(ctx);
        if self.left.len() <= MAX_LEFT / 2 {
            return;
        }
        let Some(m) = self.sync_stream(ctx) else {
            return;
        };
        let gpu = ctx.gpu.clone();
        let Ok(one) = gpu.event_create(0x2) else {
            return;
        };
        // The waits and the record are operations of the sync stream: counted, so that a
        // client giving up stream after stream behind work that does not end is held
        // back (session/depth.rs) before the sync stream reaches the driver's bound and
        // the worker would wait in the driver for every client of the lane.
        self.queued_as(ctx, m, self.left.len() as u32 + 1, false);
        let joined = self
            .left
            .iter()
            .try_for_each(|&e| gpu.stream_wait_event(m, e))
            .and_then(|()| gpu.event_record(one, m));
        if joined.is_err() {
            let _ = gpu.event_destroy(one);
            return;
        }
        for e in std::mem::replace(&mut self.left, vec![one]) {
            // The wait is queued: the event may go.
            let _ = gpu.event_destroy(e);
        }
    }
}
