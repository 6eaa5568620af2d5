//! Module images, their loading and unloading, globals and function attributes.

use super::kinds::compile::{Outcome, Wanted};
use super::*;
use crate::image::module_cache::{Defaults, SETTABLE};
use crate::image::verifier::Work;

impl Session {
    pub(super) fn handle_modules(
        &mut self,
        ctx: &mut WorkerCtx,
        op: Op,
        p: &[u8],
        tail: &[u8],
    ) -> Result<(), Malformed> {
        let gpu = ctx.gpu.clone();
        match op {
            Op::BlobAppend => {
                fixed_only(tail, "blob append")?;
                let c = rec::<wire::ChunkCopy>(p);
                let (ptr, _) = self.chunk(&c)?;
                // SAFETY: chunk() checked the range lies inside the segment; the client may
                // scribble on it concurrently, which only corrupts its own image.
                let bytes = unsafe { std::slice::from_raw_parts(ptr, c.len as usize) };
                self.append_blob(c.channel as usize, bytes);
                self.signal_now(c.channel, Word::Chunk(c.chunk as u8), c.seq, 0)?;
            }
            Op::ModuleUnload => {
                let h = rec::<wire::Handle>(p);
                let m = self
                    .modules
                    .remove(&h.id)
                    .ok_or_else(|| Malformed(format!("unloading unknown module {}", h.id)))?;
                for f in &m.functions {
                    self.functions.remove(f);
                }
                self.globals.retain(|_, &mut (_, module)| module != h.id);
                // It stays loaded while the client holds graphs (session/graph_memory.rs):
                // their kernel nodes may name its functions, and memset or memcpy nodes its
                // variables, whose memory the driver would give to the next allocation.
                let held = crate::session::kinds::graph_held::HeldForGraphs::Module(
                    m.handle,
                    m.shared,
                    m.data_bytes,
                );
                if !self.hold_other_for_graphs(held) {
                    self.give_back_module(ctx, m.handle, m.shared, m.data_bytes);
                }
            }
            Op::ModuleLoad => {
                let m = rec::<wire::ModuleLoad>(p);
                self.channel(m.call.channel)?;
                let blob = match self.take_blob(m.call.channel, m.blob_len, code::INVALID_IMAGE) {
                    Ok(b) => b,
                    Err(e) => return self.complete(m.call, e, &[]),
                };
                // The driver reads the image by what it says of itself: a lie would have it
                // read past the copy (or, for an empty one, from a dangling pointer).
                if let Err(why) = omps_ring::image::check_image(&blob) {
                    self.log_refusal(format_args!("module image refused: {why}"));
                    return self.complete(m.call, code::INVALID_IMAGE, &[]);
                }
                // An image loaded before (by any client) costs no load, which would wait for
                // every running kernel and hold up every client's launches meanwhile.
                let share = ctx.shared.modules.shareable(&blob);
                let hit = share.then(|| ctx.shared.modules.get(&blob)).flatten();
                if let Some((loaded, d, printf)) = hit {
                    self.uses_printf(printf);
                    return self.finish_module_load(ctx, m.call, loaded, Some(d), 0, None);
                }
                // Its variables count against the client's memory limit, before anything
                // is loaded (a shareable image has none).
                let need = if share {
                    0
                } else {
                    gpu.image_data_bytes(&blob)
                };
                let need = match self.charge_image(ctx, need) {
                    Ok(n) => n,
                    Err(e) => return self.complete(m.call, e.0, &[]),
                };
                // A new image is loaded first where a crash of the driver's parser harms
                // no one (crate::verifier), then by the driver: both off the lane
                // (crate::image::compile), so that a slow one holds up its own client only.
                let cc = ctx.shared.modules.cc();
                self.compile(ctx, m.call, need, move |wanted: &Wanted| {
                    let verdict = crate::image::verifier::check(
                        wanted.tenant(),
                        gpu.ordinal(),
                        &cc.to_le_bytes(),
                        &blob,
                        Work::Load,
                    );
                    if verdict == crate::image::verifier::Verdict::Crashed {
                        return Outcome::Refused(Work::Load);
                    }
                    // A client gone during the check costs no driver load.
                    if wanted.gone() {
                        return Outcome::Abandoned;
                    }
                    let r = gpu.module_load(&blob);
                    let defaults = match &r {
                        Ok(loaded) if share => Some(settable_defaults(&*gpu, loaded)),
                        _ => None,
                    };
                    Outcome::Load {
                        r,
                        defaults,
                        printf: omps_ring::image::printf_use(&blob, cc),
                        blob,
                    }
                })?;
            }
            Op::ModuleGetGlobal => {
                let g = rec::<wire::ModuleGetGlobal>(p);
                if tail.len() != g.name_len as usize {
                    return bad("global name length");
                }
                let m = self
                    .modules
                    .get(&g.module)
                    .ok_or_else(|| Malformed(format!("unknown module {}", g.module)))?;
                // A shared module has no variables of the client's; the toolchain's own
                // tables in it are not the client's to write.
                let r = match std::str::from_utf8(tail) {
                    Ok(name) if !m.shared => gpu.module_global(m.handle, name),
                    _ => Err(CuError(code::NOT_FOUND)),
                };
                if let Ok((p, n)) = r {
                    // Until the module goes: then the range may be another client's.
                    self.globals.insert(p, (n, g.module));
                }
                self.complete_pod(g.call, r.map(|(ptr, size)| wire::GlobalReply { ptr, size }))?;
            }
            Op::FuncGetAttribute => {
                let a = rec::<wire::FuncGetAttribute>(p);
                let f = self
                    .functions
                    .get(&a.func)
                    .ok_or_else(|| Malformed(format!("unknown function {}", a.func)))?;
                // A shared module's function reads as this client left it.
                let own = f.shared.as_ref().and_then(|d| {
                    let k = SETTABLE.iter().position(|&x| x == a.attr)?;
                    self.fn_attrs.get(&(a.func, a.attr)).copied().or(d[k])
                });
                let r = own.map_or_else(|| gpu.func_attribute(f.handle, a.attr), Ok);
                self.complete_pod(
                    a.call,
                    r.map(|v| wire::U64Reply {
                        value: v as u32 as u64,
                    }),
                )?;
            }
            Op::FuncSetAttribute => {
                let a = rec::<wire::FuncSetAttribute>(p);
                let f = self
                    .functions
                    .get(&a.func)
                    .ok_or_else(|| Malformed(format!("unknown function {}", a.func)))?;
                let shared = f.shared.is_some();
                let cache = &ctx.shared.modules;
                let r = set_function_attribute(&*gpu, cache, f.handle, a.attr, a.value, shared);
                if shared && r.is_ok() {
                    self.fn_attrs.insert((a.func, a.attr), a.value);
                }
                self.complete(a.call, r.err().map_or(0, |e| e.0), &[])?;
            }
            _ => unreachable!("dispatched to the modules family: {op:?}"),
        }
        Ok(())
    }

