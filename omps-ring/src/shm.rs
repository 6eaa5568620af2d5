//! Anonymous shared-memory segments (sealed memfds) and their mappings.
//!
//! The creator seals the size so that the peer it hands the fd to cannot shrink the
//! file under the creator's mapping (which would turn the creator's next access into a
//! SIGBUS); the receiver checks the seal is there for the same reason.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn invalid(message: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// Creates a zero-filled segment of `len` bytes whose size can never change again.
pub fn create_segment(name: &str, len: usize) -> io::Result<OwnedFd> {
    let name = CString::new(name).map_err(|_| invalid("segment name contains a NUL byte"))?;
    let size = libc::off_t::try_from(len).map_err(|_| invalid("segment too large"))?;
    // SAFETY: `name` is a valid C string for the call.
    let raw = check(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?;
    // SAFETY: memfd_create just returned this fd to us and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain syscall on an fd we own.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), size) })?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: plain syscall on an fd we own.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(fd)
}

/// Checks that a segment received from a peer is `expected_len` bytes and sealed
/// against shrinking.
pub fn check_segment(fd: BorrowedFd<'_>, expected_len: usize) -> io::Result<()> {
    // SAFETY: plain syscall on a borrowed, open fd; fails (EINVAL) if it is not a
    // sealable file.
    let seals = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })?;
    if seals & libc::F_SEAL_SHRINK == 0 {
        return Err(invalid("segment is not sealed against shrinking"));
    }
    if file_len(fd)? != expected_len as u64 {
        return Err(invalid("segment has the wrong size"));
    }
    Ok(())
}

fn file_len(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat fills the whole struct on success, checked before reading it.
    let stat = unsafe {
        check(libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()))?;
        stat.assume_init()
    };
    Ok(stat.st_size as u64)
}

/// A shared, read-write mapping of a whole segment, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value until drop; every access to
// its contents goes through `as_ptr` and unsafe code that must do its own
// synchronisation (it is shared with another process anyway).
unsafe impl Send for Mapping {}
// SAFETY: as for Send: `&Mapping` only hands out the address and the length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `fd`. Refuses a file shorter than `len`, whose
    /// missing tail would SIGBUS; a peer's fd must also pass [`check_segment`] so that
    /// it cannot become shorter later.
    pub fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        Self::map_near(fd, len, 0)
    }

    /// As [`Mapping::map`], at `hint` if that range is free (0: wherever the kernel likes).
    pub fn map_near(fd: BorrowedFd<'_>, len: usize, hint: usize) -> io::Result<Mapping> {
        if file_len(fd)? < len as u64 {
            return Err(invalid("segment is shorter than the mapping"));
        }
        // SAFETY: without MAP_FIXED the hint is only a hint: the kernel never places the
        // mapping over anything of ours.
        let ptr = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        Ok(Mapping { ptr, len })
    }

    /// Page-aligned start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own exactly this range since `map`, and drop runs once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn segment_is_zeroed_shared_and_sealed() {
        let fd = create_segment("omps-test", 8192).unwrap();
        check_segment(fd.as_fd(), 8192).unwrap();
        assert!(check_segment(fd.as_fd(), 4096).is_err());

        let a = Mapping::map(fd.as_fd(), 8192).unwrap();
        let b = Mapping::map(fd.as_fd(), 8192).unwrap();
        assert_eq!(a.len(), 8192);
        assert_eq!(a.as_ptr() as usize % 4096, 0);
        // SAFETY: both mappings are 8192 bytes long and alive; nothing else uses them.
        unsafe {
            assert!(std::slice::from_raw_parts(a.as_ptr(), 8192)
                .iter()
                .all(|&b| b == 0));
            a.as_ptr().add(8191).write(0x5A);
            assert_eq!(b.as_ptr().add(8191).read(), 0x5A);
        }

        // SAFETY: plain syscalls on an fd we own.
        unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), 4096), -1);
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), 16384), -1);
            assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, 0), -1);
        }
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn refuses_unsealed_files_and_short_mappings() {
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        assert!(check_segment(file.as_fd(), 0).is_err());

        let fd = create_segment("omps-test", 4096).unwrap();
        assert!(Mapping::map(fd.as_fd(), 8192).is_err());
        assert!(create_segment("bad\0name", 4096).is_err());
    }
}
