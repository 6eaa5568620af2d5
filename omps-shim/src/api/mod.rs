//! The API families: the exported driver entry points, one file or folder per family
//! (contexts, streams and launches, memory, graphs, ...). Each is a thin `extern "C"`
//! wrapper around a body run by `state::entry`.
//!
//! Owns: the entry points and the state only its own family reads.
//! May use: `crate::state` (the process's contexts, streams, ranges, capture state and
//! the helpers families share), `crate::conn`, `crate::handles`, `crate::cuda` and the
//! ring crate. Never another family: what two families need moves down into `state`.

pub mod array;
pub mod capture;
pub mod copy_any;
pub mod ctx;
pub mod ctx_params;
pub mod device;
pub mod exec;
pub mod graph;
pub mod graph_build;
pub mod graph_mem;
pub mod graph_update;
pub mod green;
pub mod green_res;
pub mod hostmem;
pub mod ipc;
pub mod kernel_launch;
pub mod link;
pub mod managed;
pub mod mem;
pub mod module;
pub mod peer;
pub mod pool;
pub mod pool_attr;
pub mod pool_share;
pub mod proc;
pub mod ptds;
pub mod query;
pub mod staged;
pub mod stream_info;
pub mod tensor_map;
pub mod tex_object;
pub mod user_object;
pub mod vmm;
pub mod vmm_share;
