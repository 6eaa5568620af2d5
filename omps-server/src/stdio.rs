//! The server's own stderr. The driver writes device assert messages to fd 2, so the
//! printf router points fd 2 at a pipe whose text goes to clients ([`crate::printf`]);
//! the server's diagnostics must not go there, and use the descriptor it started with.

use std::io::Write;
use std::os::fd::FromRawFd;
use std::sync::OnceLock;

static KEPT: OnceLock<std::fs::File> = OnceLock::new();

/// Keeps a copy of the current fd 2 for [`stderr`], before fd 2 is taken over.
pub fn keep_stderr() -> std::io::Result<()> {
    if KEPT.get().is_some() {
        return Ok(());
    }
    // SAFETY: F_DUPFD_CLOEXEC on fd 2 returns a new descriptor, or -1.
    let fd = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just duplicated for us and is owned by nobody else.
    let _ = KEPT.set(unsafe { std::fs::File::from_raw_fd(fd) });
    Ok(())
}

/// Where the server's own messages go: the stderr it started with.
pub fn stderr() -> Box<dyn Write> {
    match KEPT.get() {
        Some(f) => Box::new(f),
        None => Box::new(std::io::stderr()),
    }
}

/// `eprintln!` to the server's own stderr.
#[macro_export]
macro_rules! say {
    ($($t:tt)*) => {{
        let _ = std::io::Write::write_fmt(
            &mut $crate::stdio::stderr(),
            format_args!("{}\n", format_args!($($t)*)),
        );
    }};
}
