//! Physical memory shared between clients of one server: cuMemExportToShareableHandle and
//! cuMemImportFromShareableHandle with POSIX file descriptors, as PyTorch's expandable
//! segments share CUDA tensors between processes. The descriptor is a small memfd that
//! holds the server's token for the memory (and its device); a process that was given
//! the descriptor (over a socket, or with pidfd_getfd) imports the memory by it, into
//! its current device's session whichever GPU the memory lives on. Only the
//! server's clients can use the token, and the memory lives until its last user
//! releases it (omps-server/src/ipc.rs).

use super::vmm::{books, call_raw};
use crate::cuda::*;
use crate::state::entry::{entry, out};
use omps_ring::wire::vmm;
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::os::fd::{AsRawFd, IntoRawFd};

/// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.
pub(crate) const POSIX_FD: c_uint = 1;
const MAGIC: [u8; 8] = *b"omps-vmm";
/// What the descriptor holds: the magic, the device, the token.
const CONTENT: usize = 32;

/// A new descriptor holding `magic`, `dev` and `token` (a shareable handle of omps's).
pub(crate) fn write_descriptor(
    magic: [u8; 8],
    dev: usize,
    token: &[u8; 16],
) -> Result<c_int, CUresult> {
    let fd = omps_ring::shm::create_segment("omps-handle", CONTENT)
        .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    let mut content = [0u8; CONTENT];
    content[..8].copy_from_slice(&magic);
    content[8..16].copy_from_slice(&(dev as u64).to_le_bytes());
    content[16..].copy_from_slice(token);
    // SAFETY: a descriptor of ours; the buffer holds CONTENT bytes.
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), content.as_ptr().cast(), CONTENT, 0) };
    if n != CONTENT as isize {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(fd.into_raw_fd())
}

/// The device (one this process sees) and the token of a descriptor `write_descriptor`
/// made with `magic`; INVALID_VALUE for anything else.
pub(crate) fn read_descriptor(fd: c_int, magic: [u8; 8]) -> Result<(usize, [u64; 2]), CUresult> {
    let mut content = [0u8; CONTENT];
    // SAFETY: reads into our buffer of CONTENT bytes from the caller's descriptor.
    let n = unsafe { libc::pread(fd, content.as_mut_ptr().cast(), CONTENT, 0) };
    // Not one of omps's descriptors (or not readable): not a shareable handle.
    if n != CONTENT as isize || content[..8] != magic {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let word = |at: usize| u64::from_le_bytes(content[at..at + 8].try_into().expect("8 bytes"));
    let dev = usize::try_from(word(8)).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    crate::state::device::device(c_int::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_VALUE)?)?;
    Ok((dev, [word(16), word(24)]))
}

/// # Safety
/// `shareable` is null or a writable int.
#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    h: u64,
    ty: c_uint,
    flags: c_ulonglong,
) -> CUresult {
    entry(|| {
        if shareable.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if ty != POSIX_FD {
            return Err(crate::unsupported::unsupported(
                "cuMemExportToShareableHandle of a handle type other than a POSIX descriptor",
            ));
        }
        let (dev, _, _, types, _) =
            books(|b| b.handles.get(&h).copied()).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // The memory must have been made exportable this way, as natively.
        if types & POSIX_FD == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let token: [u8; 16] = call_raw(dev, vmm::EXPORT, h as u32, [0; 3])?;
        let fd = write_descriptor(MAGIC, dev, &token)?;
        // SAFETY: the caller's int.
        unsafe { out(shareable as *mut c_int, fd) }
    })
}

/// # Safety
/// `h` is null or writable; `os` is a descriptor, passed as a pointer-sized value.
#[no_mangle]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    h: *mut u64,
    os: *mut c_void,
    ty: c_uint,
) -> CUresult {
    entry(|| {
        if h.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if ty != POSIX_FD {
            return Err(crate::unsupported::unsupported(
                "cuMemImportFromShareableHandle of a handle type other than a POSIX descriptor",
            ));
        }
        let (_, [lo, hi]) = read_descriptor(os as usize as c_int, MAGIC)?;
        // Imported into the current device's session, whichever GPU the memory lives on:
        // a process maps it into reservations it makes there (NCCL's peers do).
        let dev = crate::state::ctx::current_dev()?;
        let [id, size, compression, home]: [u64; 4] = call_raw(dev, vmm::IMPORT, 0, [lo, hi, 0])?;
        let handle = ((dev as u64 + 1) << 32) | id;
        books(|b| {
            b.handles
                .insert(handle, (dev, size, 1, POSIX_FD, compression as u8));
            match usize::try_from(home) {
                Ok(h) if h != dev => b.homes.insert(handle, h),
                _ => None,
            }
        });
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(h, handle) }
    })
}
