//! The graphs [`CudaGpu`](super::device::CudaGpu) keeps for launch runs, by work stream
//! and run length: plain data below device.rs, which holds them, and batch.rs, which makes,
//! sets and launches them.

use cudarc::driver::sys as cu;
use std::collections::HashMap;
use std::sync::Mutex;

/// Shards of the graph map: lanes launching on different streams rarely meet.
pub(super) const SHARDS: usize = 64;

pub(super) struct RunGraph {
    pub(super) graph: cu::CUgraph,
    pub(super) exec: cu::CUgraphExec,
    pub(super) nodes: Vec<cu::CUgraphNode>,
}

/// The graphs kept, by (work stream, run length).
pub(super) struct RunGraphs {
    pub(super) shards: Vec<Mutex<HashMap<(usize, usize), RunGraph>>>,
}

// SAFETY: the graph handles are driver objects of the GPU's context, used only under
// their shard's lock, from threads that made the context current (CudaGpu::bind).
unsafe impl Send for RunGraphs {}
// SAFETY: as above.
unsafe impl Sync for RunGraphs {}

impl Default for RunGraphs {
    fn default() -> Self {
        RunGraphs {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

impl RunGraphs {
    /// Forgets every graph: the context they lived in is gone (a reset).
    pub(super) fn forget(&self) {
        for s in &self.shards {
            s.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    /// Destroys every graph, before a module is unloaded: a kept node may still name one
    /// of its functions, and what the driver does with a function of an unloaded module
    /// in a graph is not defined. An executable graph still running is freed when it ends
    /// (cuGraphExecDestroy). The context must be current on this thread.
    pub(super) fn destroy_all(&self) {
        for s in &self.shards {
            let mut shard = s.lock().unwrap_or_else(|e| e.into_inner());
            for (_, g) in shard.drain() {
                destroy(g);
            }
        }
    }
}

/// Destroys a kept graph and its executable graph.
pub(super) fn destroy(g: RunGraph) {
    // SAFETY: handles of ours, each destroyed once (null ones skipped).
    unsafe {
        if !g.exec.is_null() {
            cu::cuGraphExecDestroy(g.exec);
        }
        cu::cuGraphDestroy(g.graph);
    }
}
