//! [`Session::handle`]: checks a record's length and hands it to its family (exec,
//! memory, modules, sync, vmm, link and the rest, each in its own file under session/).
//! Apart from state.rs so that the session's state and its dispatch read separately.

use super::*;

impl Session {
    /// Decodes, validates and runs one record.
    pub fn handle(&mut self, ctx: &mut WorkerCtx, tag: u32, p: &[u8]) -> Result<(), Malformed> {
        let Some(op) = Op::from_tag(tag) else {
            return bad(format!("unknown op {tag}"));
        };
        if p.len() < op.fixed_len() {
            return bad(format!(
                "{op:?}: {} bytes, needs {}",
                p.len(),
                op.fixed_len()
            ));
        }
        let tail = &p[op.fixed_len()..];
        self.client.commands.fetch_add(1, Ordering::Relaxed);
        if !self.marked_used {
            self.marked_used = true;
            self.client
                .used_gpus
                .fetch_or(1 << self.dev, Ordering::Relaxed);
        }
        // Launches gathered go before anything else (kinds/launch_run.rs).
        if op != Op::Launch {
            self.flush_run(ctx);
            // What a function is may change with these: its shapes are proven again.
            let cache_config = op == Op::Query
                && p.len() >= std::mem::size_of::<wire::Query>()
                && rec::<wire::Query>(p).kind == wire::query::FUNC_CACHE_CONFIG;
            if matches!(op, Op::ModuleUnload | Op::FuncSetAttribute) || cache_config {
                self.run.forget_shapes();
            }
        }
        // Anything but an allocation or a free may queue work: a block freed after it
        // waits for a fence again (kinds/quick_free.rs).
        if !matches!(op, Op::MemAlloc | Op::MemFree) {
            self.quick.touch();
        }
        if (self.capturing > 0 || !self.captured_events.is_empty())
            && self.capture_guard(ctx, op, p)?.is_some()
        {
            return Ok(());
        }
        self.timer_before(op, p);
        // The driver calls of a traced client's work carry its span's key (timer.rs)
        // until this record is handled, however it ends.
        let _key = self.timer_key(ctx, op, p);
        match op {
            Op::Launch | Op::Query | Op::TensorMap => self.handle_exec(ctx, op, p, tail)?,
            Op::Memset
            | Op::CopyDtoD
            | Op::CopyPeer
            | Op::CopyHtoDChunk
            | Op::CopyDtoHChunk
            | Op::CopyHtoDInline
            | Op::CopyHtoDPinned
            | Op::CopyDtoHPinned
            | Op::MemFree
            | Op::MemAlloc
            | Op::PeerAccess
            | Op::MemGetInfo => self.handle_memory(ctx, op, p, tail)?,
            Op::BlobAppend
            | Op::ModuleUnload
            | Op::ModuleLoad
            | Op::ModuleGetGlobal
            | Op::FuncGetAttribute
            | Op::FuncSetAttribute => self.handle_modules(ctx, op, p, tail)?,
            Op::StreamCreate
            | Op::StreamDestroy
            | Op::EventCreate
            | Op::EventDestroy
            | Op::EventRecord
            | Op::StreamWaitEvent
            | Op::EventRecordExternal
            | Op::StreamWaitEventExternal
            | Op::HostNode
            | Op::HostNodeAt
            | Op::StreamSync
            | Op::StreamQuery
            | Op::EventSync
            | Op::EventQuery
            | Op::EventElapsed
            | Op::EventTimes
            | Op::CtxSync
            | Op::HostFunc
            | Op::Ping => self.handle_sync(ctx, op, p, tail)?,
            Op::Link => self.handle_link(ctx, rec::<wire::ModuleLoad>(p))?,
            Op::ModuleLoadJit => {
                fixed_only(tail, "jit load")?;
                self.handle_jit_load(ctx, rec::<wire::ModuleLoad>(p))?;
            }
            Op::BlobFetch => {
                fixed_only(tail, "blob fetch")?;
                self.handle_blob_fetch(rec::<wire::ChunkCopy>(p))?;
            }
            Op::Array | Op::ArrayCopy | Op::TexObject => self.handle_arrays(ctx, op, p, tail)?,
            Op::Vmm => {
                fixed_only(tail, "vmm")?;
                self.handle_vmm(ctx, rec::<wire::Vmm>(p))?;
            }
            Op::CaptureBegin
            | Op::CaptureEnd
            | Op::CaptureStatus
            | Op::GraphInstantiate
            | Op::GraphLaunch
            | Op::GraphUpload
            | Op::GraphDestroy
            | Op::GraphExecDestroy
            | Op::GraphQuery => self.handle_graphs(ctx, op, p, tail)?,
            Op::GraphCond => {
                fixed_only(tail, "conditional graph op")?;
                let c = rec::<wire::GraphCond>(p);
                self.graph_cond_profile(ctx, &c);
                self.handle_graph_cond(ctx, &c)?;
            }
            Op::GraphProfileInfo | Op::GraphLaunchProfiled => {
                self.handle_graph_profile(ctx, op, p, tail)?
            }
            Op::Profiling => {
                fixed_only(tail, "profiling")?;
                self.handle_profiling(ctx, &rec::<wire::Profiling>(p))?;
            }
            Op::IpcGetMemHandle
            | Op::IpcOpenMemHandle
            | Op::IpcCloseMemHandle
            | Op::IpcGetEventHandle
            | Op::IpcOpenEventHandle => self.handle_ipc(ctx, op, p, tail)?,
            Op::Green => {
                fixed_only(tail, "green context call")?;
                self.handle_green(ctx, rec::<wire::GreenCall>(p))?;
            }
        }
        Ok(())
    }
}