    /// A module this client is done with: its own is unloaded once its work is done; a
    /// shared one loses a user (and the cache may give back idle ones).
    /// Gives a module back (a shared one to the cache), with the `charged` bytes its
    /// variables took of the client's memory.
    pub(super) fn give_back_module(
        &mut self,
        ctx: &mut WorkerCtx,
        handle: u64,
        shared: bool,
        charged: u64,
    ) {
        let modules = match shared {
            true => ctx.shared.modules.release(handle).unwrap_or_default(),
            false => vec![handle],
        };
        if !modules.is_empty() || charged > 0 {
            ctx.release_later(
                self,
                Release {
                    modules,
                    module_bytes: charged,
                    ..Default::default()
                },
            );
        }
    }

    /// Charges the variables of an image about to be loaded (`need` bytes; u64::MAX: sizes
    /// the server cannot read, so any size): the bytes charged. Unreadable sizes are
    /// refused to a client with a limit, and charge nothing to one without.
    pub(super) fn charge_image(&mut self, ctx: &mut WorkerCtx, need: u64) -> Result<u64, CuError> {
        if need == u64::MAX {
            if self.client.limit(self.dev).is_some() {
                self.log_refusal(format_args!(
                    "module refused: PTX variable sizes the server cannot read, over a limit"
                ));
                return Err(CuError(code::OUT_OF_MEMORY));
            }
            return Ok(0);
        }
        self.charge(ctx, need).map(|()| need)
    }

