//! One client's state on one GPU, and the decoding, validation and execution of its
//! commands, one file per family of operations.
//!
//! Owns the [`Session`] of a client on a GPU ([`state`], above the per-family parts of its
//! state in `kinds/` and record.rs's checks) and the families of its commands:
//! memory, modules, launches, streams and events, graphs and captures, arrays, VMM,
//! IPC, pools, JIT links, green contexts, conditional nodes, stream depth.
//!
//! May use the worker lane's context (`worker/`), the client (`client/`), what a release
//! gives back (`release/`), the GPU (`gpu/`), `image/`, `sched/` and `base/`; never the
//! control thread.

mod arrays;
mod compile;
mod complete;
mod conditional;
mod depth;
mod dispatch;
mod exec;
mod graph_memory;
mod graph_profile;
mod graphs;
mod green;
mod ipc;
mod kinds;
mod leave;
mod link;
mod memory;
mod modules;
mod pool_share;
mod profiles;
mod record;
mod state;
mod streams;
mod sync;
mod timer;
mod vmm;

pub use crate::client::answer::answer_later;
pub use crate::release::given::{ArrayRelease, PinnedRelease, Release, VmmRelease};
pub use link::{jit_verdict, link_verdict};
pub use record::Malformed;
pub use state::*;
