//! A graph the server captured, as a child node of a graph built here: the node owns a
//! copy the server made when the node was (as the driver copies a child graph), and at
//! instantiation the server adds it as a child-graph node where the capture stands. A
//! capture into a graph built here (cuStreamBeginCaptureToGraph) ends in such a node too,
//! owning the graph the capture made.

use super::registry::{add, dep_indices, server_graph};
use super::server_graph::{cond_call, ServerGraph};
use crate::cuda::*;
use crate::handles::{GraphHandle, GraphNode};
use crate::state::capture::CUgraph;
use crate::state::streams::CUstream;
use omps_ring::wire::graph as wg;

/// Issues child node `c` where stream `s`'s capture stands.
pub(super) fn issue_server_child(c: &ServerGraph, s: CUstream) -> Result<(), CUresult> {
    let (stream, dev) = crate::state::streams::stream_dev(s)?;
    // The capture's graph replays the child: it holds what the child holds.
    let capture = crate::api::staged::capturing(s)?;
    if let Some(g) = capture.and_then(crate::state::capture::capture_graph) {
        crate::api::user_object::share(c.handle, g);
    }
    cond_call(dev, wg::CHILD_NODE, |g| {
        g.stream = stream;
        g.graph = c.id;
    })
    .map(drop)
}

/// The node handles of a dependency list of built graph `g`, checked.
///
/// # Safety
/// `deps` is null or holds `n` node handles.
pub(crate) unsafe fn check_deps(
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
) -> Result<Vec<usize>, CUresult> {
    // SAFETY: forwarded contract.
    unsafe { dep_indices(g, deps, n) }?;
    // SAFETY: as above; n readable handles.
    Ok((0..n).map(|k| unsafe { *deps.add(k) } as usize).collect())
}

/// What a capture into built graph `g` captured (server graph `id`, named by `handle`)
/// becomes a child-graph node of `g` after nodes `deps`, which owns that graph.
pub(crate) fn add_captured(
    g: CUgraph,
    deps: &[usize],
    dev: usize,
    id: u32,
    handle: *mut GraphHandle,
) -> Result<(), CUresult> {
    let kind = server_graph(dev, id, handle as usize);
    let deps: Vec<*mut GraphNode> = deps.iter().map(|&d| d as *mut GraphNode).collect();
    let mut node = std::ptr::null_mut();
    // SAFETY: a valid out-pointer and `deps.len()` handles; a refused node drops its
    // kind, and with it the server graph.
    unsafe { add(&mut node, g, deps.as_ptr(), deps.len(), kind) }
}
