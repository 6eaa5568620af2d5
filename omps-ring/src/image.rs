//! How long a module image is. cuModuleLoadData gets only a pointer, so the size comes
//! from the image's own header: fatbin, fatbin wrapper, ELF cubin, or NUL-terminated PTX.

pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43B1;
pub const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];

/// Reads `N` bytes at `p + off`.
///
/// # Safety
/// `p + off .. p + off + N` is readable.
unsafe fn read<const N: usize>(p: *const u8, off: usize) -> [u8; N] {
    // SAFETY: the caller's promise.
    unsafe { std::ptr::read_unaligned(p.add(off) as *const [u8; N]) }
}

/// Whether an image is PTX text (none of the binary formats' magic numbers).
pub fn is_ptx(image: &[u8]) -> bool {
    let Some(m) = image.get(..4) else {
        return false;
    };
    let magic = u32::from_le_bytes([m[0], m[1], m[2], m[3]]);
    magic != FATBIN_MAGIC && magic != FATBIN_WRAPPER_MAGIC && m != ELF_MAGIC
}

/// Whether `blob`, a whole image a client sent, can go to cuModuleLoadData: the driver
/// reads an image by its own headers (or up to a PTX text's NUL), so every length they
/// state must lie inside the blob. Err names what is wrong.
pub fn check_image(blob: &[u8]) -> Result<(), &'static str> {
    let magic = blob
        .get(..4)
        .map(|m| u32::from_le_bytes([m[0], m[1], m[2], m[3]]));
    match magic {
        None if !blob.contains(&0) => Err("an image shorter than any format, not PTX text"),
        Some(FATBIN_WRAPPER_MAGIC) => Err("a fatbin wrapper (its data pointer is the client's)"),
        Some(FATBIN_MAGIC) => {
            let header = u16_at(blob, 6).ok_or("a truncated fatbin header")? as u64;
            let body = u64_at(blob, 8).ok_or("a truncated fatbin header")?;
            let end = header
                .checked_add(body)
                .ok_or("a fatbin size that overflows")?;
            if header < 16 || end > blob.len() as u64 {
                return Err("a fatbin that states more bytes than were sent");
            }
            check_fat_entries(&blob[..end as usize], header as usize)
        }
        Some(_) if blob[..4] == ELF_MAGIC => check_elf(blob),
        // PTX: the driver reads up to the first NUL.
        _ if blob.contains(&0) => Ok(()),
        _ => Err("PTX text with no NUL"),
    }
}

/// Every entry of a fatbin (from `at` to the end of `fat`) lies inside it: a header of at
/// least the fields the driver reads, and its payload. What follows the last entry (too
/// few bytes, or no header size) is padding. (What an entry holds is the driver's to
/// parse.)
fn check_fat_entries(fat: &[u8], mut at: usize) -> Result<(), &'static str> {
    const TRUNCATED: &str = "a fatbin entry that states more bytes than the fatbin holds";
    const HEADER_MIN: usize = 48;
    while fat.len().saturating_sub(at) >= HEADER_MIN {
        let e = &fat[at..];
        let hsize = u32_at(e, 4).ok_or(TRUNCATED)? as usize;
        let psize = usize::try_from(u64_at(e, 8).ok_or(TRUNCATED)?).map_err(|_| TRUNCATED)?;
        if hsize < HEADER_MIN {
            // Not an entry (padding, as fatbin_entries also stops there); the fields the
            // driver would read of it lie inside the fatbin.
            break;
        }
        let len = hsize
            .checked_add(psize)
            .filter(|&n| n <= e.len())
            .ok_or(TRUNCATED)?;
        at += len;
    }
    Ok(())
}

/// The ELF checks of [`check_image`]: the header, the program and section header tables
/// and every section's bytes inside the blob.
fn check_elf(b: &[u8]) -> Result<(), &'static str> {
    const TRUNCATED: &str = "an ELF image that states more bytes than were sent";
    if b.len() < 64 || b[4] != 2 {
        return Err("not a 64-bit ELF image");
    }
    let at16 = |o| u16_at(b, o).map(u64::from).ok_or(TRUNCATED);
    let at64 = |o| u64_at(b, o).ok_or(TRUNCATED);
    let table_end = |off: u64, entsize: u64, num: u64| {
        entsize
            .checked_mul(num)
            .and_then(|n| n.checked_add(off))
            .filter(|&e| e <= b.len() as u64)
            .ok_or(TRUNCATED)
    };
    let (phoff, shoff) = (at64(32)?, at64(40)?);
    let (phentsize, phnum, shentsize, shnum) = (at16(54)?, at16(56)?, at16(58)?, at16(60)?);
    table_end(phoff, phentsize, phnum)?;
    table_end(shoff, shentsize, shnum)?;
    if shnum > 0 && shentsize < 64 {
        return Err("ELF section headers smaller than 64 bytes");
    }
    if at16(62)? >= shnum.max(1) {
        return Err("an ELF section-name table index out of range");
    }
    const SHT_NOBITS: u32 = 8;
    for i in 0..shnum {
        let sh = (shoff + i * shentsize) as usize;
        let ty = u32_at(b, sh + 4).ok_or(TRUNCATED)?;
        if ty != SHT_NOBITS {
            table_end(at64(sh + 24)?, at64(sh + 32)?, 1)?;
        }
    }
    Ok(())
}

