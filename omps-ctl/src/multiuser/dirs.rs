//! The root daemon's directories and files, made so that no other user can redirect them
//! (issue 23, finding 15). The daemon chowns a directory to each user and writes files as
//! root; done by path, a symlink that a user placed on the way (or a directory the user
//! made first) turned that into a chown or a write of any file on the machine. So the
//! pipe and log directories must be root's and changeable by root alone (checked at every
//! step from `/`, the daemon refuses to start otherwise), and everything in them is
//! reached through the directory's open descriptor, never following a symlink, with
//! ownership and mode set on the opened object.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Component, Path, PathBuf};

/// A directory that only root can change, held open.
#[derive(Debug)]
pub struct RootDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn cstr(name: &std::ffi::OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `name` in directory `at` (a descriptor, or None for `/`), as a directory, no symlink
/// followed.
fn open_dir(at: Option<RawFd>, name: &CString) -> io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated name; `at` is an open directory descriptor when given.
    let fd = unsafe {
        match at {
            Some(at) => libc::openat(at, name.as_ptr(), flags),
            None => libc::open(name.as_ptr(), flags),
        }
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn stat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `path` with the symlinks of the part of it that exists resolved.
fn resolved(path: &Path) -> io::Result<PathBuf> {
    let mut missing = Vec::new();
    let mut at = path;
    loop {
        match std::fs::canonicalize(at) {
            Ok(mut p) => {
                p.extend(missing.iter().rev());
                return Ok(p);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let (Some(name), Some(up)) = (at.file_name(), at.parent()) else {
                    return Err(e);
                };
                missing.push(name);
                at = up;
            }
            Err(e) => return Err(e),
        }
    }
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn why(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

impl RootDir {
    /// Directory `path` (absolute), created with `mode` if absent, then given `mode`.
    /// Refused unless it and every directory above it are root's, and none is writable
    /// by group or others (one above it may be, if sticky, as /tmp is: others cannot
    /// move root's entries there).
    pub fn open(path: &Path, mode: u32) -> Result<RootDir, String> {
        let (Some(name), Some(parent)) = (path.file_name(), path.parent()) else {
            return Err(why(path, "not a directory the daemon can own"));
        };
        if !path.is_absolute() {
            return Err(why(path, "the daemon needs an absolute path"));
        }
        // Symlinks above it (as /var/run -> /run) are resolved first; the walk below
        // follows none, so a path changed meanwhile fails rather than leads elsewhere.
        // Directories above it that are missing are made on the way (root's, 0755).
        let parent = resolved(parent).map_err(|e| why(parent, e))?;
        let path = parent.join(name);
        let mut at = open_dir(None, &cstr("/".as_ref()).expect("no NUL"))
            .map_err(|e| why(Path::new("/"), e))?;
        let mut walked = PathBuf::from("/");
        Self::check_above(&at, &walked)?;
        for c in parent.components() {
            let Component::Normal(c) = c else { continue };
            walked.push(c);
            let c = cstr(c).map_err(|e| why(&walked, e))?;
            let mut next = open_dir(Some(at.as_raw_fd()), &c);
            if next.as_ref().err().and_then(io::Error::raw_os_error) == Some(libc::ENOENT) {
                // SAFETY: a NUL-terminated name in an open directory.
                unsafe { libc::mkdirat(at.as_raw_fd(), c.as_ptr(), 0o755) };
                next = open_dir(Some(at.as_raw_fd()), &c);
            }
            at = next.map_err(|e| why(&walked, e))?;
            Self::check_above(&at, &walked)?;
        }
        let c = cstr(name).map_err(|e| why(&path, e))?;
        // SAFETY: a NUL-terminated name in an open directory.
        let made = unsafe { libc::mkdirat(at.as_raw_fd(), c.as_ptr(), mode) };
        if made != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
            return Err(why(&path, io::Error::last_os_error()));
        }
        let fd = open_dir(Some(at.as_raw_fd()), &c).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOTDIR) => why(&path, "a symlink or not a directory"),
            _ => why(&path, e),
        })?;
        let st = stat(fd.as_raw_fd()).map_err(|e| why(&path, e))?;
        if st.st_uid != 0 {
            return Err(why(
                &path,
                format!(
                    "belongs to uid {}, not root (another user may have made it first): remove it or choose another directory",
                    st.st_uid
                ),
            ));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(why(
                &path,
                format!(
                    "mode {:o} lets others change it: remove it or choose another directory",
                    st.st_mode & 0o7777
                ),
            ));
        }
        // SAFETY: fchmod on a descriptor this function owns.
        check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) }).map_err(|e| why(&path, e))?;
        Ok(RootDir { fd, path })
    }

    fn check_above(fd: &OwnedFd, path: &Path) -> Result<(), String> {
        let st = stat(fd.as_raw_fd()).map_err(|e| why(path, e))?;
        let sticky = st.st_mode & libc::S_ISVTX != 0;
        if st.st_uid != 0 || (st.st_mode & 0o022 != 0 && !sticky) {
            return Err(why(
                path,
                format!(
                    "uid {} mode {:o}: a directory above the daemon's must be root's and changeable by root alone",
                    st.st_uid,
                    st.st_mode & 0o7777
                ),
            ));
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Directory `name` in this one, for `uid` alone (owned by uid:gid, mode 0700):
    /// made now, or one made before by the daemon; never a symlink, and never one that
    /// some other user owns. Its path.
    pub fn private_child(&self, name: &str, uid: u32, gid: u32) -> Result<PathBuf, String> {
        let path = self.path.join(name);
        let c = cstr(name.as_ref()).map_err(|e| why(&path, e))?;
        // SAFETY: a NUL-terminated name in the open directory.
        let made = unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o700) };
        if made != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
            return Err(why(&path, io::Error::last_os_error()));
        }
        let fd = open_dir(Some(self.fd.as_raw_fd()), &c).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOTDIR) => why(&path, "a symlink or not a directory"),
            _ => why(&path, e),
        })?;
        let st = stat(fd.as_raw_fd()).map_err(|e| why(&path, e))?;
        if st.st_uid != 0 && st.st_uid != uid {
            return Err(why(
                &path,
                format!("belongs to uid {}, not {uid}", st.st_uid),
            ));
        }
        // SAFETY: fchown and fchmod on a descriptor this function owns.
        check(unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) })
            .and_then(|()| check(unsafe { libc::fchmod(fd.as_raw_fd(), 0o700) }))
            .map_err(|e| why(&path, e))?;
        let st = stat(fd.as_raw_fd()).map_err(|e| why(&path, e))?;
        if st.st_uid != uid || st.st_mode & 0o7777 != 0o700 {
            return Err(why(&path, "did not become the user's alone"));
        }
        Ok(path)
    }

    /// File `name` here, opened to write (to append, or emptied): made 0644 if absent;
    /// refused unless a regular file of root's with no other name (never a symlink, a
    /// FIFO, or a hard link to a file elsewhere).
    pub fn file(&self, name: &str, append: bool) -> io::Result<File> {
        let c = cstr(name.as_ref())?;
        let mut flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
        if append {
            flags |= libc::O_APPEND;
        }
        // SAFETY: a NUL-terminated name in the open directory.
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags, 0o644) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened, owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        let st = stat(fd)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != 0 || st.st_nlink != 1 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is not a regular file of root's alone",
                    self.path.join(name).display()
                ),
            ));
        }
        // SAFETY: fcntl and ftruncate on the descriptor `file` owns.
        unsafe {
            libc::fcntl(fd, libc::F_SETFL, flags & libc::O_APPEND);
            if !append {
                check(libc::ftruncate(fd, 0))?;
            }
        }
        Ok(file)
    }

    /// Renames `from` here to `to` here, replacing `to` (whatever it is: a rename never
    /// follows a symlink at either name).
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let (f, t) = (cstr(from.as_ref())?, cstr(to.as_ref())?);
        let fd = self.fd.as_raw_fd();
        // SAFETY: NUL-terminated names in the open directory.
        check(unsafe { libc::renameat(fd, f.as_ptr(), fd, t.as_ptr()) })
    }

    /// Removes file `name` here (not following a symlink there, which goes itself).
    pub fn remove(&self, name: &str) {
        if let Ok(c) = cstr(name.as_ref()) {
            // SAFETY: a NUL-terminated name in the open directory.
            unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) };
        }
    }
}

