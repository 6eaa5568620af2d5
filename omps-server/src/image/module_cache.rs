//! Modules shared between clients that load the same image.
//!
//! Loading code waits for all running work of the context and holds up every thread's
//! launches meanwhile (measured on an H100: 1.0 s beside a 1 s kernel, with a green context
//! too), so in one shared context a client that loads a module stalls every other client.
//! Most loads repeat: processes of one program, or of one PyTorch build, load the same
//! images. Such an image is loaded once per GPU and shared, and stays loaded a while after
//! its last user (within [`IDLE_BUDGET`]), so the next process that loads it waits for
//! nothing and stalls no one.
//!
//! Only images without data of their own are shared: a module's `__device__` and
//! `__constant__` variables would otherwise be one copy for several clients, each of which
//! may write it. The server reads the image itself to decide ([`shareable`]); it never
//! takes a client's word for it.

use crate::gpu::LoadedModule;
use omps_ring::image;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Image bytes kept loaded with no user, least recently used given back first.
pub const IDLE_BUDGET: usize = 512 << 20;

/// The function attributes a client may set (CUfunction_attribute): max dynamic shared
/// memory, shared memory carveout, required cluster width / height / depth, non-portable
/// cluster sizes, cluster scheduling policy. On a shared module each client sees its own.
pub const SETTABLE: [i32; 7] = [8, 9, 11, 12, 13, 14, 15];

/// Per function of a module, in order, its [`SETTABLE`] attributes as loaded (None where
/// the driver has no value).
pub type Defaults = Arc<Vec<[Option<i32>; 7]>>;

struct Entry {
    image: Arc<[u8]>,
    loaded: LoadedModule,
    defaults: Defaults,
    /// The image's printf level (wire::printf_use), read once when it was first loaded.
    printf: u64,
    refs: u32,
    last_used: Instant,
}

#[derive(Default)]
struct Inner {
    /// Keyed by a hash with this process's random keys (a client cannot aim collisions);
    /// a hit is confirmed byte for byte.
    by_hash: HashMap<u64, Vec<Entry>>,
    idle_bytes: usize,
}

pub struct ModuleCache {
    inner: Mutex<Inner>,
    /// Held across a read and a set of a shared function's attribute.
    attrs: Mutex<()>,
    hasher: std::collections::hash_map::RandomState,
    /// The GPU's compute capability (major * 10 + minor): which fatbin entries count.
    cc: u32,
}

impl ModuleCache {
    /// The GPU's compute capability (major * 10 + minor).
    pub fn cc(&self) -> u32 {
        self.cc
    }

    pub fn new(cc: u32) -> Self {
        ModuleCache {
            inner: Default::default(),
            attrs: Default::default(),
            hasher: Default::default(),
            cc,
        }
    }

    fn hash(&self, image: &[u8]) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(image);
        h.finish()
    }

    /// Serializes changes to shared functions' attributes.
    pub fn attr_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.attrs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `image` may be shared on this GPU.
    pub fn shareable(&self, image: &[u8]) -> bool {
        shareable(image, self.cc)
    }

    /// The module already loaded from exactly `image`, now with one more user.
    pub fn get(&self, image: &[u8]) -> Option<(LoadedModule, Defaults, u64)> {
        let key = self.hash(image);
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Inner {
            by_hash,
            idle_bytes,
        } = &mut *inner;
        let e = by_hash
            .get_mut(&key)?
            .iter_mut()
            .find(|e| &*e.image == image)?;
        if e.refs == 0 {
            *idle_bytes -= e.image.len();
        }
        e.refs += 1;
        e.last_used = Instant::now();
        Some((e.loaded.clone(), e.defaults.clone(), e.printf))
    }

    /// Records a module just loaded from `image` (a shareable one), with one user.
    pub fn insert(&self, image: Vec<u8>, loaded: LoadedModule, defaults: Defaults, printf: u64) {
        let key = self.hash(&image);
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_hash.entry(key).or_default().push(Entry {
            image: image.into(),
            loaded,
            defaults,
            printf,
            refs: 1,
            last_used: Instant::now(),
        });
    }

    /// One user of module `handle` is done with it. Returns the modules to unload now:
    /// idle ones beyond the budget, least recently used first. None for a module the
    /// cache does not hold (the caller unloads its own).
    pub fn release(&self, handle: u64) -> Option<Vec<u64>> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let e = inner
            .by_hash
            .values_mut()
            .flatten()
            .find(|e| e.loaded.handle == handle)?;
        e.refs = e.refs.saturating_sub(1);
        e.last_used = Instant::now();
        if e.refs == 0 {
            let n = e.image.len();
            inner.idle_bytes += n;
        }
        Some(inner.evict(IDLE_BUDGET))
    }

    /// Forgets every module (the context was reset: none exists any more).
    pub fn clear(&self) {
        *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = Inner::default();
    }

    /// (modules, users, idle image bytes), for the log and tests.
    pub fn census(&self) -> (usize, u32, usize) {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let all = inner.by_hash.values().flatten();
        let (n, users) = all.fold((0, 0), |(n, u), e| (n + 1, u + e.refs));
        (n, users, inner.idle_bytes)
    }
}