    /// The client loaded code of printf level `level` (wire::printf_use).
    pub(super) fn uses_printf(&self, level: u64) {
        // Before the code can run: its first text must find its client.
        if let Some(router) = &self.client.printf {
            router.declare_unless_gone(self.client.id, level, &self.client.gone);
        }
    }

    /// Registers the module's functions and writes the function table into chunk 0; the
    /// answer is its head, or `answer` where given (a JIT load's log lengths).
    pub(super) fn finish_module_load(
        &mut self,
        ctx: &mut WorkerCtx,
        call: CallHdr,
        loaded: crate::gpu::LoadedModule,
        defaults: Option<Defaults>,
        charged: u64,
        answer: Option<wire::LinkReply>,
    ) -> Result<(), Malformed> {
        let shared = defaults.is_some();
        let nf = loaded.functions.len();
        // The module's id and one per function, never wrapping into ids in use.
        if self.next_id.checked_add(1 + nf as u32).is_none() {
            self.give_back_module(ctx, loaded.handle, shared, charged);
            return self.complete(call, code::OUT_OF_MEMORY, &[]);
        }
        let module_id = self.next_id;
        self.next_id += 1;
        let np: usize = loaded.functions.iter().map(|f| f.params.len()).sum();
        let names_at = 16 + nf * 32 + np * 8;
        let mut out = Vec::with_capacity(names_at + nf * 32);
        let mut descs = Vec::with_capacity(nf);
        let mut params = Vec::with_capacity(np * 8);
        let mut names = Vec::new();
        let mut fids = Vec::with_capacity(nf);
        for (k, f) in loaded.functions.iter().enumerate() {
            let id = self.next_id;
            self.next_id += 1;
            fids.push(id);
            descs.push(wire::FunctionDesc {
                func: id,
                max_threads_per_block: f.max_threads_per_block,
                static_shared: f.static_shared,
                max_dynamic_shared: f.max_dynamic_shared,
                name_offset: (names_at + names.len()) as u32,
                name_len: f.name.len() as u32,
                first_param: (params.len() / 8) as u32,
                num_params: f.params.len() as u32,
            });
            for &(o, s) in &f.params {
                wire::put(&mut params, &wire::ParamDesc { offset: o, size: s });
            }
            names.extend_from_slice(f.name.as_bytes());
            self.functions.insert(
                id,
                Function {
                    handle: f.handle,
                    args_size: f.args_size(),
                    module: module_id,
                    shared: defaults
                        .as_ref()
                        .map(|d| d.get(k).copied().unwrap_or_default()),
                },
            );
        }
        let total = names_at + names.len();
        wire::put(
            &mut out,
            &wire::ModuleReply {
                module: module_id,
                num_functions: nf as u32,
                total_len: total as u32,
                _pad: 0,
            },
        );
        for d in &descs {
            wire::put(&mut out, d);
        }
        out.extend_from_slice(&params);
        out.extend_from_slice(&names);
        let (chunk, cap) = self
            .client
            .seg
            .chunk(call.channel as usize, 0)
            .expect("channel checked by caller");
        if out.len() > cap {
            for id in &fids {
                self.functions.remove(id);
            }
            self.give_back_module(ctx, loaded.handle, shared, charged);
            return self.complete(call, code::NOT_SUPPORTED, &[]);
        }
        // SAFETY: out fits in chunk 0 of a checked channel, inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), chunk, out.len()) };
        self.modules.insert(
            module_id,
            Module {
                handle: loaded.handle,
                functions: fids,
                shared,
                data_bytes: charged,
            },
        );
        debug_assert!(self
            .functions
            .values()
            .all(|f| self.modules.contains_key(&f.module)));
        let head = wire::ModuleReply {
            module: module_id,
            num_functions: nf as u32,
            total_len: total as u32,
            _pad: 0,
        };
        match answer {
            Some(a) => self.complete(call, 0, bytemuck::bytes_of(&a)),
            None => self.complete(call, 0, bytemuck::bytes_of(&head)),
        }
    }
}

