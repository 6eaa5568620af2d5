//! Stream capture and graphs.
//!
//! A client's capture runs in the server, on the work stream its client stream is bound
//! to, in the driver's relaxed mode: the server's threads serve other clients meanwhile,
//! and the client's own capture mode is the shim's to enforce on the client's threads.
//! A capturing client stream has a work stream of its own (it is moved to a free one at
//! the start if it shared one), so no other work, of this client or another, enters the
//! graph. Graph and executable-graph ids are per client, and the graphs are freed with
//! the client.
//!
//! What the server does itself on a client's stream must not be captured: depth marks
//! are skipped while capturing, and operations that are illegal during capture natively
//! (synchronizing or querying the stream, synchronizing the context, pageable copies
//! through the staging chunks) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
//! invalidate the capture, as the driver does.

use super::*;
use omps_ring::wire::graph;

/// CUgraphInstantiate_flags cuGraphInstantiateWithFlags takes: AUTO_FREE_ON_LAUNCH,
/// DEVICE_LAUNCH, USE_NODE_PRIORITY (UPLOAD belongs to cuGraphInstantiateWithParams, whose
/// upload the shim queues itself).
const INSTANTIATE_FLAGS: u64 = 1 | 4 | 8;

impl Session {
    pub(super) fn handle_graphs(
        &mut self,
        ctx: &mut WorkerCtx,
        op: Op,
        p: &[u8],
        tail: &[u8],
    ) -> Result<(), Malformed> {
        fixed_only(tail, "graph op")?;
        let gpu = ctx.gpu.clone();
        match op {
            Op::CaptureBegin => {
                let c = rec::<wire::CaptureCall>(p);
                let r = self.begin_capture(ctx, c.stream)?;
                self.complete(c.call, r, &[])?;
            }
            Op::CaptureEnd => {
                let c = rec::<wire::CaptureCall>(p);
                let st = self
                    .streams
                    .get(&c.stream)
                    .ok_or_else(|| Malformed(format!("unknown stream {}", c.stream)))?;
                let (capturing, pool) = (st.capturing, st.pool);
                if capturing && !self.cond.is_capturing_into(c.stream) {
                    self.end_body_captures(ctx);
                }
                let r = match (capturing, pool) {
                    (true, Some(s)) => {
                        ctx.share_again(s);
                        gpu.capture_end(s)
                    }
                    _ => Err(CuError(code::ILLEGAL_STATE)),
                };
                // Ending the origin's capture ends that of every stream it forked into.
                self.refresh_capture_flags(ctx);
                // A capture ends in a graph the client now holds under an id, or in nothing.
                if let Ok(g) = r {
                    if self.cond.known_id(&self.graphs, g).is_none() {
                        match self.graph_id() {
                            Ok(id) => {
                                self.graphs.insert(id, g);
                            }
                            Err(_) => {
                                let _ = gpu.graph_destroy(g);
                            }
                        }
                    }
                }
                self.prune_homes(ctx);
                // A capture into a home or body ends in that graph, which has its id.
                let r = r.and_then(|g| {
                    self.cond
                        .known_id(&self.graphs, g)
                        .ok_or(CuError(code::OUT_OF_MEMORY))
                });
                let r = r.map(|id| wire::U64Reply { value: id as u64 });
                self.complete_pod(c.call, r)?;
            }
            Op::CaptureStatus => {
                let h = rec::<wire::HandleCall>(p);
                let r = match self.stream_pool(h.id)? {
                    Some(s) => gpu.capture_status(s),
                    None => Ok((graph::STATUS_NONE, 0)),
                };
                self.complete_pod(
                    h.call,
                    r.map(|(status, id)| wire::CaptureInfo {
                        status,
                        _pad: 0,
                        id,
                    }),
                )?;
            }
            Op::GraphInstantiate => {
                let g = rec::<wire::GraphInstantiate>(p);
                let r = match self.graphs.get(&g.graph).copied() {
                    // Only the flags cuGraphInstantiateWithFlags knows reach the driver:
                    // what a newer driver would make of others is not the client's to pick
                    // in a context it shares.
                    _ if g.flags & !INSTANTIATE_FLAGS != 0 => Err(CuError(code::INVALID_VALUE)),
                    Some(h) => match self.owned_graph_ranges(ctx, h) {
                        Some(ranges) => gpu.graph_instantiate(h, g.flags).map(|e| (e, ranges)),
                        None => Err(CuError(code::INVALID_VALUE)),
                    },
                    None => Err(CuError(code::INVALID_HANDLE)),
                };
                let r = r.and_then(|(e, ranges)| match self.graph_id() {
                    Ok(id) => {
                        self.execs.insert(id, e);
                        self.note_exec_source(id, g.graph, g.flags);
                        self.note_exec_ranges(ctx, id, ranges);
                        Ok(wire::U64Reply { value: id as u64 })
                    }
                    Err(err) => {
                        let _ = gpu.graph_exec_destroy(e);
                        Err(err)
                    }
                });
                self.complete_pod(g.call, r)?;
            }
            Op::GraphLaunch | Op::GraphUpload => {
                let l = rec::<wire::GraphLaunch>(p);
                let Some(&e) = self.execs.get(&l.exec) else {
                    // The shim checks its handles: an unknown id is a lie.
                    return bad(format!("launching unknown executable graph {}", l.exec));
                };
                let Some(s) = self.stream(ctx, l.stream)? else {
                    return Ok(());
                };
                if op == Op::GraphLaunch {
                    // After its profiling twin's last launch, where it has one.
                    self.launch_original(ctx, l.exec, e, s, l.stream);
                } else if let Err(err) = gpu.graph_upload(e, s) {
                    self.note_error(err);
                }
            }
            Op::GraphDestroy | Op::GraphExecDestroy => {
                let h = rec::<wire::Handle>(p);
                let (map, what) = if op == Op::GraphDestroy {
                    (&mut self.graphs, "graph")
                } else {
                    (&mut self.execs, "executable graph")
                };
                let Some(&handle) = map.get(&h.id) else {
                    return bad(format!("destroying unknown {what} {}", h.id));
                };
                if op == Op::GraphDestroy {
                    self.cond.destroying(handle)?;
                }
                let map = if op == Op::GraphDestroy {
                    &mut self.graphs
                } else {
                    &mut self.execs
                };
                map.remove(&h.id);
                let mut rel = Release::default();
                if op == Op::GraphDestroy {
                    // Kept while executable graphs made from it live (a profiler's twin
                    // is made from it).
                    if !self.keep_destroyed_graph(h.id, handle) {
                        rel.graphs.push(handle);
                    }
                } else {
                    rel.execs.push(handle);
                    self.exec_profile_gone(h.id, true, &mut rel);
                }
                // An executable graph may still run: freed once the client's work is done.
                self.release_if_any(ctx, rel);
                // Then what it alone held (blocks, openings, modules), after it.
                let exec = (op == Op::GraphExecDestroy).then_some(h.id);
                self.graph_gone(ctx, exec);
            }
            Op::GraphQuery => {
                let q = rec::<wire::GraphQuery>(p);
                let r = match self.graphs.get(&q.graph) {
                    None => Err(CuError(code::INVALID_HANDLE)),
                    Some(&g) => gpu.graph_nodes(g).and_then(|nodes| match q.kind {
                        graph::NODE_COUNT => Ok(nodes.len() as u64),
                        graph::NODE_TYPE => match nodes.get(q.index as usize) {
                            Some(&n) => gpu.graph_node_type(n).map(u64::from),
                            None => Err(CuError(code::INVALID_VALUE)),
                        },
                        _ => Err(CuError(code::INVALID_VALUE)),
                    }),
                };
                self.complete_pod(q.call, r.map(|value| wire::U64Reply { value }))?;
            }
            _ => unreachable!("dispatched to the graphs family: {op:?}"),
        }
        Ok(())
    }