/// The image at `p`, as a slice of its real length; None if the format is unknown.
///
/// # Safety
/// `p` points at a whole module image, as cuModuleLoadData requires.
pub unsafe fn image_slice<'a>(p: *const u8) -> Option<&'a [u8]> {
    if p.is_null() {
        return None;
    }
    // SAFETY: every image format is at least 4 bytes long.
    let magic4 = unsafe { read::<4>(p, 0) };
    let magic = u32::from_le_bytes(magic4);
    let len = if magic == FATBIN_WRAPPER_MAGIC {
        // { u32 magic, u32 version, const void *data, const void *filename }
        // SAFETY: a wrapper is 24 bytes; its data pointer is an image.
        return unsafe { image_slice(usize::from_le_bytes(read::<8>(p, 8)) as *const u8) };
    } else if magic == FATBIN_MAGIC {
        // { u32 magic, u16 version, u16 header size, u64 size of what follows }
        // SAFETY: the fatbin header is 16 bytes.
        let h = unsafe { read::<16>(p, 0) };
        u16::from_le_bytes([h[6], h[7]]) as usize
            + u64::from_le_bytes(h[8..16].try_into().ok()?) as usize
    } else if magic4 == ELF_MAGIC {
        // SAFETY: a 64-bit ELF header is 64 bytes; section headers are where it says.
        unsafe { elf_len(p)? }
    } else {
        // PTX: text up to and including its NUL.
        // SAFETY: PTX images are NUL-terminated strings.
        unsafe { std::ffi::CStr::from_ptr(p as *const std::ffi::c_char) }
            .to_bytes_with_nul()
            .len()
    };
    // SAFETY: the header says the image is len bytes long.
    Some(unsafe { std::slice::from_raw_parts(p, len) })
}

/// # Safety
/// `p` is a readable 64-bit ELF image.
unsafe fn elf_len(p: *const u8) -> Option<usize> {
    // SAFETY: the ELF header is 64 bytes.
    let h = unsafe { read::<64>(p, 0) };
    if h[4] != 2 {
        return None; // only ELFCLASS64 cubins exist for current GPUs
    }
    let u16at = |o: usize| u16::from_le_bytes([h[o], h[o + 1]]) as usize;
    let u64at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap()) as usize;
    let (phoff, shoff) = (u64at(32), u64at(40));
    let (phentsize, phnum, shentsize, shnum) = (u16at(54), u16at(56), u16at(58), u16at(60));
    let mut end = (shoff + shentsize * shnum)
        .max(phoff + phentsize * phnum)
        .max(64);
    const SHT_NOBITS: u32 = 8;
    for i in 0..shnum {
        // SAFETY: section header i lies inside the section header table.
        let sh = unsafe { read::<64>(p, shoff + i * shentsize) };
        let ty = u32::from_le_bytes(sh[4..8].try_into().unwrap());
        if ty != SHT_NOBITS {
            let off = u64::from_le_bytes(sh[24..32].try_into().unwrap()) as usize;
            let size = u64::from_le_bytes(sh[32..40].try_into().unwrap()) as usize;
            end = end.max(off + size);
        }
    }
    Some(end)
}

/// Whether the code the GPU will run from `image` may write to the printf buffer (a
/// `wire::printf_use` level), for a device of compute capability `cc` (90 for 9.0).
///
/// Code that calls printf names the driver's `vprintf` (YES); code with a device-side
/// `assert()` names `__assertfail` (ASSERT), whose message reaches the host through the
/// same buffer but only from a kernel that then fails. In a fatbin only the entries the
/// driver would pick count: cubins of the device's major version not newer than it, else
/// PTX. Compressed entries are decompressed; one that does not decompress into what its
/// kind promises makes it a maybe.
pub fn printf_use(image: &[u8], cc: u32) -> u64 {
    use crate::wire::printf_use::{MAYBE, NONE, YES};
    let Some(entries) = fatbin_entries(image) else {
        return printing_level(image);
    };
    let mut level = NONE;
    for e in chosen(&entries, cc) {
        let l = match e.contents() {
            Ok(code) => printing_level(&code),
            Err(_) => MAYBE,
        };
        if l == YES {
            return YES;
        }
        level = level.max(l);
    }
    level
}

/// How device code writes to the printf buffer: `vprintf` always may, `__assertfail`
/// only on the way to failing the kernel.
fn printing_level(code: &[u8]) -> u64 {
    use crate::wire::printf_use::{ASSERT, NONE, YES};
    if contains(code, b"vprintf") {
        YES
    } else if contains(code, b"__assertfail") {
        ASSERT
    } else {
        NONE
    }
}

/// Whether `needle` occurs in `hay`. Linear in `hay` for the short names searched here,
/// where `windows().any()` would compare every window in full.
#[doc(hidden)]
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    find(hay, needle, 0).is_some()
}

