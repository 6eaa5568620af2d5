//! The worker lanes of each GPU: threads that poll their clients' rings, run the records
//! on the GPU's work streams, wake clients whose completions the GPU wrote, and hand what
//! clients released to the releaser once the GPU is done with it.
//!
//! Owns a lane's context and loop ([`WorkerCtx`], [`run`]), the blocks it keeps for quick
//! frees ([`kept`]), what the lanes of one GPU share ([`GpuShared`]), operators' scheduling policy ([`policy`]) and the lanes'
//! counters of their own time ([`stats`]).
//!
//! May use `session/` (the lanes run sessions), `client/`, `release/`, `gpu/`, `image/`,
//! `sched/` and `base/`; never the control thread.

mod ctx;
mod free;
mod gpu_shared;
pub mod kept;
pub mod policy;
mod run;
pub mod stats;

pub use ctx::*;
pub use free::free_on;
pub use gpu_shared::*;
pub use run::run;
