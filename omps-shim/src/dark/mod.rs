//! cuGetExportTable: the private tables the CUDA runtime and tools ask the driver for.
//!
//! Owns: the tables themselves (tables.rs: the runtime's, the hooks, context checks and
//! integrity; tools.rs: the tools' tables) and their shape (table.rs).
//! May use: `crate::state` (contexts, streams, context-local storage), `crate::integrity`,
//! `crate::cuda`. Not `crate::api`: an entry the runtime reaches through a table calls
//! the same state the families do.

pub mod table;
pub mod tables;
pub mod tools;

pub use tables::{cuGetExportTable, CONTEXT_LOCAL_STORAGE};
