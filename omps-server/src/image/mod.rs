//! Module images: checked in a process of their own before the server's context loads
//! them ([`verifier`]), and loaded once for every client that loads the same image
//! ([`module_cache`]); loads, JIT compiles and links run on compile threads, off the
//! lanes, so a slow one holds up only its own client ([`compile`]).
//!
//! May use `gpu/` (the interface it loads through) and `base/`.

pub mod compile;
pub mod module_cache;
pub mod verifier;
