//! The omps server: one CUDA context per GPU, shared by every client.
//!
//! * [`control`]: the socket, the handshake, omps-ctl requests, client death.
//! * [`listen`]: the listening sockets, the pipe directory's lock, the files a server owns.
//! * [`log_file`]: log files opened without following symlinks or waiting on FIFOs.
//! * [`restart`]: a server process from start to end, and its restart by exec after a fault.
//! * [`worker`]: one thread per GPU that runs every client's commands for that GPU.
//! * [`segpool`]: client segments made and registered ahead of connections.
//! * [`session`]: one client's state on one GPU; decoding and validation of its commands.
//! * [`ipc`]: memory one client exports and others open.
//! * [`limits`]: context limits, per client.
//! * [`account`]: what one client process is charged for over its connections.
//! * [`module_cache`]: one loaded module for every client that loads the same image.
//! * [`compile`]: module loads, JIT compiles and links off the workers, so a slow one
//!   holds up only its own client; [`verifier`] loads new images first in a child process.
//! * [`confine`]: SM confinements (green contexts): thread limits, partitions, the QoS reserve.
//! * [`placement`]: which work stream (and hardware queue) carries a client stream.
//! * [`policy`]: each client's QoS and the defaults, as operators set them.
//! * [`stdio`]: the server's own stderr, apart from the driver's fd 2.
//! * [`stats`]: the workers' counters of their own time (`omps-ctl stats`).
//! * [`releaser`]: one thread per GPU that gives back what clients released.
//! * [`unpin`]: dead clients' host memory, unregistered when the GPU is quiet.
//! * [`peer_fence`]: frees of a client with peer access wait for its work on every GPU.
//! * [`printf`]: device printf output, routed to the client that printed.
//! * [`gpu`]: the interface to the GPU; [`gpu_cuda`] (the driver) and [`gpu_host`] (host
//!   memory, for tests without a GPU, playing a GPU generation of [`gpu_profile`]) implement
//!   it; [`gpu_green`] holds the driver's green contexts.
//! * [`features`]: what a GPU lacks of the features omps uses from newer GPUs.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod account;
pub mod bounds;
pub mod client;
pub mod compile;
pub mod confine;
pub mod control;
pub mod features;
pub mod fuzz_sequences;
pub mod gpu;
pub mod gpu_arrays;
pub mod gpu_cuda;
pub mod gpu_green;
pub mod gpu_host;
pub mod gpu_host_vmm;
pub mod gpu_profile;
pub mod ipc;
pub mod limits;
pub mod listen;
pub mod log_file;
pub mod memlimit;
pub mod metrics;
pub mod module_cache;
pub mod namespace;
pub mod nvml;
pub mod peer_fence;
pub mod peers;
pub mod placement;
pub mod policy;
pub mod printf;
pub mod releaser;
pub mod restart;
pub mod segpool;
pub mod session;
pub mod stats;
pub mod stdio;
pub mod testing;
pub mod unpin;
pub mod verifier;
pub mod visible;
pub mod worker;

pub use control::{Server, ServerConfig};
