//! The client process's state, below the API families: how an entry point runs and
//! reaches the server, the mirrors of registered host memory, and (as families' shared
//! pieces move down) contexts, streams, memory ranges, modules and capture state.
//!
//! Owns: everything more than one API family reads or changes.
//! May use: `crate::conn` (the ring to the server), `crate::handles`, `crate::cuda`,
//! `crate::printf`, `crate::hostfn` and the ring crate. Never `crate::api`: the families
//! sit above this layer and call down into it.

pub mod answers;
pub mod capture;
pub mod cls;
pub mod ctx;
pub mod device;
pub mod entry;
pub mod green;
pub mod host_mirror;
pub mod launch;
pub mod modules;
pub mod ranges;
pub mod streams;
