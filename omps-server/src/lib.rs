//! The omps server: one CUDA context per GPU, shared by every client.
//!
//! One folder per concern, from the bottom up (a folder uses those above it in this
//! list, never one below):
//! * [`base`]: the server's own stderr, log files, small shared helpers.
//! * [`sched`]: the layout of a GPU's work streams and SM confinements.
//! * [`gpu`]: the interface to the GPU; [`gpu::cuda`] (the driver) and [`gpu::host`] (host
//!   memory, for tests without a GPU, playing a GPU generation of [`gpu::host::profile`])
//!   implement it; what a GPU lacks ([`gpu::features`]), NVML.
//! * [`image`]: module images, verified in a process of their own and loaded once for all.
//! * [`client`]: what the server knows of a connected client: its identity, limits,
//!   accounting, visible GPUs, IPC exports, printf routing.
//! * [`release`]: the releaser, unpinning, segment pool, peer fences.
//! * [`worker`]: one thread per GPU lane that runs every client's commands for that GPU;
//!   operators' scheduling policy; the workers' own counters.
//! * [`session`]: one client's state on one GPU; decoding and validation of its commands.
//! * [`control`]: the socket, the handshake, omps-ctl requests, client death, namespaces,
//!   metrics, the listening sockets, the server's start, end and restart.
//! * [`testing`], [`fuzz_sequences`]: clients without a process, for tests and fuzzing.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod base;
pub mod client;
pub mod control;
pub mod fuzz_sequences;
pub mod gpu;
pub mod image;
pub mod release;
pub mod sched;
pub mod session;
pub mod testing;
pub mod worker;

pub use control::{Server, ServerConfig};

// The paths other crates, targets and tests have used since before the folders.
pub use base::log_file;
pub use control::listen;
pub use control::restart;
pub use gpu::cuda as gpu_cuda;
pub use gpu::host as gpu_host;
pub use image::verifier;
