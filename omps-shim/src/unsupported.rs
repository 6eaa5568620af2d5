//! Entry points omps does not implement yet. Each returns CUDA_ERROR_NOT_SUPPORTED and
//! says so once per process, so a program that needs one fails loudly, never silently.

use crate::cuda::{CUresult, CUDA_ERROR_NOT_SUPPORTED};
use std::collections::HashSet;
use std::sync::Mutex;

static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);

pub(crate) fn unsupported(name: &'static str) -> CUresult {
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if seen.get_or_insert_with(HashSet::new).insert(name) || crate::trace_enabled() {
        eprintln!("omps: {name} is not supported yet; returning CUDA_ERROR_NOT_SUPPORTED");
    }
    CUDA_ERROR_NOT_SUPPORTED
}

// The stubs take no arguments: under the C calling convention the caller owns its
// arguments, so ignoring them is sound whatever the real signature is.
include!(concat!(env!("OUT_DIR"), "/unsupported.rs"));
