//! The vocabulary of scheduling: where a client stream's work runs.
//!
//! Owns the layout of a GPU's work streams in priority classes and the binding of client
//! streams to them ([`placement`]), and SM confinements ([`confine`]). Below the GPU
//! interface (whose streams these lay out), so it uses nothing of the server but `base/`.

pub mod confine;
pub mod placement;
