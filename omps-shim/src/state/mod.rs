//! The client process's state, below the API families: how an entry point runs and
//! reaches the server (entry), the devices (device), contexts (ctx) and their local
//! storage (cls), stream, event and function handles and their synchronizations
//! (streams, green), capture bookkeeping (capture), device memory ranges (ranges),
//! loaded modules (modules), cached driver answers (answers), launch configurations
//! (launch), the mirrors of registered host memory (host_mirror), page-locked and managed
//! host ranges (host_ranges), plain device blocks and imported allocations (blocks), the
//! copy paths the memory families share (copies), and the seam through which they report
//! their work and waits to a profiler (profile).
//!
//! Owns: everything more than one API family reads or changes.
//! May use: `crate::conn` (the ring to the server), `crate::handles`, `crate::cuda`,
//! `crate::printf`, `crate::stats` and the ring crate. Never `crate::api` or
//! `crate::dark`: those sit above this layer and call down into it.

pub mod answers;
pub mod blocks;
pub mod capture;
pub mod cls;
pub mod copies;
pub mod ctx;
pub mod device;
pub mod entry;
pub mod green;
pub mod host_mirror;
pub mod host_ranges;
pub mod launch;
pub mod modules;
pub mod profile;
pub mod ranges;
pub mod streams;