impl Inner {
    fn evict(&mut self, budget: usize) -> Vec<u64> {
        let mut out = Vec::new();
        while self.idle_bytes > budget {
            let oldest = self
                .by_hash
                .iter()
                .flat_map(|(k, v)| v.iter().enumerate().map(move |(i, e)| (*k, i, e)))
                .filter(|(_, _, e)| e.refs == 0)
                .min_by_key(|(_, _, e)| e.last_used)
                .map(|(k, i, _)| (k, i));
            let Some((k, i)) = oldest else { break };
            let bucket = self.by_hash.get_mut(&k).expect("found above");
            let e = bucket.swap_remove(i);
            if bucket.is_empty() {
                self.by_hash.remove(&k);
            }
            self.idle_bytes -= e.image.len();
            out.push(e.loaded.handle);
        }
        out
    }
}

/// The bytes a PTX module's `.global` and `.const` variables take as declared
/// (`.visible .global .align 4 .b8 table[4096];`): element size, vector width and every
/// dimension multiplied; `.extern` declarations take none.
fn ptx_data_bytes(ptx: &str) -> u64 {
    // The driver reads PTX up to its NUL: what follows is not the module's.
    let ptx = ptx.split('\0').next().unwrap_or("");
    ptx.split(';')
        .filter_map(|stmt| {
            let words: Vec<&str> = stmt.split_whitespace().collect();
            let space = words.iter().any(|w| *w == ".global" || *w == ".const");
            if !space || words.contains(&".extern") {
                return None;
            }
            let (at, elem) = words.iter().enumerate().find_map(|(i, w)| {
                let bytes = match w.get(2..)? {
                    "8" => 1,
                    "16" => 2,
                    "32" => 4,
                    "64" => 8,
                    _ => return None,
                };
                matches!(&w[..2], ".b" | ".u" | ".s" | ".f").then_some((i, bytes))
            })?;
            let lanes = if words.contains(&".v4") {
                4
            } else if words.contains(&".v2") {
                2
            } else {
                1
            };
            // The name and its dimensions, up to an initializer.
            let decl: String = words[at + 1..]
                .iter()
                .take_while(|w| !w.starts_with('='))
                .copied()
                .collect();
            // A dimension is a constant expression, in any base PTX takes (`[0x40000000]`);
            // one left empty takes its size from the initializer. One the server cannot
            // read counts as all memory: the driver may make it as large as it likes.
            // Only the first dimension may be left empty (as in C), and the initializer is
            // counted once: a statement of many empty dimensions once rescanned its
            // initializer for each, a worker held for minutes by one image.
            let init = stmt.split_once('=').map(|(_, i)| i);
            let count = decl
                .split('[')
                .skip(1)
                .enumerate()
                .map(|(i, d)| {
                    let d = d.split(']').next().unwrap_or("").trim();
                    match d {
                        "" if i == 0 => init.map_or(0, initializer_len),
                        "" => u64::MAX,
                        d => ptx_const(d).unwrap_or(u64::MAX),
                    }
                })
                .fold(1u64, u64::saturating_mul);
            Some(count.saturating_mul(elem * lanes))
        })
        .fold(0, u64::saturating_add)
}

/// The elements of a PTX initializer (`{1, 2, {3, 4}}`), at most: its commas, plus one.
fn initializer_len(init: &str) -> u64 {
    init.bytes().filter(|&b| b == b',').count() as u64 + 1
}

