//! What a client's session holds for a profiler's graph replays (graph_profile.rs):
//! the graphs its executable graphs came from, the twins made of them and the events
//! that order a twin's launches after the original's. Below the session's families, so
//! that the session's state can hold it.

use crate::gpu::ProfileTwin;
use crate::release::given::Release;
use std::collections::HashMap;

pub(super) struct Twin {
    pub(super) twin: ProfileTwin,
    /// Each timed node's function as the client knows it (0: not one of its own).
    pub(super) funcs: Vec<u32>,
}

#[derive(Default)]
pub(crate) struct GraphProfiles {
    /// Executable graph -> the graph it was made from and its instantiation flags.
    pub(super) sources: HashMap<u32, (u32, u64)>,
    /// Graphs the client destroyed while executable graphs made from them live.
    pub(super) kept: HashMap<u32, u64>,
    /// Executable graph -> its twin (None: it cannot be made; asked again after a change).
    pub(super) twins: HashMap<u32, Option<Twin>>,
    /// Executable graph -> the event recorded after its last launch or its twin's, and
    /// whether that launch was the twin's.
    pub(super) order: HashMap<u32, (u64, bool)>,
}

impl GraphProfiles {
    /// Driver graphs and executable graphs a profiler's twins hold (a graph and an
    /// executable graph each): counted against OMPS_MAX_GRAPHS. Kept graphs are not: a
    /// client that never profiles keeps every graph it instantiated and destroyed
    /// (PyTorch's way) and must not meet its limit at half its graphs; each is kept for an
    /// executable graph that counts, so they are at most as many as those.
    pub(crate) fn held(&self) -> usize {
        2 * self.twins.values().filter(|t| t.is_some()).count()
    }

    /// Everything held, for the release when the client goes.
    pub(crate) fn drain_into(&mut self, rel: &mut Release) {
        rel.graphs.extend(self.kept.drain().map(|(_, g)| g));
        for t in self.twins.drain().filter_map(|(_, t)| t) {
            twin_into(t.twin, rel);
        }
        rel.events.extend(self.order.drain().map(|(_, (e, _))| e));
        self.sources.clear();
    }
}

pub(super) fn twin_into(twin: ProfileTwin, rel: &mut Release) {
    rel.execs.push(twin.exec);
    rel.graphs.push(twin.graph);
    if twin.placeholder != 0 {
        rel.events.push(twin.placeholder);
    }
}