/// Where `needle` first occurs in `hay` at or after `from`.
#[doc(hidden)]
pub fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let Some((&first, rest)) = needle.split_first() else {
        return Some(from.min(hay.len()));
    };
    let mut at = from;
    loop {
        at += hay.get(at..)?.iter().position(|&b| b == first)?;
        if hay[at + 1..].starts_with(rest) {
            return Some(at);
        }
        at += 1;
    }
}

/// The entries of a fatbin the driver would load on a device of compute capability
/// `cc`: cubins of its major version not newer than it, else PTX not newer than it.
#[doc(hidden)]
pub fn chosen<'e, 'a>(entries: &'e [FatEntry<'a>], cc: u32) -> Vec<&'e FatEntry<'a>> {
    let cubins: Vec<&FatEntry> = entries
        .iter()
        .filter(|e| e.kind == FATBIN_ELF && e.arch / 10 == cc / 10 && e.arch <= cc)
        .collect();
    if !cubins.is_empty() {
        return cubins;
    }
    entries
        .iter()
        .filter(|e| e.kind == FATBIN_PTX && e.arch <= cc)
        .collect()
}

pub const FATBIN_PTX: u16 = 1;
pub const FATBIN_ELF: u16 = 2;
/// Entry flags for a compressed payload: an LZ4 block in older toolchains, a zstd frame
/// in newer ones.
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;
/// The largest decompressed entry looked into. A size field beyond it is garbage or
/// hostile; allocating it could take the client down, and a maybe costs only round trips.
pub const MAX_UNCOMPRESSED: usize = 256 << 20;

/// How an entry's payload is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Lz4,
    Zstd,
    /// Both compression flags at once: nothing known decodes that.
    Unknown,
}

/// One entry of a fatbin: a header, then a payload of code for one architecture.
#[doc(hidden)]
pub struct FatEntry<'a> {
    pub kind: u16,
    pub arch: u32,
    pub flags: u64,
    /// The header, as long as its own size field says.
    pub header: &'a [u8],
    /// As long as the header's payload size, which may be padded past the data.
    pub payload: &'a [u8],
}

/// A decompressed payload.
#[doc(hidden)]
pub struct Decoded {
    pub bytes: Vec<u8>,
    /// How many payload bytes the data took, as far as the decoder tells.
    pub input_len: usize,
}

/// Why an entry's code could not be had.
#[doc(hidden)]
#[derive(Debug)]
pub enum DecodeError {
    UnknownCompression,
    /// LZ4 blocks do not record their decompressed size; the header must.
    NoSize,
    /// A decompressed size beyond [`MAX_UNCOMPRESSED`] or beyond what the input can
    /// expand to.
    TooBig(u64),
    Lz4(String),
    Zstd(String),
    /// An LZ4 block that decoded to another size than the header's.
    SizeMismatch {
        expected: u64,
        got: u64,
    },
    /// The decoder panicked on this input.
    Panicked,
    /// Decompressed, but not into what the entry's kind promises.
    NotElf,
    NotText,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownCompression => write!(f, "unknown compression flags"),
            Self::NoSize => write!(f, "LZ4 without an uncompressed size in the header"),
            Self::TooBig(n) => write!(f, "uncompressed size {n} refused"),
            Self::Lz4(e) => write!(f, "lz4: {e}"),
            Self::Zstd(e) => write!(f, "zstd: {e}"),
            Self::SizeMismatch { expected, got } => {
                write!(f, "decoded {got} bytes, header says {expected}")
            }
            Self::Panicked => write!(f, "decoder panicked"),
            Self::NotElf => write!(f, "cubin decompressed to something not ELF"),
            Self::NotText => write!(f, "PTX decompressed to something not text"),
        }
    }
}

#[doc(hidden)]
pub fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(o..o.checked_add(2)?)?.try_into().ok()?,
    ))
}
#[doc(hidden)]
pub fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(o..o.checked_add(4)?)?.try_into().ok()?,
    ))
}
#[doc(hidden)]
pub fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(o..o.checked_add(8)?)?.try_into().ok()?,
    ))
}

impl<'a> FatEntry<'a> {
    pub fn compression(&self) -> Compression {
        match (self.flags & FLAG_LZ4 != 0, self.flags & FLAG_ZSTD != 0) {
            (false, false) => Compression::None,
            (true, false) => Compression::Lz4,
            (false, true) => Compression::Zstd,
            (true, true) => Compression::Unknown,
        }
    }

    /// The decompressed size the header records; only headers of 64 bytes or more have it.
    pub fn uncompressed_size(&self) -> Option<u64> {
        u64_at(self.header, 56)
    }

    /// The unpadded length of the compressed data, where the header seems to record it
    /// (at 16, as public reverse engineering has it): a hint to try first, never trusted
    /// beyond the payload.
    pub fn data_len_hint(&self) -> Option<usize> {
        let n = usize::try_from(u32_at(self.header, 16)?).ok()?;
        (n > 0 && n <= self.payload.len()).then_some(n)
    }