    /// Starts capturing client stream `id` on a work stream of its own: the CUresult.
    fn begin_capture(&mut self, ctx: &mut WorkerCtx, id: u32) -> Result<i32, Malformed> {
        self.begin_capture_with(ctx, id, |gpu, s| gpu.capture_begin(s))
    }

    /// As [`Session::begin_capture`], the capture begun on the work stream by `begin`.
    pub(super) fn begin_capture_with(
        &mut self,
        ctx: &mut WorkerCtx,
        id: u32,
        begin: impl FnOnce(&dyn crate::gpu::Gpu, usize) -> crate::gpu::GpuResult<()>,
    ) -> Result<i32, Malformed> {
        let Some(st) = self.streams.get(&id) else {
            return bad(format!("unknown stream {id}"));
        };
        if id == wire::STREAM_DEFAULT {
            // The legacy stream cannot be captured (cudaStreamLegacy, natively too).
            return Ok(code::STREAM_CAPTURE_UNSUPPORTED);
        }
        if st.capturing {
            return Ok(code::ILLEGAL_STATE);
        }
        let new = match self.bind_exclusive(ctx, id)? {
            Ok(new) => new,
            Err(code) => return Ok(code),
        };
        Ok(match begin(&*ctx.gpu, new) {
            Ok(()) => {
                let st = self.streams.get_mut(&id).expect("looked up above");
                st.capturing = true;
                st.origin = true;
                self.capturing += 1;
                code::SUCCESS
            }
            Err(e) => e.0,
        })
    }

