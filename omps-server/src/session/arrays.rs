//! CUDA arrays, mipmapped arrays, copies to and from them, and texture and surface objects
//! for one client.
//!
//! Each is the client's own, named by an id of this session: a record naming an id it
//! does not hold is a lie. Arrays count as the client's memory from creation to release.
//! Copies check their device side against the client's memory, the driver the array
//! side. A texture over device memory must lie in the client's memory. What the client
//! destroys, or leaves behind, goes once its queued work is done (`crate::release::releaser`).

use super::kinds::graph_held::HeldForGraphs;
use super::*;
use crate::gpu::{ArrayShape, CopyPlace, Resource};
use omps_ring::wire::{array, tex};

fn shape(a: &[u64; 7]) -> Result<ArrayShape, Malformed> {
    let narrow = |v: u64, what: &str| {
        u32::try_from(v).map_err(|_| Malformed(format!("array {what} out of range")))
    };
    Ok(ArrayShape {
        width: a[0],
        height: a[1],
        depth: a[2],
        format: narrow(a[3], "format")?,
        channels: narrow(a[4], "channels")?,
        flags: narrow(a[5], "flags")?,
    })
}

impl Session {
    pub(super) fn handle_arrays(
        &mut self,
        ctx: &mut WorkerCtx,
        op: Op,
        p: &[u8],
        tail: &[u8],
    ) -> Result<(), Malformed> {
        fixed_only(tail, "array op")?;
        match op {
            Op::Array => self.array_call(ctx, rec::<wire::ArrayCall>(p)),
            Op::ArrayCopy => self.array_copy(ctx, rec::<wire::ArrayCopy>(p)),
            Op::TexObject => self.tex_call(ctx, rec::<wire::TexCall>(p)),
            _ => unreachable!("dispatched to the arrays family: {op:?}"),
        }
    }

