//! A [`Gpu`](crate::gpu::Gpu) made of host memory, for tests on machines without a GPU
//! (device.rs says what it plays and how).
//!
//! Owns the host GPU's state ([`state`]), its making, test switches and shared helpers
//! ([`setup`]), its device calls ([`device`], whose `impl Gpu` forwards to the families
//! [`memory`], [`vmm`], [`modules`], [`launch`], [`streams`], [`graphs`], [`arrays`] and
//! [`context`]), graph recording
//! and replay ([`ops`], [`replay`]), the hardware queues and driver depth it plays on
//! request ([`queue_model`], [`queues`]), the virtual memory the host GPUs of one machine
//! share ([`machine_vmm`]) and the GPU generation it plays ([`profile`]).
//!
//! May use the GPU interface (`gpu/`), `sched/` and `image/` (a module image's data);
//! nothing of the server above.

mod arrays;
mod context;
mod device;
mod graphs;
mod launch;
pub mod machine_vmm;
mod memory;
mod modules;
mod ops;
pub mod profile;
mod queue_model;
mod queues;
mod replay;
mod setup;
mod state;
mod streams;
mod timer;
mod vmm;

pub use profile::HostProfile;
pub use setup::{PARSER_CRASH, SLOW_LOAD, VMM_GRANULE};
pub use state::HostGpu;
