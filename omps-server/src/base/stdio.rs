//! The server's own stderr. The driver writes device assert messages to fd 2, so the
//! printf router points fd 2 at a pipe whose text goes to clients ([`crate::client::printf`]);
//! the server's diagnostics must not go there, and use the descriptor it started with
//! (fd 1's is kept too, for a restart).

use std::io::Write;
use std::os::fd::FromRawFd;
use std::sync::OnceLock;

static KEPT: OnceLock<std::fs::File> = OnceLock::new();
static KEPT_OUT: OnceLock<std::fs::File> = OnceLock::new();

/// Keeps copies of the current fds 1 and 2 for [`stderr`] and [`restore`], before the
/// printf router takes them over.
pub fn keep_stdio() -> std::io::Result<()> {
    for (fd, cell) in [(2, &KEPT), (1, &KEPT_OUT)] {
        if cell.get().is_some() {
            continue;
        }
        // SAFETY: F_DUPFD_CLOEXEC on fd 1 or 2 returns a new descriptor, or -1.
        let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
        if copy < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: copy was just duplicated for us and is owned by nobody else.
        let _ = cell.set(unsafe { std::fs::File::from_raw_fd(copy) });
    }
    Ok(())
}

/// Points fds 1 and 2 back at what the server started with (before it execs itself, so
/// that the new image writes where the first did).
pub fn restore() {
    use std::os::fd::AsRawFd;
    for (fd, cell) in [(1, &KEPT_OUT), (2, &KEPT)] {
        if let Some(f) = cell.get() {
            // SAFETY: dup2 of a descriptor we hold onto fd 1 or 2, which it replaces.
            unsafe { libc::dup2(f.as_raw_fd(), fd) };
        }
    }
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
            &mut $crate::base::stdio::stderr(),
            format_args!("{}\n", format_args!($($t)*)),
        );
    }};
}