    /// Gives client stream `id` a work stream no other stream uses, for as long as it
    /// captures: a capture takes in whatever else is queued on its work stream, another
    /// client's work included. Its earlier work stays ordered before what comes next.
    /// Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) when its class has none free.
    pub(super) fn bind_exclusive(
        &mut self,
        ctx: &mut WorkerCtx,
        id: u32,
    ) -> Result<Result<usize, i32>, Malformed> {
        let Some(st) = self.streams.get(&id) else {
            return bad(format!("unknown stream {id}"));
        };
        let (old, priority) = (st.pool, st.priority);
        // Where its other streams are now (a newer placement moves them, not this one).
        let place = self.placement;
        let Some(new) = ctx.bind_alone(self.client.id, place, priority, old) else {
            tracing::warn!(
                client = self.client.id,
                "no free work stream for a capture: the client holds them all"
            );
            return Ok(Err(code::STREAM_CAPTURE_UNSUPPORTED));
        };
        // Fences skip capturing streams, and no longer join one given up: the work queued
        // before the capture is remembered (`left`), so that a free after it still waits
        // for that work (review of issue 25: a block freed mid-capture went back while a
        // kernel queued before the capture still used it).
        match old {
            Some(o) if o != new => {
                if let Err(e) = ctx.order(o, new) {
                    self.note_error(e);
                }
                self.leave_pool(ctx, o);
            }
            Some(o) => self.remember_last_work(ctx, o),
            None => {}
        }
        let st = self.streams.get_mut(&id).expect("looked up above");
        st.pool = Some(new);
        Ok(Ok(new))
    }

    /// Ends every capture still going (the client destroys the stream or goes), so its
    /// work streams go back to the pool clean; the graphs are thrown away.
    pub fn end_captures(&mut self, ctx: &mut WorkerCtx) {
        if self.capturing == 0 {
            return;
        }
        // Captures into bodies first: the others may throw their homes away.
        self.end_body_captures(ctx);
        let pools: Vec<usize> = self
            .streams
            .values()
            .filter(|s| s.capturing)
            .chain(&self.parked)
            .filter_map(|s| s.pool)
            .collect();
        for s in pools {
            ctx.share_again(s);
            self.abandon_capture(&*ctx.gpu.clone(), s);
        }
        self.refresh_capture_flags(ctx);
        self.prune_homes(ctx);
    }

    /// Ends the capture on work stream `pool` and throws its graph away, unless the graph
    /// is one the client holds (a capture into a home or a body): the conditional
    /// handles and bodies a thrown-away graph made go with it.
    pub(super) fn abandon_capture(&mut self, gpu: &dyn crate::gpu::Gpu, pool: usize) {
        if let Ok(g) = gpu.capture_end(pool) {
            if self.cond.known_id(&self.graphs, g).is_none() {
                let _ = gpu.graph_destroy(g);
            }
        }
    }

    /// Ends the captures into bodies of homes that are captures' graphs, before a capture
    /// that may throw such a home away ends (their graphs are kept: they have ids).
    pub(super) fn end_body_captures(&mut self, ctx: &mut WorkerCtx) {
        for id in self.cond.captures_into_capture_homes(&self.graphs) {
            if let Some(pool) = self.streams.get(&id).and_then(|s| s.pool) {
                ctx.share_again(pool);
                self.abandon_capture(&*ctx.gpu.clone(), pool);
            }
            self.cond.capture_over(id);
        }
    }

    /// Forgets the homes (and their bodies and handles) that went with a capture.
    pub(super) fn prune_homes(&mut self, ctx: &mut WorkerCtx) {
        if !self.cond.any() {
            return;
        }
        let capturing: Vec<u64> = self
            .streams
            .values()
            .filter(|s| s.capturing)
            .filter_map(|s| s.pool)
            .filter_map(|p| ctx.gpu.capture_graph(p).ok())
            .collect();
        self.cond.prune(&self.graphs, &capturing);
    }

