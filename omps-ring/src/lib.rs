//! The transport between an omps client (the shim) and the omps server.
//!
//! * [`shm`]: the anonymous memfd segment and its mapping.
//! * [`ring`]: a single-producer single-consumer ring of variable-length records that
//!   lives in that segment and is addressed through offsets only.
//! * [`futex`]: doorbells that cost no system call while the other side is awake.
//! * [`segment`]: where everything sits inside a client's segment.
//! * [`wire`]: the plain-old-data records that travel through the ring and the socket.
//! * [`sock`]: where the server's socket lives, and messages that carry descriptors.
//! * [`clock`]: the clock both sides time a profiler's records in.
//! * [`cupti_layout`]: CUPTI's activity kinds and record layouts, which both sides use.
//! * [`image`]: code images (fatbins, cubins, PTX) as the driver would read them; the shim
//!   looks into them for printf, the server for data a shared module would share.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

#[cfg(not(loom))]
pub mod clock;
#[cfg(not(loom))]
pub mod cupti_layout;
#[cfg(not(loom))]
pub mod futex;
#[cfg(not(loom))]
pub mod image;
#[cfg(not(loom))]
pub mod memlimit;
pub mod ring;
#[cfg(not(loom))]
pub mod segment;
#[cfg(not(loom))]
pub mod shm;
#[cfg(not(loom))]
pub mod sock;
pub mod sync;
#[cfg(not(loom))]
pub mod wire;