    /// The entry's code: its payload, decompressed if it is compressed. A compressed
    /// payload must decompress into what the kind promises (an ELF for a cubin, text for
    /// PTX), or nothing about its contents is known.
    pub fn contents(&self) -> Result<std::borrow::Cow<'a, [u8]>, DecodeError> {
        if self.compression() == Compression::None {
            return Ok(std::borrow::Cow::Borrowed(self.payload));
        }
        let d = self.decompress()?;
        check_kind(self.kind, &d.bytes)?;
        Ok(std::borrow::Cow::Owned(d.bytes))
    }

    /// The decompressed payload, unchecked. An uncompressed payload is copied.
    pub fn decompress(&self) -> Result<Decoded, DecodeError> {
        let compression = self.compression();
        // The decoders are not ours: one panicking on a strange payload must cost a
        // maybe, not the module load that asked.
        std::panic::catch_unwind(|| match compression {
            Compression::None => Ok(Decoded {
                bytes: self.payload.to_vec(),
                input_len: self.payload.len(),
            }),
            Compression::Lz4 => self.decompress_lz4(),
            Compression::Zstd => self.decompress_zstd(),
            Compression::Unknown => Err(DecodeError::UnknownCompression),
        })
        .unwrap_or(Err(DecodeError::Panicked))
    }

    fn decompress_lz4(&self) -> Result<Decoded, DecodeError> {
        let size = self.uncompressed_size().ok_or(DecodeError::NoSize)?;
        // An LZ4 sequence turns each input byte into at most 255 output bytes: a larger
        // claim is false, and refusing it here keeps it from being allocated.
        let limit = (self.payload.len() as u64)
            .saturating_mul(255)
            .saturating_add(64)
            .min(MAX_UNCOMPRESSED as u64);
        if size > limit {
            return Err(DecodeError::TooBig(size));
        }
        let mut out = vec![0u8; size as usize];
        // The payload size field may be padded past the block, and a block cannot say
        // where it ends: the hinted length first, then all of it, then all of it less
        // trailing zeros.
        let trimmed =
            self.payload.len() - self.payload.iter().rev().take_while(|&&b| b == 0).count();
        let mut tried: [Option<usize>; 3] = [None; 3];
        let mut last = DecodeError::Lz4("empty payload".into());
        for (i, len) in [
            self.data_len_hint(),
            Some(self.payload.len()),
            Some(trimmed),
        ]
        .into_iter()
        .enumerate()
        {
            let Some(len) = len.filter(|&l| l > 0 && !tried.contains(&Some(l))) else {
                continue;
            };
            tried[i] = Some(len);
            // A block cut short at a sequence boundary decodes without error, so only the
            // whole size proves the whole block was read; a shorter result could hide
            // the call that matters.
            match lz4_flex::block::decompress_into(&self.payload[..len], &mut out) {
                Ok(n) if n as u64 == size => {
                    return Ok(Decoded {
                        bytes: out,
                        input_len: len,
                    })
                }
                Ok(n) => {
                    last = DecodeError::SizeMismatch {
                        expected: size,
                        got: n as u64,
                    }
                }
                Err(e) => last = DecodeError::Lz4(e.to_string()),
            }
        }
        Err(last)
    }

    fn decompress_zstd(&self) -> Result<Decoded, DecodeError> {
        use std::io::Read;
        let max = MAX_UNCOMPRESSED as u64;
        let size = self.uncompressed_size();
        if let Some(n) = size.filter(|&n| n > max) {
            return Err(DecodeError::TooBig(n));
        }
        let zerr = |e: &dyn std::fmt::Display| DecodeError::Zstd(e.to_string());
        // Decoding one frame stops at its end, so padding after it is never read.
        let mut frame =
            ruzstd::decoding::StreamingDecoder::new_with_max_window_size(self.payload, max)
                .map_err(|e| zerr(&e))?;
        let declared = frame.decoder.content_size();
        if declared > max {
            return Err(DecodeError::TooBig(declared));
        }
        // Reserved from the sizes only as far as the input could plausibly expand, so
        // that a garbage payload with a large claim fails before allocating it.
        let mut out = Vec::with_capacity(
            (size.unwrap_or(declared) as usize).min(self.payload.len().saturating_mul(32)),
        );
        (&mut frame)
            .take(max + 1)
            .read_to_end(&mut out)
            .map_err(|e| zerr(&e))?;
        if out.len() as u64 > max {
            return Err(DecodeError::TooBig(out.len() as u64));
        }
        if !frame.decoder.is_finished() {
            return Err(DecodeError::Zstd("frame ends early".into()));
        }
        Ok(Decoded {
            bytes: out,
            input_len: self.payload.len() - frame.get_ref().len(),
        })
    }
}

/// Whether decompressed `code` is what an entry of `kind` holds: an ELF for a cubin,
/// text for PTX. Other kinds are not checked.
#[doc(hidden)]
pub fn check_kind(kind: u16, code: &[u8]) -> Result<(), DecodeError> {
    match kind {
        FATBIN_ELF if !code.starts_with(&ELF_MAGIC) => Err(DecodeError::NotElf),
        FATBIN_PTX if !looks_like_text(code) => Err(DecodeError::NotText),
        _ => Ok(()),
    }
}