/// Sets a function attribute. On a shared module's function, the two attributes a launch
/// can depend on (the dynamic shared memory allowed, non-portable cluster sizes) are only
/// ever raised, under the cache's lock (two lanes may serve clients of one module): one
/// client lowering them would make another's launches fail. A required cluster shape
/// would be forced on every client's launches: refused. The others only tune performance.
fn set_function_attribute(
    gpu: &dyn crate::gpu::Gpu,
    cache: &crate::image::module_cache::ModuleCache,
    f: u64,
    attr: i32,
    value: i32,
    shared: bool,
) -> Result<(), CuError> {
    const MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;
    const REQUIRED_CLUSTER_SHAPE: std::ops::RangeInclusive<i32> = 11..=13;
    const NON_PORTABLE_CLUSTER_SIZE_ALLOWED: i32 = 14;
    if !shared {
        return gpu.func_set_attribute(f, attr, value);
    }
    if REQUIRED_CLUSTER_SHAPE.contains(&attr) {
        return Err(CuError(code::NOT_SUPPORTED));
    }
    let _one_at_a_time = cache.attr_lock();
    let raise_only = matches!(
        attr,
        MAX_DYNAMIC_SHARED_SIZE_BYTES | NON_PORTABLE_CLUSTER_SIZE_ALLOWED
    );
    if raise_only && gpu.func_attribute(f, attr)? >= value {
        return Ok(());
    }
    gpu.func_set_attribute(f, attr, value)
}

/// The [`SETTABLE`] attributes of each function of a module just loaded.
fn settable_defaults(gpu: &dyn crate::gpu::Gpu, m: &crate::gpu::LoadedModule) -> Defaults {
    std::sync::Arc::new(
        m.functions
            .iter()
            .map(|f| SETTABLE.map(|a| gpu.func_attribute(f.handle, a).ok()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::printf::{PrintfRouter, Stream};
    use omps_ring::wire::printf_use;
    use std::io::Write;
    use std::os::fd::FromRawFd;

    #[test]
    fn a_loaded_images_level_reaches_the_router_before_any_text() {
        let host = Arc::new(crate::gpu::host::HostGpu::new(0, 1 << 24));
        let gpu: Arc<dyn crate::gpu::Gpu> = host.clone();
        let router = Arc::new(PrintfRouter::new(false).expect("router"));
        let (client, _peer) =
            crate::testing::fake_client_printing(&gpu, 7, Some(router.clone())).expect("client");
        // SAFETY: the fake client's segment has ring 0 and lives as long as the session.
        let s = unsafe { Session::new(client, 0) };
        // What a worker does on loading code that asserts; no control thread runs here.
        s.uses_printf(printf_use::ASSERT);
        // The driver writes the assert's message at once.
        // SAFETY: the router's pipe, open while it lives; ManuallyDrop leaves it open.
        let mut err = std::mem::ManuallyDrop::new(unsafe {
            std::fs::File::from_raw_fd(router.write_fd(Stream::Err))
        });
        err.write_all(b"Assertion failed.\n").unwrap();
        let got = router.flush(&*gpu, 7, 1 << 10);
        assert_eq!(
            got.err, b"Assertion failed.\n",
            "the client's, not the log's"
        );
        assert_eq!(router.unattributed(), 0);
    }

    #[test]
    fn a_client_retired_while_its_load_ran_is_not_declared_again() {
        let host = Arc::new(crate::gpu::host::HostGpu::new(0, 1 << 24));
        let gpu: Arc<dyn crate::gpu::Gpu> = host.clone();
        let router = Arc::new(PrintfRouter::new(false).expect("router"));
        let (client, _peer) =
            crate::testing::fake_client_printing(&gpu, 7, Some(router.clone())).expect("client");
        // SAFETY: the fake client's segment has ring 0 and lives as long as the session.
        let s = unsafe { Session::new(client.clone(), 0) };
        // The control thread retires it (gone, then forgotten) while its worker loads a
        // printing image; the worker's declaration comes last.
        client.gone.store(true, Ordering::SeqCst);
        router.forget(7);
        s.uses_printf(printf_use::YES);
        // Another client prints: its text is its own, not "several printing clients".
        router.declare(8, printf_use::YES);
        // SAFETY: the router's pipe, open while it lives; ManuallyDrop leaves it open.
        let mut out = std::mem::ManuallyDrop::new(unsafe {
            std::fs::File::from_raw_fd(router.write_fd(Stream::Out))
        });
        out.write_all(b"eight\n").unwrap();
        assert_eq!(router.flush(&*gpu, 8, 1 << 10).out, b"eight\n");
        assert_eq!(router.unattributed(), 0);
    }
}
