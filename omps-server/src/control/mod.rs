//! The control side of the server: everything that is not a client's work on a GPU.
//!
//! Owns the control thread ([`Server`]: the socket, handshakes, omps-ctl's and
//! nvidia-cuda-mps-control's commands, client death), connections not handed on yet
//! ([`peers`]), MPS v3 namespaces ([`namespace`]), the metrics ([`metrics`]), the
//! control log, the listening sockets and the pipe directory's files ([`listen`]), and a
//! server process from start to end with its restart ([`restart`]).
//!
//! May use every other folder: it starts the workers (`worker/`) and releasers, hands
//! clients (`client/`) to them, and reads the GPUs (`gpu/`). Nothing below uses it.

mod control_log;
mod lane_queue;
pub mod listen;
pub mod metrics;
pub mod namespace;
pub mod peers;
pub mod restart;
mod server;

pub use crate::base::ids::uuid_text;
pub use server::*;
