//! Streams and events: creation, ordering, and the synchronizing calls and queries.

use super::*;

/// Host nodes on pinned words (HostNodeAt) one client's graphs may hold: a dead client's
/// are acknowledged on every worker pass.
const MAX_HOST_WORDS: usize = 1 << 16;

impl Session {
    /// Client stream `id`, made in green context `green` (0: none).
    pub(super) fn new_stream(
        &mut self,
        id: u32,
        flags: u32,
        priority: i32,
        green: u32,
    ) -> Result<(), Malformed> {
        if id == wire::STREAM_DEFAULT || self.streams.contains_key(&id) {
            return bad(format!("stream id {id} reused"));
        }
        // The welcome told the shim the bound (it refuses beyond): a lie.
        if self.streams.len() > self.client.max_streams() {
            return bad("more streams than its welcome allowed (OMPS_MAX_STREAMS)");
        }
        const NON_BLOCKING: u32 = 1;
        let mut st = ClientStream::new(priority, flags & NON_BLOCKING == 0);
        st.green = green;
        self.streams.insert(id, st);
        Ok(())
    }

    pub(super) fn destroy_stream(&mut self, ctx: &mut WorkerCtx, id: u32) -> Result<(), Malformed> {
        if id == wire::STREAM_DEFAULT {
            return bad("destroying the default stream");
        }
        let gpu = ctx.gpu.clone();
        if self
            .streams
            .get(&id)
            .is_some_and(|s| s.capturing && !s.origin)
        {
            // A stream the capture forked into (graphMemoryNodes destroys one after it
            // joined back): natively the capture goes on, and ending it here would
            // invalidate it. Its work stream stays in the capture until the origin ends.
            let st = self.streams.remove(&id).expect("looked up above");
            self.parked.push(st);
            return Ok(());
        }
        if self.streams.get(&id).is_some_and(|s| s.capturing) {
            if !self.cond.is_capturing_into(id) {
                self.end_body_captures(ctx);
            }
            if let Some(pool) = self.streams.get(&id).and_then(|s| s.pool) {
                self.abandon_capture(&*gpu, pool);
            }
            self.refresh_capture_flags(ctx);
            self.prune_homes(ctx);
        }
        match self.streams.remove(&id) {
            // Its queued work still runs; the pool stream is handed to another
            // client only once it is idle (WorkerCtx::bind_work_stream), and this
            // client's fences wait for that work through an event (leave_pool).
            // Its depth marks stay with the work stream's (depth.rs): they pass with its
            // work.
            Some(st) => {
                if let Some(p) = st.pool {
                    self.leave_pool(ctx, p);
                }
                Ok(())
            }
            None => bad(format!("destroying unknown stream {id}")),
        }
    }

