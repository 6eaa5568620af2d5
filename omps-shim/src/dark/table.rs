//! The shape of an export table (an array of function addresses, often after a size
//! header) and the note printed once for an entry omps does not implement.

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::Mutex;

#[repr(C)]
pub struct Table<const N: usize>(pub [*const c_void; N]);
// SAFETY: the tables are immutable arrays of function addresses and sizes.
unsafe impl<const N: usize> Sync for Table<N> {}

pub(crate) const fn size(slots: usize) -> *const c_void {
    (slots * 8) as *const c_void
}

pub(crate) fn note_unknown(what: &'static str) {
    static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    if SEEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(what)
    {
        eprintln!("omps: export table entry {what} called; not supported yet");
    }
}
