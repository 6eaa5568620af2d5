//! Opening a log file the server appends to (server.log, control.log) in a log directory
//! that its user, or anyone that user lets in, may have prepared. Under a root control
//! daemon one user's server start held up other users' connections, so no file there may
//! hang the start: a FIFO opened for writing waits for a reader forever, and a symlink
//! would send the lines wherever it points. Such files are refused (the server logs to
//! stderr instead) rather than followed or waited for.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// `dir`/`name`, created if absent (0644), opened to append; an error if it is a symlink
/// or anything but a regular file.
pub fn open_append(dir: &Path, name: &str) -> io::Result<File> {
    let path = dir.join(name);
    // O_NONBLOCK: a FIFO without a reader fails (ENXIO) instead of blocking the open.
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refused(&path, "a symlink"),
            Some(libc::ENXIO) => refused(&path, "a FIFO"),
            _ => e,
        })?;
    let ft = file.metadata()?.file_type();
    if !ft.is_file() {
        let what = if ft.is_fifo() {
            "a FIFO"
        } else {
            "not a regular file"
        };
        return Err(refused(&path, what));
    }
    // Writes to a regular file never block anyway; the flag goes for tidiness.
    // SAFETY: F_GETFL/F_SETFL on a descriptor `file` owns change only its status flags.
    unsafe {
        let fl = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
    Ok(file)
}

fn refused(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{} is {what}, not a log file", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::{Duration, Instant};

    #[test]
    fn only_regular_files_are_opened() {
        let dir = std::env::temp_dir().join(format!("omps-log-file-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let c = std::ffi::CString::new(dir.join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = Instant::now();
        let e = open_append(&dir, "fifo").expect_err("a FIFO opened");
        assert!(e.to_string().contains("FIFO"), "{e}");
        // A reader present, the open itself succeeds: the type check refuses it.
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(dir.join("fifo"))
            .unwrap();
        let e = open_append(&dir, "fifo").expect_err("a FIFO with a reader opened");
        assert!(e.to_string().contains("FIFO"), "{e}");
        drop(reader);
        assert!(t.elapsed() < Duration::from_secs(1));
        let target = dir.join("target");
        std::fs::write(&target, "").unwrap();
        std::os::unix::fs::symlink(&target, dir.join("link")).unwrap();
        let e = open_append(&dir, "link").expect_err("a symlink followed");
        assert!(e.to_string().contains("symlink"), "{e}");
        let mut f = open_append(&dir, "server.log").unwrap();
        writeln!(f, "one").unwrap();
        let mut f = open_append(&dir, "server.log").unwrap();
        writeln!(f, "two").unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("server.log")).unwrap(),
            "one\ntwo\n"
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
