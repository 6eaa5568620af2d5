//! OMPS_CUPTI_DEBUG: with it set, the CUPTI layer says on stderr what it did and why a
//! record was not made. A profiler that shows nothing is otherwise silent about it.

pub(crate) fn debug(what: impl FnOnce() -> String) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("OMPS_CUPTI_DEBUG").is_some()) {
        eprintln!("omps cupti: {}", what());
    }
}
