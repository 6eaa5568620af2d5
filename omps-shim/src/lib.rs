//! libomps_shim.so: stands in for libcuda.so.1 in a client process.
//!
//! The real driver is never loaded here: device queries are answered from the server's
//! snapshot, contexts are bookkeeping, and everything that touches the GPU becomes a record
//! in this process's command ring to the omps server (see docs/design.md).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![allow(non_snake_case)]

pub mod api;
pub mod bypass;
pub mod conn;
pub mod cuda;
pub mod cupti;
pub mod dark;
pub mod handles;
pub mod hostfn;
pub mod state;
pub use omps_ring::image;
pub mod integrity;
pub mod pcopy;
pub mod preload;
pub mod printf;
pub mod quota;
pub mod settings;
pub mod stats;
pub mod unsupported;

/// OMPS_TRACE=1 makes the shim name the entry points and tables a program asks for.
pub fn trace_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("OMPS_TRACE").is_some_and(|v| v != "0"))
}