    fn array_call(&mut self, ctx: &mut WorkerCtx, c: wire::ArrayCall) -> Result<(), Malformed> {
        let gpu = ctx.gpu.clone();
        let dev = self.dev;
        let r: Result<u64, CuError> = match c.kind {
            array::CREATE | array::CREATE_MIPMAPPED => {
                let s = shape(&c.args)?;
                let levels = match c.kind {
                    array::CREATE => 0,
                    _ => u32::try_from(c.args[6])
                        .map_err(|_| Malformed("mipmap levels out of range".into()))?,
                };
                if self.arrays.full(self.held_arrays()) {
                    Err(CuError(code::OUT_OF_MEMORY))
                } else if levels > crate::gpu::MAX_MIP_LEVELS {
                    // More than any extent halves in: the driver's answer, before any cost.
                    Err(CuError(code::INVALID_VALUE))
                } else {
                    // Charged before it is made (its size follows from its shape), so a
                    // client over its limit never holds GPU memory, even for a moment.
                    let need = crate::gpu::shape_bytes(&s, levels);
                    if let Err(e) = self.charge(ctx, need) {
                        Err(e)
                    } else {
                        let made = match c.kind {
                            array::CREATE => gpu.array_create(&s),
                            _ => gpu.mipmap_create(&s, levels),
                        };
                        match made {
                            Ok((h, _)) if c.kind == array::CREATE => {
                                Ok(self.arrays.add_array(h, need, false) as u64)
                            }
                            Ok((h, _)) => {
                                let id = self.arrays.new_id();
                                self.arrays.mipmaps.insert(id, (h, need, Vec::new()));
                                Ok(id as u64)
                            }
                            Err(e) => {
                                self.client.uncharge(dev, need);
                                Err(e)
                            }
                        }
                    }
                }
            }
            array::LEVEL => {
                let Some(&(m, _, _)) = self.arrays.mipmaps.get(&c.id) else {
                    return bad(format!("level of unknown mipmapped array {}", c.id));
                };
                let level = u32::try_from(c.args[0]).unwrap_or(u32::MAX);
                let known = self.arrays.mipmaps[&c.id]
                    .2
                    .iter()
                    .find(|&&(l, _)| l == level);
                match known {
                    // The same level asked again is the same array.
                    Some(&(_, id)) => Ok(id as u64),
                    None if self.arrays.full(self.held_arrays()) => {
                        Err(CuError(code::OUT_OF_MEMORY))
                    }
                    None => gpu.mipmap_level(m, level).map(|h| {
                        // Charged nothing: the mipmapped array was.
                        let id = self.arrays.add_array(h, 0, true);
                        let levels = &mut self.arrays.mipmaps.get_mut(&c.id).expect("looked up").2;
                        levels.push((level, id));
                        id as u64
                    }),
                }
            }
            array::DESTROY => match self.arrays.arrays.get(&c.id) {
                None => return bad(format!("destroying unknown array {}", c.id)),
                // A level is its mipmapped array's to destroy.
                Some(&(_, _, true)) => Err(CuError(code::INVALID_VALUE)),
                Some(_) => {
                    let (h, n, _) = self.arrays.arrays.remove(&c.id).expect("looked up");
                    // A graph's memcpy node may name it: held while graphs live.
                    let held = self.arrays.captured.remove(&h)
                        && self.hold_other_for_graphs(HeldForGraphs::Array(h, n, false));
                    if !held {
                        let mut rel = Release::default();
                        rel.arrays.arrays.push((h, n));
                        ctx.release_later(self, rel);
                    }
                    Ok(0)
                }
            },
            array::DESTROY_MIPMAPPED => {
                let Some((h, n, levels)) = self.arrays.mipmaps.remove(&c.id) else {
                    return bad(format!("destroying unknown mipmapped array {}", c.id));
                };
                let mut copied = false;
                for (_, id) in levels {
                    if let Some((l, _, _)) = self.arrays.arrays.remove(&id) {
                        copied |= self.arrays.captured.remove(&l);
                    }
                }
                // As an array: a level a capture copied holds it while graphs live.
                let held = copied && self.hold_other_for_graphs(HeldForGraphs::Array(h, n, true));
                if !held {
                    let mut rel = Release::default();
                    rel.arrays.mipmaps.push((h, n));
                    ctx.release_later(self, rel);
                }
                Ok(0)
            }
            k => return bad(format!("array call kind {k}")),
        };
        self.complete_pod(c.call, r.map(|value| wire::U64Reply { value }))
    }

    /// A copy side as the driver takes it: the array's handle, or device memory of the
    /// client's that holds every row the copy touches.
    fn copy_place(
        &mut self,
        s: &wire::CopySide,
        extent: [u64; 3],
    ) -> Result<Option<CopyPlace>, Malformed> {
        if s.array != 0 {
            let Some(&(h, _, _)) = self.arrays.arrays.get(&s.array) else {
                return Err(Malformed(format!("copy with unknown array {}", s.array)));
            };
            return Ok(Some(CopyPlace {
                array: Some(h),
                x: s.x,
                y: s.y,
                z: s.z,
                ..Default::default()
            }));
        }
        let [w, h, d] = [extent[0], extent[1].max(1), extent[2].max(1)];
        let pitch = s.pitch.max(w);
        let height = s.height.max(s.y.saturating_add(h));
        // First byte and one past the last the copy touches.
        let span = (|| {
            let first = s.dev.checked_add(s.x)?.checked_add(
                s.y.checked_add(s.z.checked_mul(height)?)?
                    .checked_mul(pitch)?,
            )?;
            let last_row = (h - 1).checked_add((d - 1).checked_mul(height)?)?;
            let len = last_row.checked_mul(pitch)?.checked_add(w)?;
            Some((first, len))
        })();
        let Some((first, len)) = span else {
            self.note_error(CuError(code::INVALID_VALUE));
            return Ok(None);
        };
        if !self.check_range(first, len) {
            return Ok(None);
        }
        Ok(Some(CopyPlace {
            array: None,
            x: s.x,
            y: s.y,
            z: s.z,
            dev: s.dev,
            pitch,
            height,
        }))
    }

