//! Checks what `omps_shim::image` believes about fatbins against real files: the entry
//! header layout, the compression flags and formats, the size fields, and what
//! `printf_use` answers for an sm_90 device.
//!
//! `fatbin_scan FILE...`: each FILE is an ELF shared library (its `.nv_fatbin` section is
//! read) or a raw fatbin. One summary line per file; see `Stats::line` for its fields.

use omps_ring::wire::printf_use;
use omps_shim::image::{self, Compression, FatEntry};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// The device whose choice of entries is reported.
const CC: u32 = 90;
/// Failures shown in full, for reading the headers by eye.
const SHOWN_FAILURES: usize = 3;

fn main() {
    let paths: Vec<std::path::PathBuf> = std::env::args_os().skip(1).map(Into::into).collect();
    if paths.is_empty() {
        eprintln!("usage: fatbin_scan FILE... (ELF libraries with .nv_fatbin, or raw fatbins)");
        std::process::exit(2);
    }
    for p in &paths {
        let t = Instant::now();
        let line = match std::fs::read(p) {
            Ok(bytes) => match fatbin_region(&bytes) {
                Ok(region) => scan(region).line(),
                Err(why) => why,
            },
            Err(e) => format!("cannot read: {e}"),
        };
        println!(
            "{}: {line} [{:.1} s]",
            p.display(),
            t.elapsed().as_secs_f64()
        );
    }
}

use image::{u16_at, u32_at};

/// A u64 field that must also fit a usize (an offset or length in this file).
fn u64_at(b: &[u8], o: usize) -> Option<usize> {
    usize::try_from(image::u64_at(b, o)?).ok()
}

/// Where the fatbins of a file lie: an ELF's `.nv_fatbin` section, else the whole file.
fn fatbin_region(f: &[u8]) -> Result<&[u8], String> {
    if !f.starts_with(&image::ELF_MAGIC) {
        return Ok(f);
    }
    if f.get(4) != Some(&2) || f.get(5) != Some(&1) {
        return Err("ELF, but not 64-bit little-endian".into());
    }
    let bad = || "ELF with broken section headers".to_string();
    let shoff = u64_at(f, 0x28).ok_or_else(bad)?;
    let shentsize = u16_at(f, 0x3a).ok_or_else(bad)? as usize;
    let mut shnum = u16_at(f, 0x3c).ok_or_else(bad)? as usize;
    let mut shstrndx = u16_at(f, 0x3e).ok_or_else(bad)? as usize;
    if shoff == 0 || shentsize < 64 {
        return Err("ELF without section headers".into());
    }
    let section = |i: usize| -> Option<&[u8]> {
        let at = shoff.checked_add(i.checked_mul(shentsize)?)?;
        f.get(at..at.checked_add(64)?)
    };
    // Past 0xff00 sections the counts live in section 0.
    let sh0 = section(0).ok_or_else(bad)?;
    if shnum == 0 {
        shnum = u64_at(sh0, 32).ok_or_else(bad)?;
    }
    if shstrndx == 0xffff {
        shstrndx = u32_at(sh0, 40).ok_or_else(bad)? as usize;
    }
    let bytes_of = |sh: &[u8]| -> Option<&[u8]> {
        let (off, size) = (u64_at(sh, 24)?, u64_at(sh, 32)?);
        f.get(off..off.checked_add(size)?)
    };
    let names = section(shstrndx).and_then(bytes_of).ok_or_else(bad)?;
    for i in 0..shnum {
        let Some(sh) = section(i) else { break };
        let Some(name_at) = u32_at(sh, 0).map(|n| n as usize) else {
            continue;
        };
        let name = names
            .get(name_at..)
            .and_then(|n| n.split(|&b| b == 0).next())
            .unwrap_or_default();
        if name == b".nv_fatbin" {
            return bytes_of(sh).ok_or_else(|| ".nv_fatbin lies outside the file".into());
        }
    }
    Err("ELF without a .nv_fatbin section".into())
}

