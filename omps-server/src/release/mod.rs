//! Giving back what clients released, without a worker ever waiting for the GPU.
//!
//! Owns the releaser thread of each GPU ([`releaser`]), dead clients' host memory that is
//! unregistered when the GPU is quiet ([`unpin`]), segments registered ahead of clients
//! ([`segpool`]), and the fences that hold a peer-access client's frees until its work on
//! every GPU is done ([`peer_fence`], its types in [`cross`]). What a release gives back
//! ([`given`]) is plain data that sessions make, workers fence and the releaser frees.
//!
//! May use `gpu/`, `client/` (whom a release is charged back to) and `base/`.

pub mod cross;
pub mod given;
pub mod peer_fence;
pub mod releaser;
pub mod segpool;
pub mod unpin;
