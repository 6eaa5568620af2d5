//! Launches and the driver's questions about functions (occupancy, limits, TMA descriptors).

use super::*;

impl Session {
    pub(super) fn handle_exec(
        &mut self,
        ctx: &mut WorkerCtx,
        op: Op,
        p: &[u8],
        tail: &[u8],
    ) -> Result<(), Malformed> {
        let gpu = ctx.gpu.clone();
        match op {
            Op::Launch => {
                self.client.launches.fetch_add(1, Ordering::Relaxed);
                let l = rec::<wire::Launch>(p);
                if l.num_attrs > wire::MAX_LAUNCH_ATTRS {
                    return bad("launch: too many attributes");
                }
                let attr_len = l.num_attrs as usize * wire::LAUNCH_ATTR_BYTES;
                if tail.len() != attr_len + l.args_len as usize {
                    return bad("launch: record length disagrees with attributes and args_len");
                }
                let (attrs, tail) = tail.split_at(attr_len);
                for a in attrs.chunks_exact(wire::LAUNCH_ATTR_BYTES) {
                    let id = u32::from_le_bytes(a[..4].try_into().expect("4 bytes"));
                    if !wire::launch_attr_forwardable(id) {
                        return bad(format!("launch: attribute {id} carries handles"));
                    }
                }
                let f = self
                    .functions
                    .get(&l.func)
                    .ok_or_else(|| Malformed(format!("unknown function {}", l.func)))?;
                if f.args_size != tail.len() {
                    return bad(format!(
                        "launch: {} argument bytes, function takes {}",
                        tail.len(),
                        f.args_size
                    ));
                }
                let h = f.handle;
                // A run gathered on another stream goes first: this stream's ordering
                // events (legacy-stream semantics) must come after it.
                if self.run.other_stream(l.stream) {
                    self.flush_run(ctx);
                }
                let Some(s) = self.stream(ctx, l.stream)? else {
                    return Ok(());
                };
                let shape = (h, l.grid, l.block, l.shared_mem);
                // Whether a launch of this shape may join a run (kinds/launch_run.rs).
                // A traced client's launches go one by one: each carries its span's key.
                let gathers = attrs.is_empty()
                    && self.capturing == 0
                    && !self.timer.timed
                    && gpu.takes_runs(s);
                if gathers && self.run.proven(&shape) {
                    if self.run.other_work(s) {
                        self.flush_run(ctx);
                    }
                    if self.run.push(l.stream, s, shape, tail) {
                        self.flush_run(ctx);
                    }
                    return Ok(());
                }
                self.flush_run(ctx);
                match gpu.launch(h, l.grid, l.block, l.shared_mem, s, attrs, tail) {
                    Ok(()) if gathers => self.run.prove(shape),
                    Ok(()) => {}
                    Err(e) => self.note_error(e),
                }
            }
            Op::Query => {
                let q = rec::<wire::Query>(p);
                if q.num_attrs > wire::MAX_LAUNCH_ATTRS
                    || tail.len() != q.num_attrs as usize * wire::LAUNCH_ATTR_BYTES
                {
                    return bad("query: attribute bytes disagree with num_attrs");
                }
                for a in tail.chunks_exact(wire::LAUNCH_ATTR_BYTES) {
                    if !wire::launch_attr_forwardable(u32::from_le_bytes(
                        a[..4].try_into().expect("4 bytes"),
                    )) {
                        return bad("query: attribute carries handles");
                    }
                }
                let func = match q.kind {
                    wire::query::CTX_GET_LIMIT
                    | wire::query::CTX_SET_LIMIT
                    | wire::query::CTX_RESET_PERSISTING_L2 => 0,
                    _ => {
                        self.functions
                            .get(&q.func)
                            .ok_or_else(|| Malformed(format!("unknown function {}", q.func)))?
                            .handle
                    }
                };
                let limit = q.args[0] as i32;
                // The GPU-wide limits are locked only for the limit questions.
                let limits = || ctx.shared.limits.lock().unwrap_or_else(|e| e.into_inner());
                let r = match q.kind {
                    wire::query::CTX_GET_LIMIT => limits().get(&*gpu, &self.limits, limit),
                    wire::query::CTX_SET_LIMIT => {
                        let mut l = limits();
                        let value = q.args[1] as u64;
                        // What the value costs the GPU counts against the client asking,
                        // before the context grows (a 64 KiB stack for every resident
                        // thread of an H100 is 17 GB).
                        let r = l.cost(&*gpu, limit, value).and_then(|cost| {
                            let had = self.limit_charges.get(&limit).copied().unwrap_or(0);
                            if cost > had {
                                self.client.charge(self.dev, cost - had)?;
                            }
                            let r = l.set(&*gpu, &mut self.limits, limit, value);
                            let kept = if r.is_ok() { cost } else { had };
                            if kept < cost.max(had) {
                                self.client.uncharge(self.dev, cost.max(had) - kept);
                            }
                            // Only what is charged is kept: a client naming limit after
                            // unknown limit would otherwise grow the map without end.
                            if kept > 0 {
                                self.limit_charges.insert(limit, kept);
                            } else {
                                self.limit_charges.remove(&limit);
                            }
                            r
                        });
                        l.note(self.client.id, &self.limits);
                        r.map(|()| 0)
                    }
                    _ => gpu.query(q.kind, func, q.args, tail).map(|v| v as u64),
                };
                self.complete_pod(q.call, r.map(|value| wire::U64Reply { value }))?;
            }
            Op::TensorMap => {
                let t = rec::<wire::TensorMap>(p);
                // The driver reads `rank` entries of each array: the record holds room for 5,
                // and the shim refuses other ranks before sending.
                use wire::tensor_map as k;
                let ranks = match t.kind {
                    k::TILED => 1..=5,
                    k::IM2COL | k::IM2COL_WIDE => 3..=5,
                    k::REPLACE_ADDRESS => 0..=u32::MAX,
                    other => return bad(format!("tensor map: unknown kind {other}")),
                };
                if !ranks.contains(&t.rank) {
                    return bad(format!("tensor map: rank {}", t.rank));
                }
                let old: Option<&[u8; 128]> = match t.kind {
                    wire::tensor_map::REPLACE_ADDRESS => Some(
                        tail.try_into()
                            .map_err(|_| Malformed("tensor map: descriptor length".into()))?,
                    ),
                    _ => {
                        fixed_only(tail, "tensor map")?;
                        None
                    }
                };
                let r = gpu.tensor_map(&t, old);
                match r {
                    Ok(d) => self.complete(t.call, 0, &d)?,
                    Err(e) => self.complete(t.call, e.0, &[])?,
                }
            }
            _ => unreachable!("dispatched to the exec family: {op:?}"),
        }
        Ok(())
    }