/// A connection to socket `name` in `dir`, a user's directory that the daemon made
/// (its path is root's to change), if that socket is `uid`'s own: a symlink the user
/// put there is not followed (it could name another user's server). The connect does
/// not wait: a server that stopped taking connections makes it fail.
pub fn connect_owned(dir: &Path, name: &str, uid: u32) -> io::Result<UnixStream> {
    let c = cstr(dir.join(name).as_os_str())?;
    // SAFETY: a NUL-terminated path; O_PATH opens the socket's inode without using it.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    let inode = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = stat(inode.as_raw_fd())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK || st.st_uid != uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a socket of uid {uid}", dir.join(name).display()),
        ));
    }
    // Connecting through the descriptor's /proc name reaches the very inode checked.
    let via = format!("/proc/self/fd/{}", inode.as_raw_fd());
    // SAFETY: socket() has no preconditions.
    let s = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a socket just made, owned by nobody else.
    let stream = unsafe { UnixStream::from_raw_fd(s) };
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, b) in addr.sun_path.iter_mut().zip(via.as_bytes()) {
        *d = *b as libc::c_char;
    }
    // SAFETY: `addr` is a valid sockaddr_un with a NUL-terminated path (it is far
    // shorter than sun_path).
    check(unsafe {
        libc::connect(
            s,
            &addr as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    })?;
    stream.set_nonblocking(false)?;
    Ok(stream)
}
