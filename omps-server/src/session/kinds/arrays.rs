//! A client's CUDA arrays, mipmapped arrays, textures and surfaces as its [`Session`]
//! holds them ([`ArrayState`]): below the session (state.rs holds one) and the family
//! that serves them (arrays.rs), so that neither the session nor its state depends on
//! that family.
//!
//! [`Session`]: crate::session::Session

use crate::release::given::ArrayRelease;
use std::collections::HashMap;

/// Bounds a client's tables, so it cannot make the server's grow without end.
pub(in crate::session) const MAX_OBJECTS: usize = 1 << 16;

/// A mipmapped array's levels asked for: (level, array id).
pub(in crate::session) type Levels = Vec<(u32, u32)>;

#[derive(Default)]
pub struct ArrayState {
    /// Array id -> (driver handle, bytes charged, whether a mipmapped array's level).
    pub(in crate::session) arrays: HashMap<u32, (u64, u64, bool)>,
    /// Mipmapped array id -> (driver handle, bytes charged, (level, array id) of the
    /// levels asked for).
    pub(in crate::session) mipmaps: HashMap<u32, (u64, u64, Levels)>,
    pub(in crate::session) textures: std::collections::HashSet<u64>,
    pub(in crate::session) surfaces: std::collections::HashSet<u64>,
    pub(in crate::session) next_id: u32,
    /// Arrays (the driver's handles) a capture copied to or from: a graph's memcpy node
    /// may name them, so they outlive their destruction while the client holds graphs
    /// (graph_memory.rs, HeldForGraphs::Array).
    pub(in crate::session) captured: std::collections::HashSet<u64>,
}

impl ArrayState {
    /// Whether it holds all it may (`held`: arrays its graphs hold past their destruction).
    pub(in crate::session) fn full(&self, held: usize) -> bool {
        self.arrays.len() + self.mipmaps.len() + self.textures.len() + self.surfaces.len() + held
            >= MAX_OBJECTS
            || self.next_id == u32::MAX
    }

    /// A fresh id; ids are never reused while the session lives (a client that made
    /// 2^32 objects gets no more: `full`).
    pub(in crate::session) fn new_id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    pub(in crate::session) fn add_array(&mut self, handle: u64, bytes: u64, level: bool) -> u32 {
        let id = self.new_id();
        self.arrays.insert(id, (handle, bytes, level));
        id
    }

    pub fn into_release(self) -> ArrayRelease {
        ArrayRelease {
            textures: self.textures.into_iter().collect(),
            surfaces: self.surfaces.into_iter().collect(),
            // A level goes with its mipmapped array.
            arrays: self
                .arrays
                .into_values()
                .filter(|&(_, _, level)| !level)
                .map(|(h, n, _)| (h, n))
                .collect(),
            mipmaps: self.mipmaps.into_values().map(|(h, n, _)| (h, n)).collect(),
        }
    }
}
