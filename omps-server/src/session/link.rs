//! JIT linking (cuLinkCreate / AddData / Complete) for one client: the shim uploads its
//! inputs and value options in one container ([`wire::link`]), the driver links them here,
//! and the image and logs wait in the channel until the shim fetches them piece by piece.
//! Everything in the container is hostile: counts, lengths and names are checked against
//! what was uploaded before anything is used.

use super::kinds::compile::{Outcome, Wanted};
use super::{bad, Malformed, Session};
use crate::gpu::{code, CuError, GpuResult};
use crate::image::verifier::Work;
use crate::worker::WorkerCtx;
use omps_ring::segment::Word;
use omps_ring::wire::{self, link};
use std::borrow::Cow;

/// A parsed container: value options and (kind, name, data) inputs borrowing the blob.
type Parsed<'a> = (Vec<(u32, u64)>, Vec<(u32, &'a str, &'a [u8])>);

fn parse(blob: &[u8]) -> Result<Parsed<'_>, String> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let end = at
            .checked_add(n)
            .filter(|&e| e <= blob.len())
            .ok_or("container truncated")?;
        let s = &blob[at..end];
        at = end;
        Ok(s)
    };
    let h: link::Header = bytemuck::pod_read_unaligned(take(std::mem::size_of::<link::Header>())?);
    if h.num_options > 64 || h.num_inputs > 4096 {
        return Err("too many link options or inputs".into());
    }
    let mut options = Vec::new();
    for _ in 0..h.num_options {
        let o: link::Opt = bytemuck::pod_read_unaligned(take(std::mem::size_of::<link::Opt>())?);
        if !link::value_option(o.option) {
            return Err(format!("link option {} is not a value", o.option));
        }
        options.push((o.option, o.value));
    }
    let mut inputs = Vec::new();
    for _ in 0..h.num_inputs {
        let i: link::Input =
            bytemuck::pod_read_unaligned(take(std::mem::size_of::<link::Input>())?);
        let name =
            std::str::from_utf8(take(i.name_len as usize)?).map_err(|_| "input name not UTF-8")?;
        let data = take(usize::try_from(i.data_len).map_err(|_| "input length")?)?;
        inputs.push((i.kind, name, data));
    }
    Ok((options, inputs))
}

/// CU_JIT_INPUT_PTX.
const PTX_INPUT: u32 = 1;

/// Why a link input must not reach the driver, if it must not. CUjitInputType: text kinds
/// (PTX, NVVM IR, LTO IR as text) are read up to their NUL; cubins and fatbins by their
/// headers, as module images; objects and libraries are archives and ELF files the
/// linker bounds by the length given.
fn input_unsafe(kind: u32, data: &[u8]) -> Option<&'static str> {
    const CUBIN: u32 = 0;
    const FATBINARY: u32 = 2;
    match kind {
        PTX_INPUT if !data.contains(&0) => Some("PTX text with no NUL"),
        CUBIN | FATBINARY => omps_ring::image::check_image(data).err(),
        _ if data.is_empty() => Some("an empty input"),
        _ => None,
    }
}

/// A link container as the driver is to get it: value options, and inputs (kind, name,
/// bytes), PTX text given its NUL (a copy only for text sent without one).
pub(crate) type Prepared<'a> = (Vec<(u32, u64)>, Vec<(u32, &'a str, Cow<'a, [u8]>)>);

/// Parses `blob` and makes its inputs safe for the driver to read: the server's link and
/// the verifier child's go through here, so the child links exactly what the server would.
/// Err where the container is malformed, Ok(Err(why)) where an input must not reach the
/// driver (a lie about itself).
pub(crate) fn prepare(blob: &[u8]) -> Result<Result<Prepared<'_>, &'static str>, String> {
    let (options, inputs) = parse(blob)?;
    let inputs: Vec<(u32, &str, Cow<[u8]>)> = inputs
        .into_iter()
        .map(|(kind, name, data)| {
            // The driver reads PTX up to its NUL: text sent without one (a length of
            // strlen, which the driver takes natively, reading on into the program's
            // buffer) gets one here, so the driver stops inside this copy.
            let data = if kind == PTX_INPUT && !data.contains(&0) {
                Cow::Owned([data, &[0u8][..]].concat())
            } else {
                Cow::Borrowed(data)
            };
            (kind, name, data)
        })
        .collect();
    // The driver reads binary inputs by what they say of themselves: a lie would have it
    // read past this copy (issue 23, finding 1).
    Ok(
        match inputs
            .iter()
            .find_map(|(kind, _, data)| input_unsafe(*kind, data))
        {
            Some(why) => Err(why),
            None => Ok((options, inputs)),
        },
    )
}