    /// Re-reads which client streams capture (a wait on an event of a capturing stream
    /// forks the capture into the waiting one; ending the origin's ends them all).
    /// Work streams that stop capturing may be shared again.
    pub(super) fn refresh_capture_flags(&mut self, ctx: &mut WorkerCtx) {
        let mut n = 0;
        for (id, st) in self.streams.iter_mut() {
            let was = st.capturing;
            st.capturing = st.pool.is_some_and(|s| {
                ctx.gpu
                    .capture_status(s)
                    .is_ok_and(|(status, _)| status != graph::STATUS_NONE)
            });
            if was && !st.capturing {
                if let Some(s) = st.pool {
                    ctx.share_again(s);
                }
            }
            if !st.capturing {
                st.origin = false;
                self.cond.capture_over(*id);
            }
            n += st.capturing as usize;
        }
        // Parked streams leave once their capture is over, as a destroyed stream does.
        let parked = std::mem::take(&mut self.parked);
        for st in parked {
            let still = st.pool.is_some_and(|s| {
                ctx.gpu
                    .capture_status(s)
                    .is_ok_and(|(status, _)| status != graph::STATUS_NONE)
            });
            if still {
                n += 1;
                self.parked.push(st);
                continue;
            }
            if let Some(p) = st.pool {
                ctx.share_again(p);
                self.leave_pool(ctx, p);
            }
        }
        self.capturing = n;
    }

    pub(super) fn stream_capturing(&self, id: u32) -> bool {
        self.streams.get(&id).is_some_and(|s| s.capturing)
    }

    /// While a stream of this client captures, answers the operations that are illegal
    /// during capture as the driver does (and invalidates the capture); None for the
    /// others, which run as usual.
    pub(super) fn capture_guard(
        &mut self,
        ctx: &mut WorkerCtx,
        op: Op,
        p: &[u8],
    ) -> Result<Option<()>, Malformed> {
        const UNSUPPORTED: i32 = code::STREAM_CAPTURE_UNSUPPORTED;
        let invalidate = |this: &Session, id: u32| {
            if let Some(s) = this.streams.get(&id).and_then(|s| s.pool) {
                ctx.gpu.capture_invalidate(s);
            }
        };
        match op {
            Op::EventRecord => {
                // Remember which events a capture recorded; run the record as usual. (An
                // external record is an event record node: its event stays usable.)
                let r = rec::<wire::EventRecord>(p);
                if self.stream_capturing(r.stream) {
                    // An event shared through IPC recorded in a capture would let another
                    // process's wait fork this capture into its stream, or its stream's
                    // work into this graph: refused, and the capture with it.
                    let shared = self.events.get(&r.event).is_some_and(|&e| {
                        ctx.shared
                            .ipc
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .event_shared(e)
                    });
                    if shared {
                        invalidate(self, r.stream);
                        self.note_error(CuError(UNSUPPORTED));
                        return Ok(Some(()));
                    }
                    self.captured_events.insert(r.event);
                } else {
                    self.captured_events.remove(&r.event);
                }
                return Ok(None);
            }
            Op::StreamSync | Op::StreamQuery => {
                let h = rec::<wire::HandleCall>(p);
                if !self.stream_capturing(h.id) {
                    return Ok(None);
                }
                invalidate(self, h.id);
                self.complete(h.call, UNSUPPORTED, &[])?;
            }
            Op::EventSync | Op::EventQuery => {
                // CUDA_ERROR_CAPTURED_EVENT, as natively.
                const CAPTURED_EVENT: i32 = 907;
                let h = rec::<wire::HandleCall>(p);
                if !self.captured_events.contains(&h.id) {
                    return Ok(None);
                }
                self.complete(h.call, CAPTURED_EVENT, &[])?;
            }
            Op::CtxSync if self.capturing > 0 => {
                let c = rec::<CallHdr>(p);
                let ids: Vec<u32> = self
                    .streams
                    .iter()
                    .filter(|(_, s)| s.capturing)
                    .map(|(&id, _)| id)
                    .collect();
                ids.iter().for_each(|&id| invalidate(self, id));
                self.complete(c, UNSUPPORTED, &[])?;
            }
            Op::CopyHtoDChunk | Op::CopyDtoHChunk => {
                let c = rec::<wire::ChunkCopy>(p);
                if !self.stream_capturing(c.stream) {
                    return Ok(None);
                }
                invalidate(self, c.stream);
                self.signal_now(c.channel, Word::Chunk(c.chunk as u8), c.seq, UNSUPPORTED)?;
            }
            Op::CopyHtoDInline => {
                let c = rec::<wire::InlineCopy>(p);
                if !self.stream_capturing(c.stream) {
                    return Ok(None);
                }
                invalidate(self, c.stream);
                self.note_error(CuError(UNSUPPORTED));
            }
            Op::HostFunc => {
                // A host node would run in the server: not yet (issue 9).
                let h = rec::<wire::HostFunc>(p);
                if !self.stream_capturing(h.stream) {
                    return Ok(None);
                }
                invalidate(self, h.stream);
                self.note_error(CuError(code::NOT_SUPPORTED));
            }
            _ => return Ok(None),
        }
        Ok(Some(()))
    }
}
