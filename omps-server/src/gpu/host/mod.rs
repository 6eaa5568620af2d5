//! A [`Gpu`](crate::gpu::Gpu) made of host memory, for tests on machines without a GPU
//! (device.rs says what it plays and how).
//!
//! Owns the host GPU's state ([`state`]), its device calls ([`device`]), graph recording
//! and replay ([`ops`], [`replay`]), the hardware queues and driver depth it plays on
//! request ([`queue_model`], [`queues`]), the virtual memory the host GPUs of one machine
//! share ([`machine_vmm`]) and the GPU generation it plays ([`profile`]).
//!
//! May use the GPU interface (`gpu/`), `sched/` and `image/` (a module image's data);
//! nothing of the server above.

mod device;
pub mod machine_vmm;
mod ops;
pub mod profile;
mod queue_model;
mod queues;
mod replay;
mod state;

pub use device::*;
pub use profile::HostProfile;
pub use state::HostGpu;