/// Borrowed views of prepared inputs, as [`crate::gpu::Gpu::link`] takes them.
pub(crate) fn as_inputs<'a>(
    inputs: &'a [(u32, &'a str, Cow<'a, [u8]>)],
) -> Vec<(u32, &'a str, &'a [u8])> {
    inputs.iter().map(|(k, n, d)| (*k, *n, &d[..])).collect()
}

/// Value options, and the PTX they compile.
pub(crate) type JitLoad<'a> = (Vec<(u32, u64)>, &'a [u8]);

/// A JIT load's container: its value options and its one PTX input, NUL-terminated as the
/// driver reads it. Err where the container is malformed or holds other than one PTX
/// input, Ok(None) where that input is not PTX ending in a NUL (the server and the
/// verifier child read it alike).
pub(crate) fn jit_container(blob: &[u8]) -> Result<Option<JitLoad<'_>>, String> {
    let (options, inputs) = parse(blob)?;
    let [(PTX_INPUT, _, ptx)] = inputs[..] else {
        return Err("jit load: not one PTX input".into());
    };
    Ok((omps_ring::image::is_ptx(ptx) && ptx.contains(&0)).then_some((options, ptx)))
}

/// The verifier child's answer on a link container: the CUresult of `link` given the
/// inputs [`prepare`] makes (the driver's own, or the host GPU's in tests).
pub fn link_verdict(
    container: &[u8],
    link: impl FnOnce(&[(u32, u64)], &[(u32, &str, &[u8])]) -> GpuResult<()>,
) -> i32 {
    match prepare(container) {
        Err(_) => code::INVALID_VALUE,
        Ok(Err(_)) => code::INVALID_IMAGE,
        Ok(Ok((options, inputs))) => {
            link(&options, &as_inputs(&inputs)).map_or_else(|e| e.0, |()| 0)
        }
    }
}

/// The verifier child's answer on a JIT load's container: the CUresult of `compile`
/// given its PTX and options.
pub fn jit_verdict(
    container: &[u8],
    compile: impl FnOnce(&[u8], &[(u32, u64)]) -> GpuResult<()>,
) -> i32 {
    match jit_container(container) {
        Err(_) => code::INVALID_VALUE,
        Ok(None) => code::INVALID_IMAGE,
        Ok(Some((options, ptx))) => compile(ptx, &options).map_or_else(|e| e.0, |()| 0),
    }
}

impl Session {
    pub(super) fn handle_link(
        &mut self,
        ctx: &mut WorkerCtx,
        l: wire::ModuleLoad,
    ) -> Result<(), Malformed> {
        self.channel(l.call.channel)?;
        let blob = match self.take_blob(l.call.channel, l.blob_len, code::INVALID_VALUE) {
            Ok(b) => b,
            Err(e) => return self.complete(l.call, e, &[]),
        };
        if let Err(why) = prepare(&blob).map_err(Malformed)? {
            self.log_refusal(format_args!("link input refused: {why}"));
            return self.refuse_link(l.call);
        }
        // Linked first where a crash of the driver's linker harms no one (finding 1): the
        // verifier child links the same container. Both off the lane (crate::image::compile).
        let gpu = ctx.gpu.clone();
        let device = ctx.shared.modules.cc().to_le_bytes();
        self.compile(ctx, l.call, 0, move |wanted: &Wanted| {
            if crate::image::verifier::check(
                wanted.tenant(),
                gpu.ordinal(),
                &device,
                &blob,
                Work::Link,
            ) == crate::image::verifier::Verdict::Crashed
            {
                return Outcome::Refused(Work::Link);
            }
            // A client gone during the check costs the driver nothing.
            if wanted.gone() {
                return Outcome::Abandoned;
            }
            // The same bytes the lane parsed: prepared alike here.
            let (r, info, error) = match prepare(&blob) {
                Ok(Ok((options, inputs))) => gpu.link(&options, &as_inputs(&inputs)),
                _ => (
                    Err(CuError(code::INVALID_VALUE)),
                    String::new(),
                    String::new(),
                ),
            };
            Outcome::Link { r, info, error }
        })
    }

    /// A link refused before the driver saw it: CUDA_ERROR_INVALID_IMAGE, no image.
    pub(super) fn refuse_link(&mut self, call: wire::CallHdr) -> Result<(), Malformed> {
        let reply = wire::LinkReply::default();
        self.link_out[call.channel as usize] = Vec::new();
        self.complete(call, code::INVALID_IMAGE, bytemuck::bytes_of(&reply))
    }