/// The fatbins of a region, found by their magic: each begins where the last one ended or
/// further on (alignment or anything else between is skipped and counted).
fn fatbins(region: &[u8]) -> (Vec<&[u8]>, Stats) {
    let magic = image::FATBIN_MAGIC.to_le_bytes();
    let mut st = Stats::default();
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = image::find(region, &magic, at) {
        st.skipped_bytes += i - at;
        let f = &region[i..];
        let len = u16_at(f, 6)
            .zip(u64_at(f, 8))
            .and_then(|(h, rest)| (h as usize).checked_add(rest))
            .filter(|&l| l >= 16);
        let Some(len) = len else {
            // Not a header after all: look on past its magic.
            st.bad_headers += 1;
            at = i + 4;
            continue;
        };
        if len > f.len() {
            st.truncated += 1;
        }
        let len = len.min(f.len());
        out.push(&f[..len]);
        at = i + len;
    }
    st.skipped_bytes += region.len() - at.min(region.len());
    (out, st)
}

#[derive(Default)]
struct Stats {
    fatbins: usize,
    truncated: usize,
    bad_headers: usize,
    skipped_bytes: usize,
    entries: usize,
    kinds: BTreeMap<u16, usize>,
    header_sizes: BTreeMap<usize, usize>,
    flags: BTreeMap<u64, usize>,
    plain: usize,
    plain_right: usize,
    lz4: usize,
    zstd: usize,
    unknown: usize,
    decoded: usize,
    decoded_right: usize,
    /// Decoded length equal to the header's uncompressed size at 56.
    size_equal: usize,
    size_missing: usize,
    /// The decoder took exactly the length at 16 from the payload.
    took_hint: usize,
    compressed_bytes: u64,
    decoded_bytes: u64,
    failed: usize,
    /// (fatbin index, entry index, description), the earliest kept.
    failures: Vec<(usize, usize, String)>,
    chosen: usize,
    chosen_vprintf: usize,
    chosen_assertfail: usize,
    chosen_unreadable: usize,
    /// printf_use answers, NONE / MAYBE / YES.
    verdicts: [usize; 3],
}

impl Stats {
    fn entry(&mut self, fi: usize, ei: usize, e: &FatEntry, chosen: bool) {
        self.entries += 1;
        *self.kinds.entry(e.kind).or_default() += 1;
        *self.header_sizes.entry(e.header.len()).or_default() += 1;
        *self.flags.entry(e.flags).or_default() += 1;
        let compression = e.compression();
        match compression {
            Compression::None => self.plain += 1,
            Compression::Lz4 => self.lz4 += 1,
            Compression::Zstd => self.zstd += 1,
            Compression::Unknown => self.unknown += 1,
        }
        let code = match compression {
            Compression::None => {
                if image::check_kind(e.kind, e.payload).is_ok() {
                    self.plain_right += 1;
                }
                Ok(std::borrow::Cow::Borrowed(e.payload))
            }
            _ => {
                self.compressed_bytes += e.payload.len() as u64;
                match e.decompress() {
                    Ok(d) => {
                        self.decoded += 1;
                        self.decoded_bytes += d.bytes.len() as u64;
                        match e.uncompressed_size() {
                            Some(n) if n == d.bytes.len() as u64 => self.size_equal += 1,
                            Some(_) => {}
                            None => self.size_missing += 1,
                        }
                        if Some(d.input_len) == e.data_len_hint() {
                            self.took_hint += 1;
                        }
                        let right = image::check_kind(e.kind, &d.bytes);
                        if right.is_ok() {
                            self.decoded_right += 1;
                        } else {
                            self.fail(fi, ei, e, &right);
                        }
                        right.map(|()| std::borrow::Cow::Owned(d.bytes))
                    }
                    Err(why) => {
                        let r = Err(why);
                        self.fail(fi, ei, e, &r);
                        r
                    }
                }
            }
        };
        if chosen {
            self.chosen += 1;
            match code {
                Ok(c) => {
                    self.chosen_vprintf += image::contains(&c, b"vprintf") as usize;
                    self.chosen_assertfail += image::contains(&c, b"__assertfail") as usize;
                }
                Err(_) => self.chosen_unreadable += 1,
            }
        }
    }

    fn fail<T>(&mut self, fi: usize, ei: usize, e: &FatEntry, r: &Result<T, image::DecodeError>) {
        self.failed += 1;
        let Err(why) = r else { return };
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let head = &e.payload[..e.payload.len().min(16)];
        let tail = &e.payload[e.payload.len().saturating_sub(16)..];
        self.failures.push((
            fi,
            ei,
            format!(
                "fatbin {fi} entry {ei}: {why}; header {}; payload {} bytes, starts {}, ends {}",
                hex(e.header),
                e.payload.len(),
                hex(head),
                hex(tail)
            ),
        ));
        self.failures.sort();
        self.failures.truncate(SHOWN_FAILURES);
    }