/// Whether `b` starts like text: no control bytes but whitespace in its first 4 KiB
/// (garbage has some within a few hundred bytes), NUL padding at the end allowed.
fn looks_like_text(b: &[u8]) -> bool {
    let end = b.len() - b.iter().rev().take_while(|&&c| c == 0).count();
    let head = &b[..end.min(4096)];
    !head.is_empty()
        && head
            .iter()
            .all(|&c| c >= 0x20 && c != 0x7f || matches!(c, b'\t' | b'\n' | b'\r'))
}

/// The entries of a fatbin image; None if it is not one. A truncated entry ends the list.
#[doc(hidden)]
pub fn fatbin_entries(image: &[u8]) -> Option<Vec<FatEntry<'_>>> {
    if u32_at(image, 0)? != FATBIN_MAGIC {
        return None;
    }
    let start = u16_at(image, 6)? as usize;
    let end = image
        .len()
        .min(start.saturating_add(usize::try_from(u64_at(image, 8)?).unwrap_or(usize::MAX)));
    let mut at = start;
    let mut out = Vec::new();
    while at < end {
        let e = &image[at..end];
        let (Some(kind), Some(hsize), Some(psize), Some(arch), Some(flags)) = (
            u16_at(e, 0),
            u32_at(e, 4),
            u64_at(e, 8),
            u32_at(e, 28),
            u64_at(e, 40),
        ) else {
            break;
        };
        let hsize = hsize as usize;
        let Some(payload) = usize::try_from(psize)
            .ok()
            .and_then(|p| e.get(hsize..hsize.checked_add(p)?))
        else {
            break;
        };
        if hsize == 0 {
            break;
        }
        out.push(FatEntry {
            kind,
            arch,
            flags,
            header: &e[..hsize],
            payload,
        });
        at += hsize + payload.len();
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::printf_use::{ASSERT, MAYBE, NONE, YES};

    proptest::proptest! {
        /// Whatever a client sends, the check answers without panicking, and what it
        /// accepts as an ELF or a fatbin states no byte beyond what was sent.
        #[test]
        fn check_image_takes_any_bytes(
            mut blob in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
            kind in 0u8..3,
        ) {
            match kind {
                0 if blob.len() >= 5 => {
                    blob[..4].copy_from_slice(&ELF_MAGIC);
                    blob[4] = 2;
                }
                1 if blob.len() >= 4 => blob[..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes()),
                _ => {}
            }
            if check_image(&blob).is_ok() && blob.starts_with(&ELF_MAGIC) {
                // SAFETY: the check found every stated range inside `blob`.
                let end = unsafe { elf_len(blob.as_ptr()) };
                proptest::prop_assert!(end.is_some_and(|e| e <= blob.len()));
            }
        }
    }

    #[test]
    fn check_image_refuses_a_fatbin_entry_past_the_end() {
        let mut fat = FATBIN_MAGIC.to_le_bytes().to_vec();
        fat.extend_from_slice(&[1, 0, 16, 0]);
        fat.extend_from_slice(&(64u64 + 16).to_le_bytes());
        let mut entry = vec![0u8; 64];
        entry[4..8].copy_from_slice(&64u32.to_le_bytes()); // header size
        entry[8..16].copy_from_slice(&16u64.to_le_bytes()); // payload
        fat.extend_from_slice(&entry);
        fat.extend_from_slice(&[0; 16]);
        assert_eq!(check_image(&fat), Ok(()));
        let n = fat.len();
        fat[16 + 8..16 + 16].copy_from_slice(&(1u64 << 20).to_le_bytes());
        assert!(check_image(&fat[..n]).is_err(), "a payload past the end");
    }

    #[test]
    fn check_image_takes_well_formed_images() {
        assert!(check_image(b"omps\0").is_ok(), "PTX text with its NUL");
        let mut elf = vec![0u8; 64 + 64];
        elf[..4].copy_from_slice(&ELF_MAGIC);
        elf[4] = 2;
        elf[40..48].copy_from_slice(&64u64.to_le_bytes());
        elf[58] = 64;
        elf[60] = 1;
        assert_eq!(check_image(&elf), Ok(()));
        elf[60] = 2;
        assert!(check_image(&elf).is_err(), "a section header past the end");
    }

    /// How a test entry's payload is stored.
    #[derive(Clone, Copy)]
    enum Z {
        Plain,
        Lz4,
        Zstd,
    }

    /// An entry's header fields, so that tests can lie in them.
    struct Head {
        kind: u16,
        arch: u32,
        flags: u64,
        header_size: u32,
        /// The unpadded data length at 16.
        data_len: u32,
        uncompressed: u64,
    }

    /// One entry as nvcc lays it out: the header, then the data padded to 8 bytes, the
    /// padded length in the payload size field.
    fn raw_entry(h: &Head, data: &[u8]) -> Vec<u8> {
        let padded = data.len().next_multiple_of(8);
        let mut e = vec![0u8; h.header_size as usize];
        let mut put = |o: usize, b: &[u8]| {
            if let Some(d) = e.get_mut(o..o + b.len()) {
                d.copy_from_slice(b);
            }
        };
        put(0, &h.kind.to_le_bytes());
        put(2, &0x0101u16.to_le_bytes());
        put(4, &h.header_size.to_le_bytes());
        put(8, &(padded as u64).to_le_bytes());
        put(16, &h.data_len.to_le_bytes());
        put(28, &h.arch.to_le_bytes());
        put(40, &h.flags.to_le_bytes());
        put(56, &h.uncompressed.to_le_bytes());
        e.extend_from_slice(data);
        e.resize(h.header_size as usize + padded, 0);
        e
    }

    fn wrap(entries: &[Vec<u8>]) -> Vec<u8> {
        let body = entries.concat();
        let mut img = FATBIN_MAGIC.to_le_bytes().to_vec();
        img.extend_from_slice(&1u16.to_le_bytes());
        img.extend_from_slice(&16u16.to_le_bytes());
        img.extend_from_slice(&(body.len() as u64).to_le_bytes());
        img.extend(body);
        img
    }

    fn entry(kind: u16, arch: u32, z: Z, code: &[u8]) -> Vec<u8> {
        let (flags, data) = match z {
            Z::Plain => (0x11, code.to_vec()),
            Z::Lz4 => (0x11 | FLAG_LZ4, lz4_flex::block::compress(code)),
            Z::Zstd => (
                0x11 | FLAG_ZSTD,
                ruzstd::encoding::compress_to_vec(
                    code,
                    ruzstd::encoding::CompressionLevel::Fastest,
                ),
            ),
        };
        let head = Head {
            kind,
            arch,
            flags,
            header_size: 64,
            data_len: data.len() as u32,
            uncompressed: code.len() as u64,
        };
        raw_entry(&head, &data)
    }

    /// A fatbin of (kind, arch, storage, code) entries.
    fn fatbin(entries: &[(u16, u32, Z, &[u8])]) -> Vec<u8> {
        let v: Vec<Vec<u8>> = entries
            .iter()
            .map(|&(kind, arch, z, code)| entry(kind, arch, z, code))
            .collect();
        wrap(&v)
    }

    /// Something shaped like a cubin: ELF magic, then `n` bytes that compress somewhat
    /// (repeats for matches, a counter against them), then `tail`.
    fn cubin(n: usize, tail: &[u8]) -> Vec<u8> {
        let mut c = ELF_MAGIC.to_vec();
        let mut x: u32 = 1;
        while c.len() < n {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            c.extend_from_slice(b".text._Z6kernelPf ");
            c.extend_from_slice(&(x >> 16).to_le_bytes());
        }
        c.extend_from_slice(tail);
        c
    }

    const PTX: &[u8] = b".version 8.0\n.target sm_80\n.address_size 64\n\n";
    const PTX_PRINTF: &[u8] =
        b".version 8.0\n.target sm_80\n.extern .func (.param .b32 r) vprintf\n";

    #[test]
    fn printf_is_found_in_the_cubin_the_driver_would_pick() {
        // As nvcc 13 builds by default: an sm_90 cubin and compressed PTX.
        let img = fatbin(&[(2, 90, Z::Plain, b"..vprintf.."), (1, 90, Z::Zstd, PTX)]);
        assert_eq!(printf_use(&img, 90), YES);
        let img = fatbin(&[(2, 90, Z::Plain, b"no calls"), (1, 90, Z::Zstd, PTX_PRINTF)]);
        assert_eq!(
            printf_use(&img, 90),
            NONE,
            "the PTX is not used when a cubin fits"
        );
        // A cubin for another major version is not used: the compressed PTX is.
        let img = fatbin(&[(2, 80, Z::Plain, b"vprintf"), (1, 80, Z::Zstd, PTX)]);
        assert_eq!(printf_use(&img, 90), NONE);
        let img = fatbin(&[(2, 80, Z::Plain, b"no calls"), (1, 80, Z::Lz4, PTX_PRINTF)]);
        assert_eq!(printf_use(&img, 90), YES);
        // Uncompressed PTX is read as text.
        let img = fatbin(&[(1, 70, Z::Plain, b"call.uni vprintf, (...)")]);
        assert_eq!(printf_use(&img, 90), YES);
    }

    #[test]
    fn compressed_cubins_are_looked_into() {
        // Built with -Xfatbin -compress-all, as PyTorch is.
        for z in [Z::Lz4, Z::Zstd] {
            let img = fatbin(&[(2, 90, z, &cubin(100_000, b" vprintf"))]);
            assert_eq!(printf_use(&img, 90), YES);
            let img = fatbin(&[(2, 90, z, &cubin(100_000, b" __assertfail"))]);
            assert_eq!(
                printf_use(&img, 90),
                ASSERT,
                "assert() prints when it fails"
            );
            let img = fatbin(&[(2, 90, z, &cubin(100_000, b" quiet"))]);
            assert_eq!(printf_use(&img, 90), NONE);
            // Only the chosen entries: this one fits, the printing sm_80 one does not.
            let img = fatbin(&[
                (2, 80, z, &cubin(1000, b"vprintf")),
                (2, 90, z, &cubin(1000, b"quiet")),
            ]);
            assert_eq!(printf_use(&img, 90), NONE);
        }
    }

    #[test]
    fn a_payload_that_does_not_decompress_is_a_maybe() {
        for z in [Z::Lz4, Z::Zstd] {
            let mut e = entry(2, 90, z, &cubin(5000, b"vprintf"));
            let mid = e.len() / 2;
            e[64..mid].fill(0xA5);
            assert_eq!(printf_use(&wrap(&[e]), 90), MAYBE);
            // Decompresses fine, but not into a cubin.
            let img = fatbin(&[(2, 90, z, b"plain words that name vprintf, not an ELF")]);
            assert_eq!(printf_use(&img, 90), MAYBE);
            let img = fatbin(&[(1, 90, z, &[1, 2, 3, 0xff, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13])]);
            assert_eq!(printf_use(&img, 90), MAYBE, "PTX must be text");
        }
        // Both compression flags: no known format.
        let mut e = entry(2, 90, Z::Zstd, &cubin(500, b""));
        e[40..48].copy_from_slice(&(0x11 | FLAG_LZ4 | FLAG_ZSTD).to_le_bytes());
        assert_eq!(printf_use(&wrap(&[e]), 90), MAYBE);
    }

    #[test]
    fn garbage_never_panics_and_is_a_maybe() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for round in 0..2000 {
            let mut data = vec![0u8; 8 + round % 300];
            for b in data.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let zstd = round % 2 == 0;
            if zstd {
                data[..4].copy_from_slice(&0xFD2F_B528u32.to_le_bytes());
            }
            let head = Head {
                kind: 2,
                arch: 90,
                flags: if zstd { FLAG_ZSTD } else { FLAG_LZ4 },
                header_size: 64,
                data_len: data.len() as u32,
                uncompressed: (x >> 48) % 4096,
            };
            let img = wrap(&[raw_entry(&head, &data)]);
            assert_eq!(printf_use(&img, 90), MAYBE, "round {round}");
        }
    }

    #[test]
    fn a_hostile_uncompressed_size_is_refused_before_allocating() {
        for z in [Z::Lz4, Z::Zstd] {
            for size in [u64::MAX, 1 << 40, MAX_UNCOMPRESSED as u64 + 1] {
                let mut e = entry(2, 90, z, &cubin(1000, b"vprintf"));
                e[56..64].copy_from_slice(&size.to_le_bytes());
                let img = wrap(&[e]);
                let entries = fatbin_entries(&img).unwrap();
                assert!(matches!(
                    entries[0].decompress(),
                    Err(DecodeError::TooBig(_))
                ));
                assert_eq!(printf_use(&img, 90), MAYBE);
            }
        }
        // Within the cap, but beyond what a small LZ4 block can expand to.
        let mut e = entry(2, 90, Z::Lz4, &cubin(1000, b"vprintf"));
        e[56..64].copy_from_slice(&(100u64 << 20).to_le_bytes());
        let img = wrap(&[e]);
        assert!(matches!(
            fatbin_entries(&img).unwrap()[0].decompress(),
            Err(DecodeError::TooBig(_))
        ));
        // A zstd frame header claiming a terabyte, and no size in the entry header.
        let mut frame = 0xFD2F_B528u32.to_le_bytes().to_vec();
        frame.push(0xE0); // 8-byte content size, single segment
        frame.extend_from_slice(&(1u64 << 40).to_le_bytes());
        frame.extend_from_slice(&[1, 0, 0]); // last raw block, empty
        let head = Head {
            kind: 2,
            arch: 90,
            flags: FLAG_ZSTD,
            header_size: 48,
            data_len: frame.len() as u32,
            uncompressed: 0,
        };
        assert_eq!(printf_use(&wrap(&[raw_entry(&head, &frame)]), 90), MAYBE);
    }

    #[test]
    fn lz4_needs_the_size_from_a_long_enough_header() {
        let code = cubin(1000, b"vprintf");
        let data = lz4_flex::block::compress(&code);
        let mut head = Head {
            kind: 2,
            arch: 90,
            flags: FLAG_LZ4,
            header_size: 48,
            data_len: data.len() as u32,
            uncompressed: code.len() as u64,
        };
        assert_eq!(printf_use(&wrap(&[raw_entry(&head, &data)]), 90), MAYBE);
        head.header_size = 64;
        assert_eq!(printf_use(&wrap(&[raw_entry(&head, &data)]), 90), YES);
        // A size that is off, even by a byte, is not taken on trust.
        head.uncompressed += 1;
        assert_eq!(printf_use(&wrap(&[raw_entry(&head, &data)]), 90), MAYBE);
    }

    #[test]
    fn lz4_padding_is_tolerated_without_the_length_hint() {
        let code = cubin(3000, b"vprintf");
        let data = lz4_flex::block::compress(&code);
        assert_ne!(data.len() % 8, 0, "the test needs padding");
        let head = Head {
            kind: 2,
            arch: 90,
            flags: FLAG_LZ4,
            header_size: 64,
            data_len: 0,
            uncompressed: code.len() as u64,
        };
        let img = wrap(&[raw_entry(&head, &data)]);
        let entries = fatbin_entries(&img).unwrap();
        let d = entries[0].decompress().unwrap();
        assert_eq!(d.bytes, code);
        assert_eq!(d.input_len, data.len(), "trailing zeros trimmed");
        assert_eq!(printf_use(&img, 90), YES);
    }

    #[test]
    fn a_hand_made_zstd_frame_decodes() {
        // Magic, a single-segment header with a 1-byte content size, one raw last block:
        // the format as its RFC writes it, independent of the encoder the tests use.
        // With a content checksum too (bit 2 of the descriptor): read, not verified.
        let code = b"\x7fELF.....call __assertfail";
        for checksum in [false, true] {
            let mut frame = 0xFD2F_B528u32.to_le_bytes().to_vec();
            frame.push(if checksum { 0x24 } else { 0x20 });
            frame.push(code.len() as u8);
            let block = ((code.len() as u32) << 3) | 1;
            frame.extend_from_slice(&block.to_le_bytes()[..3]);
            frame.extend_from_slice(code);
            if checksum {
                frame.extend_from_slice(&[1, 2, 3, 4]);
            }
            let head = Head {
                kind: 2,
                arch: 90,
                flags: 0x11 | FLAG_ZSTD,
                header_size: 64,
                data_len: frame.len() as u32,
                uncompressed: code.len() as u64,
            };
            let img = wrap(&[raw_entry(&head, &frame)]);
            let entries = fatbin_entries(&img).unwrap();
            let d = entries[0].decompress().unwrap();
            assert_eq!(d.bytes, code);
            assert_eq!(
                d.input_len,
                frame.len(),
                "the padding after the frame is not read"
            );
            assert_eq!(printf_use(&img, 90), ASSERT);
            // Cut short by more than the padding that follows, the frame is not taken
            // for whole.
            let cut = Head {
                data_len: 0,
                ..head
            };
            let img = wrap(&[raw_entry(&cut, &frame[..frame.len() - 12])]);
            assert_eq!(printf_use(&img, 90), MAYBE);
        }
    }

    #[test]
    fn search_is_exact() {
        assert!(contains(b"xxvprintf", b"vprintf"));
        assert!(!contains(b"xxvprintvprint", b"vprintf"));
        assert!(!contains(b"", b"vprintf"));
        assert_eq!(find(b"abcabc", b"bc", 2), Some(4));
        assert_eq!(find(b"abc", b"bc", 9), None);
    }

    #[test]
    fn cubins_and_ptx_outside_a_fatbin_are_read_whole() {
        assert_eq!(printf_use(b"\x7fELF....vprintf....", 90), YES);
        assert_eq!(printf_use(b"\x7fELF....__assertfail....", 90), ASSERT);
        assert_eq!(printf_use(b"\x7fELF..__assertfail..vprintf..", 90), YES);
        assert_eq!(printf_use(b".version 8.0\n.target sm_90\n", 90), NONE);
    }

    #[test]
    fn a_truncated_fatbin_is_read_as_far_as_it_goes() {
        let mut img = fatbin(&[(2, 90, Z::Plain, b"vprintf"), (2, 90, Z::Plain, b"other")]);
        img.truncate(img.len() - 3);
        assert_eq!(printf_use(&img, 90), YES);
        img.truncate(30);
        assert_eq!(printf_use(&img, 90), NONE);
    }

    #[test]
    fn fatbin_length_comes_from_its_header() {
        let mut img = [0u8; 64];
        img[0..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        img[6..8].copy_from_slice(&16u16.to_le_bytes());
        img[8..16].copy_from_slice(&40u64.to_le_bytes());
        // SAFETY: img is 64 bytes, more than the 56 the header claims.
        assert_eq!(unsafe { image_slice(img.as_ptr()) }.unwrap().len(), 56);
    }

    #[test]
    fn ptx_length_includes_the_nul() {
        let img = b".version 8.0\n.target sm_90\0garbage";
        // SAFETY: NUL-terminated.
        assert_eq!(unsafe { image_slice(img.as_ptr()) }.unwrap().len(), 27);
    }

    #[test]
    fn elf_length_covers_sections_and_headers() {
        let mut img = vec![0u8; 512];
        img[0..4].copy_from_slice(&ELF_MAGIC);
        img[4] = 2;
        img[40..48].copy_from_slice(&128u64.to_le_bytes()); // shoff
        img[58..60].copy_from_slice(&64u16.to_le_bytes()); // shentsize
        img[60..62].copy_from_slice(&2u16.to_le_bytes()); // shnum
                                                          // section 1: PROGBITS at 300, 100 bytes -> ends at 400, past the table's 256
        let s1 = 128 + 64;
        img[s1 + 4..s1 + 8].copy_from_slice(&1u32.to_le_bytes());
        img[s1 + 24..s1 + 32].copy_from_slice(&300u64.to_le_bytes());
        img[s1 + 32..s1 + 40].copy_from_slice(&100u64.to_le_bytes());
        // SAFETY: img is 512 bytes, covering everything the headers name.
        assert_eq!(unsafe { image_slice(img.as_ptr()) }.unwrap().len(), 400);
    }
}