    pub(super) fn handle_sync(
        &mut self,
        ctx: &mut WorkerCtx,
        op: Op,
        p: &[u8],
        tail: &[u8],
    ) -> Result<(), Malformed> {
        let gpu = ctx.gpu.clone();
        match op {
            Op::StreamCreate => {
                let c = rec::<wire::StreamCreate>(p);
                self.new_stream(c.id, c.flags, c.priority, 0)?;
            }
            Op::StreamDestroy => {
                let h = rec::<wire::Handle>(p);
                self.destroy_stream(ctx, h.id)?;
            }
            Op::EventCreate => {
                let c = rec::<wire::EventCreate>(p);
                if self.events.contains_key(&c.id) {
                    return bad(format!("event id {} reused", c.id));
                }
                if self.events.len() >= self.client.max_events() {
                    return bad("more events than its welcome allowed (OMPS_MAX_EVENTS)");
                }
                match gpu.event_create(c.flags) {
                    Ok(e) => {
                        self.events.insert(c.id, e);
                    }
                    Err(e) => self.note_error(e),
                }
            }
            Op::EventDestroy => {
                let h = rec::<wire::Handle>(p);
                let e = self
                    .events
                    .remove(&h.id)
                    .ok_or_else(|| Malformed(format!("destroying unknown event {}", h.id)))?;
                // The driver defers the release of a recorded event until it completes. An
                // event shared through IPC goes with its last user.
                let last = ctx
                    .shared
                    .ipc
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .release_event(e);
                if last {
                    let _ = gpu.event_destroy(e);
                }
            }
            Op::EventRecord | Op::EventRecordExternal => {
                let r = rec::<wire::EventRecord>(p);
                let e = self.event(r.event)?;
                let Some(s) = self.stream(ctx, r.stream)? else {
                    return Ok(());
                };
                let done = if op == Op::EventRecord {
                    gpu.event_record(e, s)
                } else {
                    gpu.event_record_external(e, s)
                };
                if let Err(err) = done {
                    self.note_error(err);
                }
            }
            Op::StreamWaitEvent | Op::StreamWaitEventExternal => {
                let r = rec::<wire::EventRecord>(p);
                let e = self.event(r.event)?;
                let forks = self.capturing > 0
                    && self.captured_events.contains(&r.event)
                    && !self.streams.get(&r.stream).is_some_and(|st| st.capturing);
                if forks {
                    // The wait forks a capture into this stream: it needs a work stream
                    // of its own first, or other streams' work on it enters the graph.
                    if let Err(code) = self.bind_exclusive(ctx, r.stream)? {
                        self.note_error(CuError(code));
                        return Ok(());
                    }
                }
                let Some(s) = self.stream(ctx, r.stream)? else {
                    return Ok(());
                };
                let done = if op == Op::StreamWaitEvent {
                    gpu.stream_wait_event(s, e)
                } else {
                    gpu.stream_wait_event_external(s, e)
                };
                if let Err(err) = done {
                    self.note_error(err);
                }
                if self.capturing > 0 {
                    // Waiting on a capturing stream's event forks the capture into this one.
                    self.refresh_capture_flags(ctx);
                }
            }
            Op::HostFunc => {
                let h = rec::<wire::HostFunc>(p);
                let client = self.client.clone();
                let Some(slot) = client.seg.hostfn(h.slot as usize) else {
                    return bad(format!("host function slot {} out of range", h.slot));
                };
                let Some(s) = self.stream(ctx, h.stream)? else {
                    return Ok(());
                };
                // SAFETY: the slot lies in the client's segment, which stays registered
                // until every fence of this client has passed (ClientShared's drop).
                let r = unsafe {
                    gpu.write_u32(slot.done.as_ptr(), h.seq, s)
                        .and_then(|_| gpu.wait_u32(slot.ack.as_ptr(), h.seq, s))
                };
                if let Err(e) = r {
                    self.note_error(e);
                }
                // The wait is a second operation.
                self.queued(ctx, h.stream, s, 1);
                self.hostfn_last.insert(h.slot, h.seq);
            }
            Op::HostNode => {
                let h = rec::<wire::HostFunc>(p);
                let client = self.client.clone();
                let Some(slot) = client.seg.hostfn(h.slot as usize) else {
                    return bad(format!("host node slot {} out of range", h.slot));
                };
                let Some(s) = self.stream(ctx, h.stream)? else {
                    return Ok(());
                };
                if !self.streams.get(&h.stream).is_some_and(|st| st.capturing) {
                    // A host node belongs in a capture; elsewhere the shim queues HostFunc.
                    self.note_error(CuError(code::ILLEGAL_STATE));
                    return Ok(());
                }
                // The words go back and forth on every replay: done = 1 for the client's
                // thread, which clears it and runs the function; the GPU waits for ack = 1
                // and sets it back to 0 for the next replay.
                // SAFETY: the slot lies in the client's segment, registered until every
                // fence of this client has passed; dead clients' slots are acknowledged
                // until then (WorkerCtx::ack_dead_host_nodes).
                let r = unsafe {
                    gpu.write_u32(slot.done.as_ptr(), 1, s)
                        .and_then(|_| gpu.wait_u32_eq(slot.ack.as_ptr(), 1, s))
                        .and_then(|_| gpu.write_u32(slot.ack.as_ptr(), 0, s))
                };
                if let Err(e) = r {
                    self.note_error(e);
                }
                self.host_nodes.insert(h.slot);
            }
            Op::HostNodeAt => {
                let h = rec::<wire::HostNodeAt>(p);
                let Some(s) = self.stream(ctx, h.stream)? else {
                    return Ok(());
                };
                if !self.streams.get(&h.stream).is_some_and(|st| st.capturing) {
                    self.note_error(CuError(code::ILLEGAL_STATE));
                    return Ok(());
                }
                if !h.words.is_multiple_of(8)
                    || !self.client.pinned_contains(h.words, 8)
                    || (!self.host_words.contains(&(h.words + 4))
                        && self.host_words.len() >= MAX_HOST_WORDS)
                {
                    self.note_error(CuError(code::INVALID_VALUE));
                    return Ok(());
                }
                let (done, ack) = (h.words as *mut u32, (h.words + 4) as *mut u32);
                // As HostNode, on two words of the client's pinned memory.
                // SAFETY: the words lie in this client's pinned memory, mapped and
                // registered here until a fence after its work has passed (unpin defers);
                // a dead client's are acknowledged only while still pinned.
                let r = unsafe {
                    gpu.write_u32(done, 1, s)
                        .and_then(|_| gpu.wait_u32_eq(ack, 1, s))
                        .and_then(|_| gpu.write_u32(ack, 0, s))
                };
                if let Err(e) = r {
                    self.note_error(e);
                }
                // The graph's replays use the words: checked and held as its memcpy
                // nodes' page-locked sides are (graph_memory.rs).
                match gpu.capture_graph(s) {
                    Ok(g) => self.cond.host_words(g, h.words),
                    // Not known, so never instantiated.
                    Err(_) => gpu.capture_invalidate(s),
                }
                self.host_words.insert(h.words + 4);
            }
            Op::StreamSync => {
                let h = rec::<wire::HandleCall>(p);
                let pool = self.stream_pool(h.id)?;
                let (mark, submits) = (self.streams[&h.id].synced, self.streams[&h.id].submits);
                let Some(s) = pool else {
                    // Nothing was ever queued on it: only errors of other streams remain.
                    let r = self.take_pending(ctx);
                    self.complete(h.call, r, &[])?;
                    return Ok(());
                };
                if self.already_synced(ctx, mark, submits) {
                    self.complete(h.call, 0, &[])?;
                } else if self.complete_on_gpu(ctx, h.call, s)? {
                    let st = self.streams.get_mut(&h.id).expect("stream_pool() found it");
                    st.synced = Some(SyncMark::done(h.call, submits));
                    // Its word is an operation of the stream: behind a long kernel, many
                    // synchronizations fill the stream as launches do.
                    self.queued(ctx, h.id, s, 1);
                }
            }
            Op::StreamQuery => {
                let h = rec::<wire::HandleCall>(p);
                let r = match self
                    .stream_pool(h.id)?
                    .map_or(Ok(true), |s| gpu.stream_query(s))
                {
                    Ok(true) => self.take_pending(ctx),
                    Ok(false) => code::NOT_READY,
                    Err(e) => e.0,
                };
                self.complete(h.call, r, &[])?;
            }
            Op::EventSync => {
                let h = rec::<wire::HandleCall>(p);
                let e = self.event(h.id)?;
                let Some(m) = self.sync_stream(ctx) else {
                    return self.complete(h.call, code::OUT_OF_MEMORY, &[]);
                };
                match gpu.stream_wait_event(m, e) {
                    Ok(()) => {
                        self.complete_on_gpu(ctx, h.call, m)?;
                        // The sync stream never captures.
                        self.queued_as(ctx, m, 2, false);
                    }
                    Err(err) => {
                        ctx.fault_if_sticky(err.0);
                        self.complete(h.call, err.0, &[])?
                    }
                }
            }
            Op::EventQuery => {
                let h = rec::<wire::HandleCall>(p);
                let e = self.event(h.id)?;
                let r = match gpu.event_query(e) {
                    Ok(true) => 0,
                    Ok(false) => code::NOT_READY,
                    Err(err) => err.0,
                };
                self.complete(h.call, r, &[])?;
            }
            Op::EventElapsed => {
                let el = rec::<wire::EventElapsed>(p);
                let (a, b) = (self.event(el.start)?, self.event(el.end)?);
                let r = gpu.event_elapsed(a, b).map(|ms| wire::U64Reply {
                    value: ms.to_bits() as u64,
                });
                self.complete_pod(el.call, r)?;
            }
            Op::EventTimes => {
                let t = rec::<wire::EventTimes>(p);
                let n = t.count as usize;
                if n > wire::EVENT_TIMES_MAX || tail.len() != n * 8 {
                    return bad(format!(
                        "event times: {n} pairs (at most {}) in {} bytes",
                        wire::EVENT_TIMES_MAX,
                        tail.len()
                    ));
                }
                let anchor = self.event(t.anchor)?;
                let mut out = Vec::with_capacity(n * std::mem::size_of::<wire::EventTime>());
                for pair in tail.chunks_exact(8) {
                    let id = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
                    let start_id = id(&pair[..4]);
                    let (start, end) = (self.event(start_id)?, self.event(id(&pair[4..]))?);
                    let answer = match gpu.event_query(end) {
                        // The GPU's own record of the work, for a client the server times.
                        Ok(true) if let Some(timed) = self.timer_answer(&*gpu, start_id) => {
                            match timed {
                                Ok((start_ns, end_ns)) => wire::EventTime {
                                    source: wire::time_source::GPU,
                                    start_ns,
                                    end_ns,
                                    ..Default::default()
                                },
                                Err(r) => wire::EventTime {
                                    result: r,
                                    ..Default::default()
                                },
                            }
                        }
                        Ok(true) => match (
                            gpu.event_elapsed(anchor, start),
                            gpu.event_elapsed(start, end),
                        ) {
                            (Ok(a), Ok(b)) => wire::EventTime {
                                from_anchor_ms: a,
                                length_ms: b,
                                ..Default::default()
                            },
                            (Err(e), _) | (_, Err(e)) => wire::EventTime {
                                result: e.0,
                                ..Default::default()
                            },
                        },
                        Ok(false) => wire::EventTime {
                            result: code::NOT_READY,
                            ..Default::default()
                        },
                        Err(e) => wire::EventTime {
                            result: e.0,
                            ..Default::default()
                        },
                    };
                    out.extend_from_slice(bytemuck::bytes_of(&answer));
                }
                self.complete(t.call, 0, &out)?;
            }
            Op::CtxSync => {
                let c = rec::<CallHdr>(p);
                let Some(m) = self.sync_stream(ctx) else {
                    return self.complete(c, code::OUT_OF_MEMORY, &[]);
                };
                if self.already_synced(ctx, self.ctx_synced, self.submits) {
                    self.complete(c, 0, &[])?;
                } else {
                    let (streams, left) = (self.fence_streams(), self.left_events(ctx));
                    self.queued_join(ctx, &streams, left.len(), m, 1);
                    match ctx.join_streams(&streams, &left, m) {
                        Ok(()) => {
                            if self.complete_on_gpu(ctx, c, m)? {
                                self.ctx_synced = Some(SyncMark::done(c, self.submits));
                            }
                        }
                        Err(e) => {
                            ctx.fault_if_sticky(e.0);
                            self.complete(c, e.0, &[])?
                        }
                    }
                }
            }
            Op::Ping => {
                let c = rec::<CallHdr>(p);
                let r = self.take_pending(ctx);
                self.complete(c, r, &[])?;
            }

            _ => unreachable!("dispatched to the sync family: {op:?}"),
        }
        Ok(())
    }
}
