//! The per-family parts of a client's [`Session`](crate::session::Session) state, each
//! in its own file: plain data and its own books, using nothing of the session, so that
//! state.rs holds them and the family files (impl Session blocks) use state.rs, never the
//! reverse.

pub mod arrays;
pub mod compile;
pub mod cond;
pub mod depth;
pub mod graph_held;
pub mod green;
pub mod launch_run;
pub mod pool_share;
pub mod quick_free;
pub mod span_timer;
pub mod vmm;