    fn array_copy(&mut self, ctx: &mut WorkerCtx, c: wire::ArrayCopy) -> Result<(), Malformed> {
        if c.src.array == 0 && c.dst.array == 0 {
            return bad("array copy without an array");
        }
        let extent = [c.width, c.height, c.depth];
        if c.width == 0 {
            return Ok(());
        }
        let Some(s) = self.stream(ctx, c.stream)? else {
            return Ok(());
        };
        let (Some(src), Some(dst)) = (
            self.copy_place(&c.src, extent)?,
            self.copy_place(&c.dst, extent)?,
        ) else {
            return Ok(());
        };
        if self.streams.get(&c.stream).is_some_and(|st| st.capturing) {
            // The graph's node names the arrays (graph_memory.rs).
            self.arrays
                .captured
                .extend(src.array.into_iter().chain(dst.array));
        }
        if let Err(e) = ctx.gpu.clone().array_copy(&src, &dst, extent, s) {
            self.note_error(e);
        }
        Ok(())
    }

    fn tex_call(&mut self, ctx: &mut WorkerCtx, c: wire::TexCall) -> Result<(), Malformed> {
        let gpu = ctx.gpu.clone();
        let r: Result<u64, CuError> = match c.kind {
            tex::CREATE_TEXTURE | tex::CREATE_SURFACE => {
                let res = match c.res_type {
                    0 => match self.arrays.arrays.get(&c.array) {
                        Some(&(h, _, _)) => Resource::Array(h),
                        None => return bad(format!("texture over unknown array {}", c.array)),
                    },
                    1 if c.kind == tex::CREATE_TEXTURE => match self.arrays.mipmaps.get(&c.array) {
                        Some(&(h, _, _)) => Resource::Mipmapped(h),
                        None => {
                            return bad(format!("texture over unknown mipmapped array {}", c.array))
                        }
                    },
                    2 if c.kind == tex::CREATE_TEXTURE => Resource::Linear {
                        dev: c.dev,
                        format: c.format,
                        channels: c.channels,
                        size: c.size,
                    },
                    3 if c.kind == tex::CREATE_TEXTURE => Resource::Pitch2D {
                        dev: c.dev,
                        format: c.format,
                        channels: c.channels,
                        width: c.width,
                        height: c.height,
                        pitch: c.pitch,
                    },
                    t => return bad(format!("resource type {t}")),
                };
                // Device memory a texture reads must be the client's.
                let memory = match res {
                    Resource::Linear { dev, size, .. } => Some((dev, size)),
                    Resource::Pitch2D {
                        dev, pitch, height, ..
                    } => Some((dev, pitch.saturating_mul(height))),
                    _ => None,
                };
                if memory.is_some_and(|(d, n)| !self.owns_range(d, n)) {
                    Err(CuError(code::INVALID_VALUE))
                } else if self.arrays.full(self.held_arrays()) {
                    Err(CuError(code::OUT_OF_MEMORY))
                } else if c.kind == tex::CREATE_TEXTURE {
                    let view = (c.has_view != 0).then_some(&c.view);
                    gpu.tex_create(&res, &c.tex, view).inspect(|&t| {
                        self.arrays.textures.insert(t);
                    })
                } else {
                    let Resource::Array(a) = res else {
                        unreachable!("surfaces are over arrays")
                    };
                    gpu.surf_create(a).inspect(|&o| {
                        self.arrays.surfaces.insert(o);
                    })
                }
            }
            tex::DESTROY_TEXTURE | tex::DESTROY_SURFACE => {
                let set = if c.kind == tex::DESTROY_TEXTURE {
                    &mut self.arrays.textures
                } else {
                    &mut self.arrays.surfaces
                };
                if !set.remove(&c.object) {
                    return bad(format!("destroying unknown object {:#x}", c.object));
                }
                let mut rel = Release::default();
                if c.kind == tex::DESTROY_TEXTURE {
                    rel.arrays.textures.push(c.object);
                } else {
                    rel.arrays.surfaces.push(c.object);
                }
                ctx.release_later(self, rel);
                Ok(0)
            }
            k => return bad(format!("texture call kind {k}")),
        };
        self.complete_pod(c.call, r.map(|value| wire::U64Reply { value }))
    }
}
