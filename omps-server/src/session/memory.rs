//! Allocation, frees, copies and memsets.

use super::*;

impl Session {
    pub(super) fn handle_memory(
        &mut self,
        ctx: &mut WorkerCtx,
        op: Op,
        p: &[u8],
        tail: &[u8],
    ) -> Result<(), Malformed> {
        let gpu = ctx.gpu.clone();
        match op {
            Op::Memset => {
                fixed_only(tail, "memset")?;
                let m = rec::<wire::Memset>(p);
                if !matches!(m.elem_size, 1 | 2 | 4) {
                    return bad("memset: element size");
                }
                let Some(s) = self.stream(ctx, m.stream)? else {
                    return Ok(());
                };
                let Some(bytes) = m.count.checked_mul(m.elem_size as u64) else {
                    return bad("memset: size overflows");
                };
                if self.check_range(m.dst, bytes) {
                    if let Err(e) = gpu.memset(m.dst, m.value, m.elem_size, m.count as usize, s) {
                        self.note_error(e);
                    }
                }
            }
            Op::CopyDtoD => {
                fixed_only(tail, "copy")?;
                let c = rec::<wire::CopyDtoD>(p);
                let Some(s) = self.stream(ctx, c.stream)? else {
                    return Ok(());
                };
                if self.check_range(c.dst, c.len) && self.check_range(c.src, c.len) {
                    if let Err(e) = gpu.copy_dtod(c.dst, c.src, c.len as usize, s) {
                        self.note_error(e);
                    }
                }
            }
            Op::CopyHtoDChunk | Op::CopyDtoHChunk => {
                fixed_only(tail, "chunk copy")?;
                let c = rec::<wire::ChunkCopy>(p);
                let (ptr, cap) = self.chunk(&c)?;
                let word = Word::Chunk(c.chunk as u8);
                let Some(s) = self.stream(ctx, c.stream)? else {
                    return self.signal_now(c.channel, word, c.seq, code::OUT_OF_MEMORY);
                };
                if !self.check_range(c.dev, c.len as u64) {
                    return self.signal_now(c.channel, word, c.seq, code::INVALID_VALUE);
                }
                // A later client's staging is registered at its first copy (segpool.rs).
                if let Err(e) = self.client.staging_ready(c.channel as usize) {
                    self.log_refusal(format_args!(
                        "registering the staging of channel {} failed: CUDA error {e}",
                        c.channel
                    ));
                    self.note_error(CuError(e));
                    return self.signal_now(c.channel, word, c.seq, e);
                }
                debug_assert!(c.len as usize <= cap);
                // SAFETY: ptr..ptr+len is inside this client's registered staging chunk
                // (checked by chunk()); the marker keeps it registered until the copy is done.
                let r = unsafe {
                    if op == Op::CopyHtoDChunk {
                        gpu.copy_htod(c.dev, ptr, c.len as usize, s)
                    } else {
                        gpu.copy_dtoh(ptr, c.dev, c.len as usize, s)
                    }
                };
                match r {
                    Ok(()) => {
                        // The chunk's word lands after everything queued on the stream so
                        // far: a synchronization that follows the client's wait for it (a
                        // pageable device-to-host copy) need not ask the GPU again.
                        self.queued(ctx, c.stream, s, 1);
                        if self.signal_on_gpu(ctx, c.channel, word, c.seq, s)? {
                            let st = self.streams.get_mut(&c.stream).expect("stream() found it");
                            st.synced = Some(SyncMark {
                                channel: c.channel,
                                word,
                                seq: c.seq,
                                submits: st.submits,
                            });
                        }
                    }
                    Err(e) => {
                        self.note_error(e);
                        self.signal_now(c.channel, word, c.seq, e.0)?
                    }
                }
            }
            Op::CopyHtoDInline => {
                let c = rec::<wire::InlineCopy>(p);
                if c.len as usize != tail.len()
                    || tail.len() > wire::INLINE_COPY_MAX
                    || !c.len.is_multiple_of(4)
                    || !c.dev.is_multiple_of(4)
                {
                    return bad("inline copy: length or alignment");
                }
                let Some(s) = self.stream(ctx, c.stream)? else {
                    return Ok(());
                };
                if self.check_range(c.dev, c.len as u64) {
                    // A write per word, one of them counted as the submission.
                    self.queued(ctx, c.stream, s, (c.len / 4).saturating_sub(1));
                    for (i, w) in tail.chunks_exact(4).enumerate() {
                        let v = u32::from_le_bytes(w.try_into().expect("4 bytes"));
                        if let Err(e) = gpu.write_device_u32(c.dev + 4 * i as u64, v, s) {
                            self.note_error(e);
                            break;
                        }
                    }
                }
            }
            Op::CopyHtoDPinned | Op::CopyDtoHPinned => {
                fixed_only(tail, "pinned copy")?;
                let c = rec::<wire::PinnedCopy>(p);
                let Some(s) = self.stream(ctx, c.stream)? else {
                    return Ok(());
                };
                if !self.client.pinned_contains(c.host, c.len) || !self.check_range(c.dev, c.len) {
                    self.note_error(CuError(code::INVALID_VALUE));
                    return Ok(());
                }
                // SAFETY: the host range is pinned memory of this client, mapped and
                // registered here until a fence after this copy has passed (unpin defers).
                let r = unsafe {
                    if op == Op::CopyHtoDPinned {
                        gpu.copy_htod(c.dev, c.host as *const u8, c.len as usize, s)
                    } else {
                        gpu.copy_dtoh(c.host as *mut u8, c.dev, c.len as usize, s)
                    }
                };
                if let Err(e) = r {
                    self.note_error(e);
                }
            }
            Op::MemFree => {
                let f = rec::<wire::MemFree>(p);
                match self.allocs.remove(&f.ptr) {
                    Some(len) => {
                        let everywhere = self.client.frees_wait_everywhere();
                        // Before the release is held: a peer copy the client sent after
                        // the free is refused (crate::release::peer_fence).
                        self.client.note_free(self.dev, f.ptr, everywhere);
                        let exported = ctx
                            .shared
                            .ipc
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .exported(f.ptr, self.client.id);
                        // A block an executable graph of the client still writes stays
                        // the client's until that graph goes (session/graph_memory.rs).
                        if self.hold_for_graphs(f.ptr, len) {
                            return Ok(());
                        }
                        // Nothing of the client's on the GPU: no fence needed, and the block
                        // is kept for its next allocation of that size (kinds/quick_free.rs).
                        if !exported
                            && !everywhere
                            && self.quick.idle(|e| gpu.event_query(e).unwrap_or(false))
                            && ctx.keep_freed(&self.client, f.ptr, len)
                        {
                            return Ok(());
                        }
                        let mut rel = Release::default();
                        if exported {
                            rel.ipc.push((f.ptr, len));
                        } else {
                            rel.allocs.push((f.ptr, len));
                        }
                        if everywhere {
                            ctx.release_everywhere(self, rel)
                        } else {
                            ctx.release_later(self, rel)
                        }
                        self.arm_quick_probe(ctx);
                    }
                    None => self.note_error(CuError(code::INVALID_VALUE)),
                }
            }
            Op::MemAlloc => {
                let a = rec::<wire::MemAlloc>(p);
                let r = if a.size == 0 {
                    Err(CuError(code::INVALID_VALUE))
                } else if let Some(p) = ctx.take_kept(self.client.id, a.size) {
                    // Freed with nothing on the GPU, still charged (worker/kept.rs).
                    Ok(p)
                } else if let Some(p) = ctx.reuse_freed(&self.client, a.size) {
                    // A block of its own it freed, whose fence has passed: still counted
                    // (reuse_freed took it off), counted again, so never over its limit.
                    self.client.add_mem(self.dev, a.size);
                    Ok(p)
                } else if let Err(e) = self.charge(ctx, a.size) {
                    Err(e)
                } else {
                    let r = match gpu.mem_alloc(a.size) {
                        // Memory the client freed may still be on its way back (a fence,
                        // the releaser): PyTorch frees its cache and retries at once.
                        Err(CuError(code::OUT_OF_MEMORY)) if ctx.reclaim() => gpu.mem_alloc(a.size),
                        r => r,
                    };
                    if r.is_err() {
                        self.client.uncharge(self.dev, a.size);
                    }
                    r
                };
                if r == Err(CuError(code::OUT_OF_MEMORY)) {
                    let (free, total) = gpu.mem_info().unwrap_or((0, 0));
                    tracing::warn!(
                        client = self.client.id,
                        size = a.size,
                        free,
                        total,
                        "allocation failed: out of memory"
                    );
                }
                if let Ok(p) = r {
                    self.allocs.insert(p, a.size);
                    self.client.note_alloc(self.dev, p, a.size);
                }
                self.complete_pod(a.call, r.map(|value| wire::U64Reply { value }))?;
            }
            Op::CopyPeer => {
                fixed_only(tail, "peer copy")?;
                let c = rec::<wire::CopyPeer>(p);
                let Some(s) = self.stream(ctx, c.stream)? else {
                    return Ok(());
                };
                let read = self.ring_position();
                let (near, far) = match c.far_is_src {
                    0 => (c.src, c.dst),
                    _ => (c.dst, c.src),
                };
                // The far end must be the client's on a GPU this one reaches, and the
                // client's frees there must wait for its work here (peer access on).
                // Or VMM memory of its own mapped with access for this GPU (its unmap
                // waits for this GPU's fence).
                let far_ok = self.client.visible.get(c.peer as usize).is_some_and(|&g| {
                    g != self.dev
                        && ((self.client.peer_access.load(Ordering::SeqCst)
                            && gpu.reaches(g)
                            && self.client.holds_on(g, far, c.len, self.dev, read))
                            || self.client.vmm_reaches(self.dev, far, c.len, read))
                });
                if !far_ok {
                    self.note_error(CuError(code::INVALID_VALUE));
                } else if self.check_range(near, c.len) {
                    if let Err(e) = gpu.copy_dtod(c.dst, c.src, c.len as usize, s) {
                        self.note_error(e);
                    }
                }
            }
            Op::PeerAccess => {
                let r = rec::<wire::PeerAccess>(p);
                let status = match self.client.visible.get(r.peer as usize) {
                    Some(&g) if g != self.dev => match gpu.enable_peer(g) {
                        Ok(()) => {
                            // Before the answer: the client's next free, on any GPU, sees it.
                            self.client.peer_access.store(true, Ordering::SeqCst);
                            0
                        }
                        Err(e) => e.0,
                    },
                    _ => code::INVALID_DEVICE,
                };
                self.complete(r.call, status, &[])?;
            }
            Op::MemGetInfo => {
                let c = rec::<CallHdr>(p);
                // Under a limit the client sees the limit as the GPU's size and what it
                // has left of it as free (never more than the GPU has free), as MPS's
                // clients see free: PyTorch's allocator and mem_get_info plan by it. A
                // namespace's limit counts too, with what all its processes hold: MPS
                // reports the whole GPU as total there, so vLLM sized by total
                // overshoots (issue 26); here total is the namespace's limit.
                let r = gpu.mem_info().map(|(mut free, mut total)| {
                    if let Some(l) = self.client.limit(self.dev) {
                        free = free.min(l.saturating_sub(self.client.mem_use(self.dev)));
                        total = total.min(l);
                    }
                    if let Some((l, left)) = self.client.account.namespace_headroom(self.dev) {
                        free = free.min(left);
                        total = total.min(l);
                    }
                    wire::MemInfoReply { free, total }
                });
                self.complete_pod(c, r)?;
            }
            _ => unreachable!("dispatched to the memory family: {op:?}"),
        }
        Ok(())
    }

    /// Records the session's probe after the fence a free just queued (unless quiet: then
    /// it follows all the client's work already): while nothing but allocations and frees
    /// follow, its passing shows the client idle (kinds/quick_free.rs). Counted toward the
    /// sync stream's depth, as the fence's own record is.
    fn arm_quick_probe(&mut self, ctx: &mut WorkerCtx) {
        let Some(m) = self.sync else {
            return;
        };
        if !self.quick.wants_probe() {
            return;
        }
        let gpu = ctx.gpu.clone();
        // Timing off, as the fences' events (worker/ctx.rs).
        let Some(ev) = self.quick.probe_or(|| gpu.event_create(0x2).ok()) else {
            return;
        };
        if gpu.event_record(ev, m).is_ok() {
            self.queued_as(ctx, m, 1, false);
            self.quick.armed();
        }
    }
}