    /// Sends the launches gathered (kinds/launch_run.rs): as graph launches of the lengths
    /// the GPU keeps graphs for, what is left, or what the GPU would not take so, one by
    /// one. Called before any record but a launch that joins the run, and at the end of
    /// the client's turn in each pass (worker/run.rs).
    pub fn flush_run(&mut self, ctx: &mut WorkerCtx) {
        let Some(run) = self.run.take() else {
            return;
        };
        let gpu = ctx.gpu.clone();
        let plain = |i: usize| {
            let ((func, grid, block, shared), ref r) = run.launches[i];
            crate::gpu::PlainLaunch {
                func,
                grid,
                block,
                shared,
                args: &run.args[r.clone()],
            }
        };
        let mut i = 0;
        while i < run.launches.len() {
            let left = run.launches.len() - i;
            if let Some(&k) = crate::gpu::RUN_LENGTHS.iter().find(|&&k| k <= left) {
                let batch: Vec<_> = (i..i + k).map(plain).collect();
                if gpu.launch_run(run.work, &batch).is_ok() {
                    i += k;
                    continue;
                }
                // Not taken as a run: each goes alone, and gets its own error; the shapes
                // are proven again one by one (a driver that refuses one in a graph, say a
                // dynamic-parallelism kernel, is not asked again at every run).
                self.run.forget_shapes();
                for l in batch {
                    if let Err(e) =
                        gpu.launch(l.func, l.grid, l.block, l.shared, run.work, &[], l.args)
                    {
                        self.note_error(e);
                    }
                }
                i += k;
                continue;
            }
            let l = plain(i);
            if let Err(e) = gpu.launch(l.func, l.grid, l.block, l.shared, run.work, &[], l.args) {
                self.note_error(e);
            }
            i += 1;
        }
    }
}
