//! The bottom layer: what every other folder may use and that uses nothing of the server.
//!
//! Owns the server's own stderr and its log files, and the small helpers (GPU UUIDs as
//! text) that more than one concern prints. Uses only std and the tracing crates.

pub mod ids;
pub mod log_file;
pub mod stdio;
