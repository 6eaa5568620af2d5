//! Opening a log file the server appends to (server.log, control.log) in a log directory
//! that its user, or anyone that user lets in, may have prepared. Under a root control
//! daemon one user's server start held up other users' connections, so no file there may
//! hang the start: a FIFO opened for writing waits for a reader forever, and a symlink
//! would send the lines wherever it points. Such files are refused (the server logs to
//! stderr instead) rather than followed or waited for.
//!
//! A client that provokes refusals and diagnostics in a loop (a new connection gets its
//! few logged refusals again, an out-of-memory answer is logged each time) must not fill
//! the disk either (issue 23, finding 14): [`CappedLog`] keeps each log under
//! OMPS_LOG_MAX_BYTES (64 MiB by default), moving a full one to `NAME.1`, so a log takes at
//! most twice that. A flood can push older lines out of both, but no further.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A log's size before it is moved to `NAME.1` (omps_ring::sock::log_max_bytes).
pub fn max_bytes() -> u64 {
    omps_ring::sock::log_max_bytes()
}

/// A log file in `dir` that stays under a size: a write that would take it past `max`
/// first moves it to `NAME.1` (replacing the one before) and starts it anew. Each write
/// is one line or a few (tracing writes an event at once), so lines are not split.
pub struct CappedLog {
    dir: PathBuf,
    name: String,
    /// None once it could not be started anew: lines are dropped, never written on
    /// without a bound.
    file: Option<File>,
    len: u64,
    /// 0: no cap.
    max: u64,
}

impl CappedLog {
    /// `dir`/`name` as [`open_append`] opens it, kept under `max` bytes (0: no cap).
    pub fn open(dir: &Path, name: &str, max: u64) -> io::Result<CappedLog> {
        let file = open_append(dir, name)?;
        let len = file.metadata()?.len();
        Ok(CappedLog {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            file: Some(file),
            len,
            max,
        })
    }

    fn rotate(&mut self) {
        self.file = None;
        let path = self.dir.join(&self.name);
        // A rename replaces whatever NAME.1 is (a symlink too) and never follows it.
        let moved = std::fs::rename(&path, self.dir.join(format!("{}.1", self.name)));
        self.file = match moved {
            Ok(()) => open_append(&self.dir, &self.name).ok(),
            Err(_) => None,
        };
        self.len = 0;
    }
}

impl Write for CappedLog {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.max != 0 && self.len.saturating_add(buf.len() as u64) > self.max && self.len > 0 {
            self.rotate();
        }
        let Some(f) = &mut self.file else {
            return Ok(buf.len());
        };
        // One write longer than the whole cap keeps its start only.
        let n = match self.max {
            0 => buf.len(),
            m => buf.len().min(m as usize),
        };
        f.write_all(&buf[..n])?;
        self.len += n as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.as_mut().map_or(Ok(()), |f| f.flush())
    }
}

/// The server's logging: to `server.log` in the log directory (kept under
/// [`max_bytes`]), else to stderr; OMPS_LOG filters it (`info` by default).
pub fn init_logging() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("OMPS_LOG").unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false);
    match omps_ring::sock::log_directory() {
        Some(dir) => {
            let _ = std::fs::create_dir_all(&dir);
            match CappedLog::open(&dir, "server.log", max_bytes()) {
                Ok(f) => builder.with_writer(std::sync::Mutex::new(f)).init(),
                Err(e) => {
                    crate::say!(
                        "omps-server: cannot open {}/server.log: {e}; logging to stderr",
                        dir.display()
                    );
                    builder.with_writer(crate::base::stdio::stderr).init()
                }
            }
        }
        None => builder.with_writer(crate::base::stdio::stderr).init(),
    }
}

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

    #[test]
    fn a_capped_log_moves_to_its_old_name_when_full() {
        let dir = std::env::temp_dir().join(format!("omps-log-cap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut log = CappedLog::open(&dir, "x.log", 100).unwrap();
        for i in 0..50 {
            log.write_all(format!("line {i:03} of a flood\n").as_bytes())
                .unwrap();
        }
        let now = std::fs::read_to_string(dir.join("x.log")).unwrap();
        let old = std::fs::read_to_string(dir.join("x.log.1")).unwrap();
        assert!(now.len() <= 100 && old.len() <= 100, "{now:?} {old:?}");
        assert!(now.ends_with("line 049 of a flood\n"), "{now:?}");
        assert!(old.starts_with("line "), "whole lines: {old:?}");
        // A line longer than the cap is cut, not written whole.
        log.write_all("y".repeat(300).as_bytes()).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("x.log")).unwrap().len(),
            100
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
