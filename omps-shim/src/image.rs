//! How long a module image is. cuModuleLoadData gets only a pointer, so the size comes
//! from the image's own header: fatbin, fatbin wrapper, ELF cubin, or NUL-terminated PTX.

const FATBIN_MAGIC: u32 = 0xBA55_ED50;
const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43B1;
const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];

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

/// Whether the code the GPU will run from `image` calls device printf (a
/// `wire::printf_use` level), for a device of compute capability `cc` (90 for 9.0).
///
/// A cubin or PTX that calls printf names the driver's `vprintf`. In a fatbin only the
/// entries the driver would pick count: cubins of the device's major version not newer
/// than it, else PTX. Compressed entries are not looked into: they make it a maybe.
pub fn printf_use(image: &[u8], cc: u32) -> u64 {
    use omps_ring::wire::printf_use::{MAYBE, NONE, YES};
    let names_vprintf = |b: &[u8]| b.windows(7).any(|w| w == b"vprintf");
    let Some(entries) = fatbin_entries(image) else {
        return if names_vprintf(image) { YES } else { NONE };
    };
    let cubins: Vec<&FatEntry> = entries
        .iter()
        .filter(|e| e.kind == FATBIN_ELF && e.arch / 10 == cc / 10 && e.arch <= cc)
        .collect();
    let chosen = if cubins.is_empty() {
        entries
            .iter()
            .filter(|e| e.kind == FATBIN_PTX && e.arch <= cc)
            .collect()
    } else {
        cubins
    };
    chosen
        .iter()
        .map(|e| match (e.compressed, names_vprintf(e.payload)) {
            (true, _) => MAYBE,
            (false, true) => YES,
            (false, false) => NONE,
        })
        .max()
        .unwrap_or(NONE)
}

const FATBIN_PTX: u16 = 1;
const FATBIN_ELF: u16 = 2;
/// Entry flags that mark a compressed payload (LZ4 in older toolchains, zstd in newer).
const FATBIN_COMPRESSED: u64 = 0x2000 | 0x8000;

struct FatEntry<'a> {
    kind: u16,
    arch: u32,
    compressed: bool,
    payload: &'a [u8],
}

/// The entries of a fatbin image; None if it is not one. A truncated entry ends the list.
fn fatbin_entries(image: &[u8]) -> Option<Vec<FatEntry<'_>>> {
    let u16at = |b: &[u8], o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u32at = |b: &[u8], o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64at = |b: &[u8], o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    if u32at(image, 0)? != FATBIN_MAGIC {
        return None;
    }
    let start = u16at(image, 6)? as usize;
    let end = image
        .len()
        .min(start.saturating_add(u64at(image, 8)? as usize));
    let mut at = start;
    let mut out = Vec::new();
    while at < end {
        let e = &image[at..end];
        let (Some(kind), Some(hsize), Some(psize), Some(arch), Some(flags)) = (
            u16at(e, 0),
            u32at(e, 4),
            u64at(e, 8),
            u32at(e, 28),
            u64at(e, 40),
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
            compressed: flags & FATBIN_COMPRESSED != 0,
            payload,
        });
        at += hsize + payload.len();
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use omps_ring::wire::printf_use::{MAYBE, NONE, YES};

    /// A fatbin of (kind, arch, compressed, payload) entries, laid out as nvcc does.
    fn fatbin(entries: &[(u16, u32, bool, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for &(kind, arch, compressed, payload) in entries {
            let mut h = [0u8; 64];
            h[0..2].copy_from_slice(&kind.to_le_bytes());
            h[4..8].copy_from_slice(&64u32.to_le_bytes());
            h[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
            h[28..32].copy_from_slice(&arch.to_le_bytes());
            let flags: u64 = if compressed { 0x8011 } else { 0x11 };
            h[40..48].copy_from_slice(&flags.to_le_bytes());
            body.extend_from_slice(&h);
            body.extend_from_slice(payload);
        }
        let mut img = FATBIN_MAGIC.to_le_bytes().to_vec();
        img.extend_from_slice(&1u16.to_le_bytes());
        img.extend_from_slice(&16u16.to_le_bytes());
        img.extend_from_slice(&(body.len() as u64).to_le_bytes());
        img.extend(body);
        img
    }

    #[test]
    fn printf_is_found_in_the_cubin_the_driver_would_pick() {
        // As nvcc 13 builds by default: an sm_90 cubin and compressed PTX.
        let img = fatbin(&[(2, 90, false, b"..vprintf.."), (1, 90, true, b"zz")]);
        assert_eq!(printf_use(&img, 90), YES);
        let img = fatbin(&[(2, 90, false, b"no calls"), (1, 90, true, b"zz")]);
        assert_eq!(
            printf_use(&img, 90),
            NONE,
            "the PTX is not used when a cubin fits"
        );
        // A cubin for another major version is not used: the compressed PTX is.
        let img = fatbin(&[(2, 80, false, b"vprintf"), (1, 80, true, b"zz")]);
        assert_eq!(printf_use(&img, 90), MAYBE);
        // Built with -Xfatbin -compress-all, as PyTorch is.
        let img = fatbin(&[(2, 90, true, b"zz")]);
        assert_eq!(printf_use(&img, 90), MAYBE);
        // Uncompressed PTX is read as text.
        let img = fatbin(&[(1, 70, false, b"call.uni vprintf, (...)")]);
        assert_eq!(printf_use(&img, 90), YES);
    }

    #[test]
    fn cubins_and_ptx_outside_a_fatbin_are_read_whole() {
        assert_eq!(printf_use(b"\x7fELF....vprintf....", 90), YES);
        assert_eq!(printf_use(b".version 8.0\n.target sm_90\n", 90), NONE);
    }

    #[test]
    fn a_truncated_fatbin_is_read_as_far_as_it_goes() {
        let mut img = fatbin(&[(2, 90, false, b"vprintf"), (2, 90, false, b"other")]);
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