    fn merge(&mut self, o: Stats) {
        self.fatbins += o.fatbins;
        self.entries += o.entries;
        for (k, n) in o.kinds {
            *self.kinds.entry(k).or_default() += n;
        }
        for (k, n) in o.header_sizes {
            *self.header_sizes.entry(k).or_default() += n;
        }
        for (k, n) in o.flags {
            *self.flags.entry(k).or_default() += n;
        }
        self.plain += o.plain;
        self.plain_right += o.plain_right;
        self.lz4 += o.lz4;
        self.zstd += o.zstd;
        self.unknown += o.unknown;
        self.decoded += o.decoded;
        self.decoded_right += o.decoded_right;
        self.size_equal += o.size_equal;
        self.size_missing += o.size_missing;
        self.took_hint += o.took_hint;
        self.compressed_bytes += o.compressed_bytes;
        self.decoded_bytes += o.decoded_bytes;
        self.failed += o.failed;
        self.failures.extend(o.failures);
        self.failures.sort();
        self.failures.truncate(SHOWN_FAILURES);
        self.chosen += o.chosen;
        self.chosen_vprintf += o.chosen_vprintf;
        self.chosen_assertfail += o.chosen_assertfail;
        self.chosen_unreadable += o.chosen_unreadable;
        for (a, b) in self.verdicts.iter_mut().zip(o.verdicts) {
            *a += b;
        }
    }

    fn line(&self) -> String {
        let [none, maybe, yes] = self.verdicts;
        let verdict = if self.fatbins == 0 {
            "-"
        } else if yes > 0 {
            "YES"
        } else if maybe > 0 {
            "MAYBE"
        } else {
            "NONE"
        };
        let mut s = format!(
            "fatbins {} (truncated {}, bad headers {}, {} bytes between), \
             entries {} (kinds {{{}}}, header sizes {{{}}}, flags {{{}}}), \
             plain {} (looking right {}), \
             compressed lz4 {} zstd {} both-flags {} ({} bytes): \
             decoded {} ({} bytes; looking right {}, size = u64@56 {}, no size field {}, \
             took exactly u32@16 bytes {}), failed or not right {}; \
             chosen for sm_{CC} {} (vprintf {}, __assertfail {}, unreadable {}); \
             printf_use(cc {CC}) {verdict} (fatbins YES {yes}, NONE {none}, MAYBE {maybe})",
            self.fatbins,
            self.truncated,
            self.bad_headers,
            self.skipped_bytes,
            self.entries,
            counts(&self.kinds, |k| k.to_string()),
            counts(&self.header_sizes, |k| k.to_string()),
            counts(&self.flags, |k| format!("{k:#x}")),
            self.plain,
            self.plain_right,
            self.lz4,
            self.zstd,
            self.unknown,
            self.compressed_bytes,
            self.decoded,
            self.decoded_bytes,
            self.decoded_right,
            self.size_equal,
            self.size_missing,
            self.took_hint,
            self.failed,
            self.chosen,
            self.chosen_vprintf,
            self.chosen_assertfail,
            self.chosen_unreadable,
        );
        for (_, _, f) in &self.failures {
            s += " | ";
            s += f;
        }
        s
    }
}

/// `key: count, ...` of a histogram.
fn counts<K>(m: &BTreeMap<K, usize>, key: impl Fn(&K) -> String) -> String {
    m.iter()
        .map(|(k, n)| format!("{}: {n}", key(k)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every entry of every fatbin, decompressed once, on all cores: a library of a GiB
/// holds some GiB of code.
fn scan(region: &[u8]) -> Stats {
    let (list, mut total) = fatbins(region);
    total.fatbins = list.len();
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut st = Stats::default();
                loop {
                    let fi = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&f) = list.get(fi) else { break };
                    let entries = image::fatbin_entries(f).unwrap_or_default();
                    let chosen = image::chosen(&entries, CC);
                    for (ei, e) in entries.iter().enumerate() {
                        let picked = chosen.iter().any(|&c| std::ptr::eq(c, e));
                        st.entry(fi, ei, e, picked);
                    }
                    let at = match image::printf_use(f, CC) {
                        printf_use::YES => 2,
                        printf_use::MAYBE => 1,
                        _ => 0,
                    };
                    st.verdicts[at] += 1;
                }
                results.lock().unwrap().push(st);
            });
        }
    });
    for st in results.into_inner().unwrap() {
        total.merge(st);
    }
    total
}
