//! The built graphs executable graphs were instantiated from, as the executable-graph
//! updates see them: node edits applied to a copy of the source, nodes enabled or
//! disabled, and the lookups from an executable graph's node handles into its source.

use super::registry::{with, Registry};
use super::types::{Built, Kind, Node};
use crate::cuda::*;
use crate::handles::GraphNode;

/// A copy of the graph executable graph `e` was made from with `edit` applied to its
/// node `node` (a node of the graph `e` was instantiated from): the changed source to
/// instantiate, which the caller stores once instantiated. Ok(None) when `e` was not made
/// from a built graph.
pub(super) fn edit_exec_source(
    e: usize,
    node: *mut GraphNode,
    edit: impl FnOnce(&mut Node) -> Result<(), CUresult>,
) -> Result<Option<(Built, u64)>, CUresult> {
    with(|r| {
        let Some((b, flags)) = r.sources.get(&e) else {
            return Ok(None);
        };
        if let Some((copy, i)) = source_inner_node(r, e, node) {
            // A node inside a child graph or a conditional body: the executable graph's
            // own copy of that graph changes in place.
            let (b, flags) = (b.clone(), *flags);
            let n = r
                .graphs
                .get_mut(&copy)
                .and_then(|g| g.nodes.get_mut(i))
                .and_then(|n| n.as_mut())
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            edit(n)?;
            return Ok(Some((b, flags)));
        }
        let i = source_index(r, e, node).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut b = b.clone();
        edit(
            b.nodes
                .get_mut(i)
                .and_then(|n| n.as_mut())
                .ok_or(CUDA_ERROR_INVALID_VALUE)?,
        )?;
        Ok(Some((b, *flags)))
    })
}

impl Kind {
    /// Kernel, memset and memcpy nodes can be disabled in an executable graph, as natively.
    fn can_disable(&self) -> bool {
        matches!(self, Kind::Kernel(_) | Kind::Memset(_) | Kind::Memcpy(_))
    }
}

/// Node `node` enabled or not in executable graph `e` (see [`edit_exec_source`]).
pub(crate) fn set_exec_enabled(
    e: usize,
    node: *mut GraphNode,
    enabled: bool,
) -> Result<Option<(Built, u64)>, CUresult> {
    edit_exec_source(e, node, |n| {
        if !n.kind.can_disable() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        n.disabled = !enabled;
        Ok(())
    })
}

/// Whether node `node` is enabled in executable graph `e`.
pub(crate) fn exec_enabled(e: usize, node: *mut GraphNode) -> Result<bool, CUresult> {
    with(|r| {
        let (b, _) = r.sources.get(&e).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let i = source_index(r, e, node).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        match b.nodes.get(i).and_then(|n| n.as_ref()) {
            Some(n) if n.kind.can_disable() => Ok(!n.disabled),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    })
}

/// Where node `node` of the graph executable graph `e` was instantiated from sits in the
/// graph `e` is made from now: its rank among the live nodes (an update may have made it
/// from a graph whose destroyed nodes left holes elsewhere; the topology is the same).
fn source_index(r: &Registry, e: usize, node: *mut GraphNode) -> Option<usize> {
    let &(g, i) = r.nodes.get(&(node as usize))?;
    if r.origins.get(&e) != Some(&g) {
        return None;
    }
    let rank = r.graphs.get(&g)?.live().position(|(j, _)| j == i)?;
    r.sources.get(&e)?.0.live().nth(rank).map(|(j, _)| j)
}

/// Node `node` lies in a graph owned (as a child or a conditional body) by a node of the
/// graph executable graph `e` was instantiated from, or deeper: the executable graph's
/// copy of that graph and the node's index in it.
fn source_inner_node(r: &Registry, e: usize, node: *mut GraphNode) -> Option<(usize, usize)> {
    let &(g, i) = r.nodes.get(&(node as usize))?;
    let &origin = r.origins.get(&e)?;
    if g == origin {
        return None;
    }
    let path = owner_path(r, origin, g, 0)?;
    let (&(top, k), rest) = path.split_first()?;
    // The top step by rank, as source_index; copies below keep their graphs' indices.
    let rank = r.graphs.get(&origin)?.live().position(|(j, _)| j == top)?;
    let (_, n) = r.sources.get(&e)?.0.live().nth(rank)?;
    let mut copy = *n.kind.owned().get(k)?;
    for &(j, k) in rest {
        let n = r.graphs.get(&copy)?.nodes.get(j)?.as_ref()?;
        copy = *n.kind.owned().get(k)?;
    }
    Some((copy, i))
}

/// The steps from graph `from` down to graph `to` through the graphs nodes own: each
/// step a node's index and the owned graph's position among its graphs.
fn owner_path(r: &Registry, from: usize, to: usize, depth: usize) -> Option<Vec<(usize, usize)>> {
    if to == from {
        return Some(Vec::new());
    }
    // Nesting deeper than any program builds is a cycle of lies; stop.
    if depth > 64 {
        return None;
    }
    let (parent, j, k) = r.graphs.iter().find_map(|(&pg, b)| {
        b.live().find_map(|(j, n)| {
            let k = n.kind.owned().iter().position(|&c| c == to)?;
            Some((pg, j, k))
        })
    })?;
    let mut path = owner_path(r, from, parent, depth + 1)?;
    path.push((j, k));
    Some(path)
}

/// Whether executable graph `e` (made from `from`) can take the parameters of `to`.
pub(crate) fn same_topology(from: &Built, to: &Built) -> bool {
    from.topology() == to.topology()
}

/// The graph an executable graph was made from, and its flags, if it was built here.
pub(crate) fn source_of(e: usize) -> Option<(Built, u64)> {
    with(|r| r.sources.get(&e).cloned())
}

/// Node `node` given new parameters of its kind in executable graph `e` (a kernel keeps
/// its launch attributes; see [`edit_exec_source`]).
pub(crate) fn set_exec_node(
    e: usize,
    node: *mut GraphNode,
    kind: Kind,
) -> Result<Option<(Built, u64)>, CUresult> {
    edit_exec_source(e, node, |n| {
        if n.kind.type_code() != kind.type_code() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        n.kind = kind.keeping(&n.kind);
        Ok(())
    })
}
