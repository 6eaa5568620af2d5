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

#[cfg(test)]
mod tests {
    use super::*;

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
