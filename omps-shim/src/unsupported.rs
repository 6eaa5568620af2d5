//! Entry points omps does not implement yet. Each returns CUDA_ERROR_NOT_SUPPORTED and
//! says so once per process, so a program that needs one fails loudly, never silently.

use crate::cuda::{CUresult, CUDA_ERROR_NOT_SUPPORTED};
use std::collections::HashSet;
use std::sync::Mutex;

static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Prints `text` on stderr the first time this process says something under `key`
/// (every time under OMPS_TRACE).
pub(crate) fn say_once(key: &str, text: impl FnOnce() -> String) {
    let first = {
        let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        seen.get_or_insert_with(HashSet::new)
            .insert(key.to_string())
    };
    if first || crate::trace_enabled() {
        eprintln!("{}", text());
    }
}

pub(crate) fn unsupported(name: &'static str) -> CUresult {
    say_once(name, || {
        format!("omps: {name} is not supported yet; returning CUDA_ERROR_NOT_SUPPORTED")
    });
    CUDA_ERROR_NOT_SUPPORTED
}

// The stubs take no arguments: under the C calling convention the caller owns its
// arguments, so ignoring them is sound whatever the real signature is.
include!(concat!(env!("OUT_DIR"), "/unsupported.rs"));

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The names between `before` and the next `after` in `text`.
    fn names(text: &str, before: &str, after: char) -> BTreeSet<String> {
        text.split(before)
            .skip(1)
            .filter_map(|s| s.split(after).next())
            .filter(|n| {
                n.starts_with("cu") && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn every_unsupported_entry_point_is_listed_with_its_reason() {
        let stubs = names(
            include_str!(concat!(env!("OUT_DIR"), "/unsupported.rs")),
            "unsupported(\"",
            '"',
        );
        let lists: String = include_str!("../../docs/entry-points.md")
            .lines()
            .filter(|l| l.starts_with("- "))
            .collect();
        let doc = names(&lists, "`", '`');
        let missing: Vec<_> = stubs.difference(&doc).collect();
        let stale: Vec<_> = doc.difference(&stubs).collect();
        assert!(
            missing.is_empty() && stale.is_empty(),
            "docs/entry-points.md is out of date (run scripts/entry-points.py): \
             not listed {missing:?}, listed but implemented {stale:?}"
        );
        assert!(stubs.len() > 100, "the stubs were read: {}", stubs.len());
    }
}
