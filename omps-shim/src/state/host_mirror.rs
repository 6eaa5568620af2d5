//! Device-side mirrors of registered host memory the server cannot map.
//!
//! cuMemHostRegister moves whole pages of a program onto memory shared with the server
//! (api/hostmem.rs), but a piece of a page stays where it is: its page holds other objects
//! of the program, on the stack or the heap, which cannot be moved under its feet. NPP
//! registers a 4-byte stack variable that way, asks for its device pointer and has a
//! kernel write a count there. Such a piece gets a mirror when its device pointer is asked
//! for: page-locked memory shared with the server, whose address is the device pointer.
//! Program and mirror are merged around every driver call the program makes
//! (api/mod.rs `entry`): bytes the GPU changed in the mirror since the last merge go to
//! the program's memory, bytes the program changed go to the mirror. A program sees the
//! GPU's writes once it has synchronized, as CUDA promises; a CPU thread polling the
//! memory while a kernel runs, with no driver call between, does not (design.md 13).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

struct Mirror {
    /// The registered piece in the program's memory.
    host: usize,
    /// Where its bytes sit in the shared allocation (the device pointer of `host`).
    dev: usize,
    /// The shared allocation, freed with the registration.
    alloc: usize,
    /// The bytes as of the last merge: what either side changed since is told apart.
    seen: Vec<u8>,
}

static MIRRORS: Mutex<Vec<Mirror>> = Mutex::new(Vec::new());
/// How many mirrors exist: `entry` merges only when there are some.
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn lock() -> std::sync::MutexGuard<'static, Vec<Mirror>> {
    MIRRORS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether any mirror exists (one relaxed load on every driver call).
pub(crate) fn any() -> bool {
    COUNT.load(Ordering::Relaxed) > 0
}

/// The device pointer of `p` in the registered piece `[host, host+len)`, mirrored first if
/// it is not yet. `alloc(n)` returns page-locked memory of n bytes the server reaches.
///
/// # Safety
/// `[host, host+len)` is the program's registered memory, readable and writable while
/// registered.
pub(crate) unsafe fn device_pointer(
    host: usize,
    len: usize,
    p: usize,
    alloc: impl FnOnce(usize) -> Option<usize>,
) -> Option<u64> {
    let inside = p.checked_sub(host).filter(|&o| o < len)?;
    // Held throughout, so two threads asking at once make one mirror.
    let mut all = lock();
    if let Some(m) = all.iter().find(|m| m.host == host) {
        return Some((m.dev + inside) as u64);
    }
    // The same offset in a page as the program's bytes: what was aligned stays aligned.
    let offset = host % 4096;
    let base = alloc(offset + len)?;
    let dev = base + offset;
    let mut seen = vec![0u8; len];
    // SAFETY: the caller's registered range and the fresh allocation both hold len bytes;
    // volatile, as another thread of the program may write its bytes meanwhile.
    unsafe {
        for (i, b) in seen.iter_mut().enumerate() {
            *b = std::ptr::read_volatile((host + i) as *const u8);
            std::ptr::write_volatile((dev + i) as *mut u8, *b);
        }
    }
    all.push(Mirror {
        host,
        dev,
        alloc: base,
        seen,
    });
    COUNT.store(all.len(), Ordering::Relaxed);
    Some((dev + inside) as u64)
}

/// Merges every mirror with the program's memory. Called before and after each driver
/// call while mirrors exist.
pub(crate) fn merge_all() {
    for m in lock().iter_mut() {
        merge(m);
    }
}

fn merge(m: &mut Mirror) {
    for (i, seen) in m.seen.iter_mut().enumerate() {
        let (h, d) = ((m.host + i) as *mut u8, (m.dev + i) as *mut u8);
        // SAFETY: both ranges stay valid while the mirror exists (the registration's
        // contract, and the allocation freed only by `forget`); volatile, as the GPU and
        // the program's threads write them concurrently.
        unsafe {
            let (hv, dv) = (std::ptr::read_volatile(h), std::ptr::read_volatile(d));
            if dv != *seen {
                // The GPU wrote it: the program sees the write.
                std::ptr::write_volatile(h, dv);
                *seen = dv;
            } else if hv != *seen {
                std::ptr::write_volatile(d, hv);
                *seen = hv;
            }
        }
    }
}

/// Ends the mirror of the registered piece at `host` (its unregistration): a last merge,
/// then the shared allocation to free, if there was a mirror.
pub(crate) fn forget(host: usize) -> Option<usize> {
    let mut all = lock();
    let i = all.iter().position(|m| m.host == host)?;
    let mut m = all.swap_remove(i);
    COUNT.store(all.len(), Ordering::Relaxed);
    merge(&mut m);
    Some(m.alloc)
}
