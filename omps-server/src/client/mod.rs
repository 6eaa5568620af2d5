//! What the server knows of a connected client, shared by the control thread and every
//! GPU worker.
//!
//! Owns a client's shared state ([`ClientShared`]: its segment, memory use, allocations as
//! peer copies see them, pinned host memory, which of its staging the GPU reaches), its
//! identity ([`identity`]), what it is charged for over all its connections ([`account`])
//! and may hold ([`bounds`]), its device memory limits ([`memlimit`]) and context limits
//! ([`limits`]), the GPUs it sees ([`visible`]), the memory it exports to other clients
//! ([`ipc`]), and the routing of its kernels' printf output ([`printf`]).
//!
//! May use `gpu/`, `sched/`, `base/` and the peer-fence queues of `release/`; never the
//! workers, sessions or the control thread.

pub mod account;
pub mod answer;
pub mod bounds;
pub mod identity;
pub mod ipc;
pub mod limits;
pub mod memlimit;
pub mod printf;
mod shared;
pub mod visible;

pub use account::NO_LIMIT;
pub use identity::{container_of, one_word, Identity};
pub use shared::*;
