//! Device printf in a client. The driver writes printf output to fd 1 of the process that
//! owns the context, the server, which routes it back (omps-server's `printf` module). The
//! shim declares which code may print when it loads it, and after each synchronizing call
//! asks for the output so far and writes it to its own fd 1 before the call returns, as
//! the driver does natively.

use crate::conn::Conn;
use omps_ring::wire::{self, printf_use};
use std::sync::atomic::{AtomicU64, Ordering};

/// The highest `printf_use` level of the code this process has loaded.
static LEVEL: AtomicU64 = AtomicU64::new(printf_use::NONE);

/// CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR and _MINOR.
const CC_MAJOR: usize = 75;
const CC_MINOR: usize = 76;

/// Looks at an image loaded on `dev` and tells the server if this process now runs code
/// that may print.
pub fn note_image(c: &Conn, dev: usize, image: &[u8]) {
    let Some(d) = c.snapshot.devices.get(dev) else {
        return;
    };
    if LEVEL.load(Ordering::Acquire) == printf_use::YES {
        return; // nothing can raise it: spare the decompression
    }
    let cc = (d.attributes[CC_MAJOR] * 10 + d.attributes[CC_MINOR]) as u32;
    let level = crate::image::printf_use(image, cc);
    if level > LEVEL.fetch_max(level, Ordering::AcqRel) {
        // Without the declaration the output goes to the server log: nothing to undo.
        let _ = c.socket_request(wire::hostmem::PRINTF_USE, 0, level, None);
    }
}

/// Whether a synchronizing call that `failed` (or not) has device text to ask for.
pub fn wanted(failed: bool) -> bool {
    let level = LEVEL.load(Ordering::Acquire);
    if failed {
        level >= printf_use::ASSERT
    } else {
        level >= printf_use::YES
    }
}

/// After a synchronizing call on `dev` that returned `failed`: writes what this process's
/// kernels printed. Code that only asserts is asked for its text only when the call
/// failed, since a failed assert is what ends a kernel with text to show.
pub fn deliver(dev: usize, failed: bool) {
    if !wanted(failed) {
        return;
    }
    let Some(c) = crate::conn::connected() else {
        return;
    };
    let Ok(text) = c.socket_request(wire::hostmem::PRINTF_FLUSH, dev as u64, 0, None) else {
        return;
    };
    // Straight to fd 1, past any stdio buffering, as the driver writes natively.
    // SAFETY: fd 1 stays the program's; ManuallyDrop leaves it open.
    let mut out = std::mem::ManuallyDrop::new(unsafe {
        <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(1)
    });
    let _ = std::io::Write::write_all(&mut *out, &text);
}
