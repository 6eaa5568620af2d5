//! Device printf and assert messages in a client. The driver writes them to fds 1 and 2
//! of the process that owns the context, the server, which routes them back
//! (omps-server's `printf` module). The shim declares which code may print when it loads
//! it, and after a synchronizing call asks for the text so far and writes it to its own
//! fds 1 and 2 before the call returns, as the driver does natively.

use crate::conn::Conn;
use omps_ring::segment::MAX_DEVICES;
use omps_ring::wire::{self, printf_use};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The highest `printf_use` level of the code this process has loaded.
static LEVEL: AtomicU64 = AtomicU64::new(printf_use::NONE);

/// CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR and _MINOR.
const CC_MAJOR: usize = 75;
const CC_MINOR: usize = 76;

/// Looks at an image loaded on `dev`, tells the server if this process now runs code
/// that may print, and returns whether this image's code calls printf.
pub fn note_image(c: &Conn, dev: usize, image: &[u8]) -> bool {
    let Some(d) = c.snapshot.devices.get(dev) else {
        return false;
    };
    let cc = (d.attributes[CC_MAJOR] * 10 + d.attributes[CC_MINOR]) as u32;
    let level = crate::image::printf_use(image, cc);
    if level > LEVEL.fetch_max(level, Ordering::AcqRel) {
        // Without the declaration the output goes to the server log: nothing to undo.
        let _ = c.socket_request(wire::hostmem::PRINTF_USE, 0, level, None);
    }
    level == printf_use::YES
}

/// Per device, launches of printing code that no synchronization has covered yet, and the
/// stream they went to (None once they went to several). Each GPU has its own printf
/// buffer, so a synchronization covers only its own device's.
#[derive(Clone, Copy)]
struct Uncollected {
    launches: u64,
    stream: Option<u32>,
}

const NONE_YET: Uncollected = Uncollected {
    launches: 0,
    stream: None,
};

static UNCOLLECTED: Mutex<[Uncollected; MAX_DEVICES]> = Mutex::new([NONE_YET; MAX_DEVICES]);

fn uncollected() -> std::sync::MutexGuard<'static, [Uncollected; MAX_DEVICES]> {
    UNCOLLECTED.lock().unwrap_or_else(|e| e.into_inner())
}

/// A kernel whose code calls printf was queued on `stream` of device `dev`.
pub fn note_launch(dev: usize, stream: u32) {
    let mut all = uncollected();
    let Some(u) = all.get_mut(dev) else {
        return;
    };
    if u.launches == 0 {
        u.stream = Some(stream);
    } else if u.stream != Some(stream) {
        u.stream = None;
    }
    u.launches += 1;
}

/// Taken just before a synchronizing call on `dev` is sent: what it can cover.
pub fn before_sync(dev: usize) -> u64 {
    uncollected().get(dev).map_or(0, |u| u.launches)
}

/// Which queued work a synchronizing call waited for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Covers {
    /// Everything (a context synchronize).
    All,
    /// Everything queued on this stream.
    Stream(u32),
    /// Some work, not known which (an event, a blocking copy).
    Unknown,
}

/// Whether a synchronizing call on `dev` that `failed` (or not) has device text to ask
/// for: a failure, if the code asserts; otherwise printing code queued on that device
/// since a synchronization that covered it. Asking costs the call a round trip, so code
/// that prints but was not launched asks for nothing.
pub(crate) fn wanted(dev: usize, failed: bool) -> bool {
    let level = LEVEL.load(Ordering::Acquire);
    if failed {
        level >= printf_use::ASSERT
    } else {
        level >= printf_use::YES && before_sync(dev) > 0
    }
}

/// After a synchronizing call on `dev` that returned `failed` and waited for `covers`
/// (`before`: [`before_sync`] taken just before it was sent): writes what this process's
/// kernels printed. Code that only asserts is asked for its text only when the call
/// failed, since a failed assert is what ends a kernel with text to show.
pub fn deliver(dev: usize, failed: bool, covers: Covers, before: u64) {
    if !wanted(dev, failed) {
        return;
    }
    let Some(c) = crate::conn::connected() else {
        return;
    };
    let Ok(text) = c.socket_request(wire::hostmem::PRINTF_FLUSH, dev as u64, 0, None) else {
        return;
    };
    // The launches counted before the call are done if the call waited for them.
    if let Some(u) = uncollected().get_mut(dev) {
        let covered = match covers {
            Covers::All => true,
            Covers::Stream(s) => u.stream == Some(s),
            Covers::Unknown => false,
        };
        if covered && !failed {
            u.launches -= before.min(u.launches);
        }
    }
    let Some((out, err)) = wire::split_printf_reply(&text) else {
        return;
    };
    // Straight to fds 1 and 2, past any stdio buffering, as the driver writes natively.
    for (fd, text) in [(1, out), (2, err)] {
        if text.is_empty() {
            continue;
        }
        // SAFETY: fds 1 and 2 stay the program's; ManuallyDrop leaves them open.
        let mut f = std::mem::ManuallyDrop::new(unsafe {
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
        });
        let _ = std::io::Write::write_all(&mut *f, text);
    }
}