/// The value of a PTX integer constant expression: literals in decimal, hex (`0x`), octal
/// (leading `0`) or binary (`0b`), with an optional `U` suffix, combined by `+ - * / % <<
/// >> & | ^` and parentheses; None for anything else, or a result out of range.
fn ptx_const(text: &str) -> Option<u64> {
    let toks = ptx_tokens(text)?;
    let mut at = 0;
    let v = ptx_expr(&toks, &mut at, 0, 0)?;
    (at == toks.len() && v >= 0).then_some(v as u64)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Tok {
    Num(i128),
    Op(&'static str),
}

fn ptx_tokens(text: &str) -> Option<Vec<Tok>> {
    const OPS: [&str; 12] = ["<<", ">>", "+", "-", "*", "/", "%", "&", "|", "^", "(", ")"];
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_whitespace() {
            i += 1;
        } else if b[i].is_ascii_digit() {
            let start = i;
            while i < b.len() && b[i].is_ascii_alphanumeric() {
                i += 1;
            }
            let lit = text[start..i].trim_end_matches(['U', 'u']);
            let (digits, radix) = if let Some(h) = lit.strip_prefix("0x").or(lit.strip_prefix("0X"))
            {
                (h, 16)
            } else if let Some(h) = lit.strip_prefix("0b").or(lit.strip_prefix("0B")) {
                (h, 2)
            } else if lit.len() > 1 && lit.starts_with('0') {
                (&lit[1..], 8)
            } else {
                (lit, 10)
            };
            out.push(Tok::Num(u64::from_str_radix(digits, radix).ok()? as i128));
        } else {
            let op = OPS.iter().find(|o| text[i..].starts_with(**o))?;
            out.push(Tok::Op(op));
            i += op.len();
        }
    }
    Some(out)
}

/// How deep an expression may nest (parentheses, unary minus, operators of rising
/// precedence) before it counts as unreadable: each level is a call, and a client's image
/// of 20,000 parentheses overflowed the worker's stack and ended the server.
const PTX_EXPR_DEPTH: u32 = 64;

/// Precedence climbing over `toks` from `at`, for operators binding tighter than `min`;
/// `depth`: the calls above this one.
fn ptx_expr(toks: &[Tok], at: &mut usize, min: u8, depth: u32) -> Option<i128> {
    if depth >= PTX_EXPR_DEPTH {
        return None;
    }
    let prec = |op: &str| match op {
        "|" => Some(1),
        "^" => Some(2),
        "&" => Some(3),
        "<<" | ">>" => Some(4),
        "+" | "-" => Some(5),
        "*" | "/" | "%" => Some(6),
        _ => None,
    };
    let mut lhs = match toks.get(*at)? {
        Tok::Num(n) => {
            *at += 1;
            *n
        }
        Tok::Op("(") => {
            *at += 1;
            let v = ptx_expr(toks, at, 0, depth + 1)?;
            (toks.get(*at)? == &Tok::Op(")")).then_some(())?;
            *at += 1;
            v
        }
        Tok::Op("-") => {
            *at += 1;
            -ptx_expr(toks, at, 7, depth + 1)?
        }
        Tok::Op(_) => return None,
    };
    while let Some(&Tok::Op(op)) = toks.get(*at) {
        let Some(p) = prec(op).filter(|&p| p > min) else {
            break;
        };
        *at += 1;
        let rhs = ptx_expr(toks, at, p, depth + 1)?;
        lhs = match op {
            "+" => lhs.checked_add(rhs)?,
            "-" => lhs.checked_sub(rhs)?,
            "*" => lhs.checked_mul(rhs)?,
            "/" => lhs.checked_div(rhs)?,
            "%" => lhs.checked_rem(rhs)?,
            "<<" => lhs.checked_shl(u32::try_from(rhs).ok().filter(|&s| s < 64)?)?,
            ">>" => lhs.checked_shr(u32::try_from(rhs).ok().filter(|&s| s < 64)?)?,
            "&" => lhs & rhs,
            "|" => lhs | rhs,
            _ => lhs ^ rhs,
        };
        // Kept within what a size can be, so no step overflows.
        if lhs.unsigned_abs() > u64::MAX as u128 {
            return None;
        }
    }
    Some(lhs)
}

/// Whether a module loaded from `image` holds no data a client could write or set: the
/// cubins the driver may pick from it (of a GPU of compute capability `cc`) have no
/// `__device__` variables (`.nv.global`), no `__constant__` ones (constant banks other
/// than kernel parameters and compiler literals), and no initialized data but the
/// compiler's and cudart's own read-only tables and printf strings. PTX (compiled by the
/// driver, its data unknown here) and anything unreadable are not shared.
pub fn shareable(img: &[u8], cc: u32) -> bool {
    if img.starts_with(&image::ELF_MAGIC) {
        return elf_has_no_data(img);
    }
    let Some(entries) = image::fatbin_entries(img) else {
        return false;
    };
    let chosen = image::chosen(&entries, cc);
    !chosen.is_empty()
        && chosen.iter().all(|e| {
            e.kind == image::FATBIN_ELF && e.contents().is_ok_and(|code| elf_has_no_data(&code))
        })
}

fn elf_has_no_data(elf: &[u8]) -> bool {
    elf_sections(elf).is_some_and(|secs| {
        let data_ok = secs.iter().all(|s| !holds_client_data(s.name));
        data_ok && init_data_is_internal(elf, &secs)
    })
}

/// Whether a cubin section holds variables of the program's: `__device__` (`.nv.global*`
/// but the toolchain's initialized tables), `__constant__` (constant banks other than
/// kernel parameters and compiler literals) or `__managed__`.
fn holds_client_data(name: &str) -> bool {
    let global =
        name == ".nv.global" || (name.starts_with(".nv.global.") && name != ".nv.global.init");
    let constant = name.starts_with(".nv.constant")
        && !name.starts_with(".nv.constant0")
        && name != ".nv.constant4";
    global || constant || name.starts_with(".nv.managed")
}

/// The device memory a module loaded from `img` takes for its variables (every data
/// section, initialized tables included), for a GPU of compute capability `cc`: of the
/// cubins the driver may pick, the largest; of PTX, its `.global` and `.const` variables as
/// declared. An unreadable image counts nothing (the driver refuses it or finds no data).
pub fn data_bytes(img: &[u8], cc: u32) -> u64 {
    if image::is_ptx(img) {
        return ptx_data_bytes(&String::from_utf8_lossy(img));
    }
    let of_elf = |elf: &[u8]| -> u64 {
        elf_sections(elf).map_or(0, |secs| {
            secs.iter()
                .filter(|s| holds_client_data(s.name) || s.name == ".nv.global.init")
                .map(|s| s.size as u64)
                .fold(0u64, u64::saturating_add)
        })
    };
    if img.starts_with(&image::ELF_MAGIC) {
        return of_elf(img);
    }
    let Some(entries) = image::fatbin_entries(img) else {
        return 0;
    };
    image::chosen(&entries, cc)
        .iter()
        .filter_map(|e| {
            let code = e.contents().ok()?;
            Some(match e.kind == image::FATBIN_ELF {
                true => of_elf(&code),
                false => ptx_data_bytes(&String::from_utf8_lossy(&code)),
            })
        })
        .max()
        .unwrap_or(0)
}

struct Section<'a> {
    name: &'a str,
    kind: u32,
    offset: usize,
    size: usize,
    link: u32,
}

