//! The server's graphs that nodes of graphs built here own, and the GraphCond call that
//! makes and changes them: a leaf below the node kinds (mod.rs), conditional nodes
//! (cond.rs), server children (server_child.rs) and emission (emit.rs), which all use it.

use crate::cuda::*;
use crate::handles::{leak, GraphHandle, GRAPH_MAGIC};
use crate::state::capture::CUgraph;
use omps_ring::wire::{self, graph as wg, GraphCond, Op};

/// A GraphCond call on device `dev`: its answer.
pub(crate) fn cond_call(
    dev: usize,
    kind: u32,
    fill: impl FnOnce(&mut GraphCond),
) -> Result<u64, CUresult> {
    let c = crate::state::entry::live()?;
    let mut ch = c.channel();
    ch.call(dev, Op::GraphCond, |call| {
        let mut g = GraphCond {
            call,
            kind,
            ..Default::default()
        };
        fill(&mut g);
        bytemuck::bytes_of(&g).to_vec()
    })?;
    Ok(ch.reply::<wire::U64Reply>().value)
}

/// A server graph a child node owns, with the handle cuGraphChildGraphNodeGetGraph gives
/// out; destroyed with the last node (or copy of a node) that holds it.
pub(crate) struct ServerGraph {
    pub(super) dev: usize,
    pub(super) id: u32,
    pub(super) handle: usize,
}

impl Drop for ServerGraph {
    fn drop(&mut self) {
        // SAFETY: a handle made in `copy_of`, never freed (handles stay readable).
        let h = unsafe { &*(self.handle as *const GraphHandle) };
        let _ = crate::handles::retire(&h.magic, GRAPH_MAGIC);
        // What the copy held (its staged copies' buffers) goes with it.
        crate::api::user_object::graph_gone(self.handle);
        let rec = wire::Handle {
            id: self.id,
            _pad: 0,
        };
        let _ = crate::state::entry::live().and_then(|c| {
            c.push(
                self.dev,
                wire::Op::GraphDestroy,
                &[bytemuck::bytes_of(&rec)],
            )
        });
    }
}

/// The server's copy of graph `g` (one the server captured), under a handle of its own.
pub(crate) fn copy_of(g: &GraphHandle) -> Result<(u32, CUgraph), CUresult> {
    let id = cond_call(g.dev, wg::GRAPH_CLONE, |c| c.graph = g.id())? as u32;
    Ok((id, leak(GraphHandle::new(GRAPH_MAGIC, id, g.dev))))
}