    /// PTX with JIT options, as cuModuleLoadDataEx gets it (a container of value options
    /// and one PTX input): the driver's module load compiles it with those options, the
    /// function table goes into chunk 0 as for ModuleLoad, and the logs wait for BlobFetch,
    /// their lengths in the answer (a LinkReply with no image), on failure too.
    pub(super) fn handle_jit_load(
        &mut self,
        ctx: &mut WorkerCtx,
        l: wire::ModuleLoad,
    ) -> Result<(), Malformed> {
        self.channel(l.call.channel)?;
        let blob = match self.take_blob(l.call.channel, l.blob_len, code::INVALID_VALUE) {
            Ok(b) => b,
            Err(e) => return self.complete(l.call, e, &[]),
        };
        // The driver reads PTX up to its NUL.
        let Some((_, ptx)) = jit_container(&blob).map_err(Malformed)? else {
            return self.complete(l.call, code::INVALID_IMAGE, &[]);
        };
        // Charged first (a load over the client's limit costs no compile), then compiled,
        // with the client's options, where a crash of the driver's compiler harms no one,
        // then by the driver: both off the lane (crate::image::compile).
        let gpu = ctx.gpu.clone();
        let need = match self.charge_image(ctx, gpu.image_data_bytes(ptx)) {
            Ok(n) => n,
            Err(e) => return self.complete(l.call, e.0, &[]),
        };
        let cc = ctx.shared.modules.cc();
        self.compile(ctx, l.call, need, move |wanted: &Wanted| {
            if crate::image::verifier::check(
                wanted.tenant(),
                gpu.ordinal(),
                &cc.to_le_bytes(),
                &blob,
                Work::Jit,
            ) == crate::image::verifier::Verdict::Crashed
            {
                return Outcome::Refused(Work::Jit);
            }
            // A client gone during the check costs the driver nothing.
            if wanted.gone() {
                return Outcome::Abandoned;
            }
            // The same bytes the lane read: one PTX input here too.
            let Ok(Some((options, ptx))) = jit_container(&blob) else {
                let r = Err(CuError(code::INVALID_IMAGE));
                return Outcome::Jit {
                    r,
                    info: String::new(),
                    error: String::new(),
                    printf: 0,
                };
            };
            let (r, info, error) = gpu.module_load_jit(ptx, &options);
            Outcome::Jit {
                r,
                info,
                error,
                printf: omps_ring::image::printf_use(ptx, cc),
            }
        })
    }

    pub(super) fn handle_blob_fetch(&mut self, c: wire::ChunkCopy) -> Result<(), Malformed> {
        let (ptr, _) = self.chunk(&c)?;
        let out = &self.link_out[c.channel as usize];
        let from = usize::try_from(c.dev).unwrap_or(usize::MAX);
        let Some(piece) = from
            .checked_add(c.len as usize)
            .and_then(|end| out.get(from..end))
        else {
            return bad("blob fetch outside the link output");
        };
        // SAFETY: chunk() checked the chunk lies in the segment and holds c.len bytes.
        unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), ptr, piece.len()) };
        self.signal_now(c.channel, Word::Chunk(c.chunk as u8), c.seq, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(opts: &[(u32, u64)], inputs: &[(u32, &str, &[u8])]) -> Vec<u8> {
        let opts: Vec<link::Opt> = opts
            .iter()
            .map(|&(option, value)| link::Opt {
                option,
                _pad: 0,
                value,
            })
            .collect();
        link::encode(&opts, inputs.iter().copied())
    }

    #[test]
    fn link_inputs_the_driver_would_read_past_are_refused() {
        assert_eq!(
            input_unsafe(1, b".version 8.0"),
            Some("PTX text with no NUL")
        );
        assert_eq!(input_unsafe(1, b".version 8.0\0"), None);
        assert!(
            input_unsafe(0, b"\x7fELF\x02\x01\x01").is_some(),
            "a truncated cubin"
        );
        assert!(input_unsafe(2, &[0x50, 0xed, 0x55, 0xba, 1, 0, 16, 0]).is_some());
        assert_eq!(input_unsafe(3, b""), Some("an empty input"));
    }

    #[test]
    fn a_container_parses_and_lies_are_refused() {
        let c = container(&[(7, 3)], &[(1, "a.ptx", b"ptx\0"), (0, "b", b"cubin")]);
        let (o, i) = parse(&c).unwrap();
        assert_eq!(o, vec![(7, 3)]);
        assert_eq!(i[1], (0, "b", &b"cubin"[..]));
        assert!(parse(&c[..c.len() - 1]).is_err(), "truncated");
        let ptr_opt = container(&[(3, 0xdead)], &[]);
        assert!(
            parse(&ptr_opt).is_err(),
            "a log buffer pointer is not a value"
        );
        let mut huge = container(&[], &[(1, "x", b"y")]);
        huge[8 + 8..8 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse(&huge).is_err(), "length past the end");
    }
}