/// The section headers of a 64-bit little-endian ELF, every field bounds-checked.
fn elf_sections(elf: &[u8]) -> Option<Vec<Section<'_>>> {
    use image::{u16_at, u32_at, u64_at};
    if !elf.starts_with(&image::ELF_MAGIC) || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return None;
    }
    let shoff = usize::try_from(u64_at(elf, 0x28)?).ok()?;
    let shentsize = u16_at(elf, 0x3a)? as usize;
    let shnum = u16_at(elf, 0x3c)? as usize;
    let shstrndx = u16_at(elf, 0x3e)? as usize;
    if shentsize < 0x40 || shnum > 65_000 {
        return None;
    }
    let header = |i: usize| -> Option<(u32, u32, usize, usize, u32)> {
        let at = shoff.checked_add(i.checked_mul(shentsize)?)?;
        Some((
            u32_at(elf, at)?,
            u32_at(elf, at + 4)?,
            usize::try_from(u64_at(elf, at + 0x18)?).ok()?,
            usize::try_from(u64_at(elf, at + 0x20)?).ok()?,
            u32_at(elf, at + 0x28)?,
        ))
    };
    let (_, _, stroff, strsize, _) = header(shstrndx)?;
    let strtab = elf.get(stroff..stroff.checked_add(strsize)?)?;
    (0..shnum)
        .map(|i| {
            let (name_at, kind, offset, size, link) = header(i)?;
            let rest = strtab.get(name_at as usize..)?;
            let end = rest.iter().position(|&b| b == 0)?;
            Some(Section {
                name: std::str::from_utf8(&rest[..end]).ok()?,
                kind,
                offset,
                size,
                link,
            })
        })
        .collect()
}

/// Every symbol defined in `.nv.global.init` is the toolchain's own (cudart's math tables,
/// `$str` printf strings), never a user's initialized `__device__` variable.
fn init_data_is_internal(elf: &[u8], secs: &[Section<'_>]) -> bool {
    const SHT_SYMTAB: u32 = 2;
    let Some(init) = secs.iter().position(|s| s.name == ".nv.global.init") else {
        return true;
    };
    let Some(symtab) = secs.iter().find(|s| s.kind == SHT_SYMTAB) else {
        return false;
    };
    let Some(strs) = secs.get(symtab.link as usize) else {
        return false;
    };
    let (Some(syms), Some(names)) = (
        elf.get(symtab.offset..symtab.offset.saturating_add(symtab.size)),
        elf.get(strs.offset..strs.offset.saturating_add(strs.size)),
    ) else {
        return false;
    };
    syms.chunks_exact(24).all(|sym| {
        let shndx = u16::from_le_bytes([sym[6], sym[7]]) as usize;
        if shndx != init {
            return true;
        }
        let at = u32::from_le_bytes([sym[0], sym[1], sym[2], sym[3]]) as usize;
        let name = names
            .get(at..)
            .and_then(|r| r.iter().position(|&b| b == 0).map(|e| &r[..e]))
            .unwrap_or(b"?");
        // The section symbol itself has an empty name.
        name.is_empty() || name.starts_with(b"$str") || name.starts_with(b"__cudart_")
    })
}

#[cfg(test)]
mod tests;
