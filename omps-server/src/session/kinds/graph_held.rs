//! What a client's graphs keep from going ([`HeldForGraphs`], [`HeldAtLast`]): below the
//! session (state.rs holds them) and the families that hold them (graph_memory.rs,
//! vmm.rs, arrays.rs).

use crate::release::given::PinnedRelease;

/// What a client's graphs keep from going: a module (its handle, whether the module
/// cache shares it, the bytes charged for its variables) or the last opening of an IPC
/// handle (its address and length).
///
/// A module stays while the client holds any graph or executable graph, not only one
/// whose memset or memcpy nodes use its globals: a kernel node names its function, which
/// the server does not read back (a library's kernels are named by CUkernel, not by the
/// function the client was given), and a replay or an instantiation after the unload
/// would have the driver follow a function of a module gone, in the context every client
/// shares. The cost is memory: a module unloaded while graphs live stays loaded, charged
/// to the client, until its last graph goes.
pub(in crate::session) enum HeldForGraphs {
    Module(u64, bool, u64),
    IpcClose(u64, u64),
    /// A VMM reservation (start, size) the client gave back while a graph uses a range in
    /// it: the driver keeps the addresses reserved, so no other client's reservation can
    /// take them while a replay may still write there.
    Reservation(u64, u64),
    /// Page-locked memory the client unregistered while a graph copies to or from it: it
    /// stays mapped and registered here, so nothing else of the server's (another
    /// client's segment, say) is mapped at its addresses while a replay may copy there.
    Pinned(PinnedRelease),
    /// A CUDA array (handle, bytes charged, whether a mipmapped array) destroyed after a
    /// capture copied to or from it: a memcpy node names it, and its handle, reused for
    /// another client's array, would have a replay copy there. Held, charged and counted
    /// among its arrays, while the client holds any graph (as a module).
    Array(u64, u64, bool),
}

/// What a departing client's graphs held, for its last release.
#[derive(Default)]
pub(in crate::session) struct HeldAtLast {
    pub modules: Vec<(u64, bool, u64)>,
    pub closes: Vec<u64>,
    pub reservations: Vec<(u64, u64)>,
    pub pinned: Vec<PinnedRelease>,
    pub arrays: Vec<(u64, u64)>,
    pub mipmaps: Vec<(u64, u64)>,
}
