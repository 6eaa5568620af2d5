//! Edges of graphs built by hand, node lists and queries, node removal, clones.

use super::registry::{clone_graph, drop_child, graph_ref, is_built, locate, node_handle, with};
use crate::cuda::*;
use crate::handles::{leak, GraphHandle, GraphNode, GRAPH_MAGIC};
use crate::state::capture::CUgraph;
use crate::state::entry::{entry, out};

/// Adds (or removes) the edges `from[k] -> to[k]`.
///
/// # Safety
/// `from` and `to` hold `n` node handles each.
unsafe fn edges(
    g: CUgraph,
    from: *const *mut GraphNode,
    to: *const *mut GraphNode,
    n: usize,
    add: bool,
) -> Result<(), CUresult> {
    graph_ref(g)?;
    if !is_built(g) {
        return Err(crate::unsupported::unsupported(
            "editing the edges of a captured graph",
        ));
    }
    // One node may start (or end) several edges; each (from, to) pair once.
    // SAFETY: forwarded contract.
    let (f, t) = unsafe { (dep_indices_loose(g, from, n)?, dep_indices_loose(g, to, n)?) };
    with(|r| {
        let b = r
            .graphs
            .get_mut(&(g as usize))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        // All or nothing: the edges are checked on a copy.
        let mut nodes = b.nodes.clone();
        for (&a, &z) in f.iter().zip(&t) {
            let node = nodes[z].as_mut().ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let has = node.deps.contains(&a);
            match (add, has) {
                (true, false) if a != z => node.deps.push(a),
                (false, true) => node.deps.retain(|&d| d != a),
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
        }
        b.nodes = nodes;
        Ok(())
    })
}

/// The v1 and v2 (edge data, default only) forms of adding or removing edges.
macro_rules! edge_calls {
    ($($v1:ident, $v2:ident, $add:expr;)*) => {$(
        /// # Safety
        /// `from` and `to` hold `n` node handles each.
        #[no_mangle]
        pub unsafe extern "C" fn $v1(
            g: CUgraph,
            from: *const *mut GraphNode,
            to: *const *mut GraphNode,
            n: usize,
        ) -> CUresult {
            // SAFETY: forwarded contract.
            entry(|| unsafe { edges(g, from, to, n, $add) })
        }

        /// # Safety
        /// As the v1 form; `data` is null or holds `n` edge data.
        #[no_mangle]
        pub unsafe extern "C" fn $v2(
            g: CUgraph,
            from: *const *mut GraphNode,
            to: *const *mut GraphNode,
            data: *const u64,
            n: usize,
        ) -> CUresult {
            // SAFETY: forwarded contract.
            entry(|| unsafe {
                default_edges(data, n)?;
                edges(g, from, to, n, $add)
            })
        }
    )*};
}

edge_calls! {
    cuGraphAddDependencies, cuGraphAddDependencies_v2, true;
    cuGraphRemoveDependencies, cuGraphRemoveDependencies_v2, false;
}

/// As [`dep_indices`], but one node may appear more than once (several edges into it).
///
/// # Safety
/// `nodes` holds `n` node handles.
unsafe fn dep_indices_loose(
    g: CUgraph,
    nodes: *const *mut GraphNode,
    n: usize,
) -> Result<Vec<usize>, CUresult> {
    (0..n)
        .map(|k| {
            // SAFETY: per the contract, n readable handles.
            let d = unsafe { *nodes.add(k) };
            match locate(d) {
                Some((gr, i)) if gr == g as usize => Ok(i),
                _ => Err(CUDA_ERROR_INVALID_VALUE),
            }
        })
        .collect()
}

/// Edge data other than the default (all zero) is not supported.
///
/// # Safety
/// `data` is null or holds `n` CUgraphEdgeData (8 bytes each).
pub(super) unsafe fn default_edges(data: *const u64, n: usize) -> Result<(), CUresult> {
    if data.is_null() {
        return Ok(());
    }
    for k in 0..n {
        // SAFETY: per the contract.
        if unsafe { *data.add(k) } != 0 {
            return Err(crate::unsupported::unsupported(
                "graph edges with edge data",
            ));
        }
    }
    Ok(())
}

/// Writes a node list the CUDA way: a null array asks for the count; otherwise up to
/// `*num` handles, the rest null, and `*num` becomes how many there are (at most `*num`).
///
/// # Safety
/// `num` is readable and writable; `list` null or room for `*num` handles.
pub(crate) unsafe fn write_nodes(
    list: *mut *mut GraphNode,
    num: *mut usize,
    v: &[*mut GraphNode],
) -> Result<(), CUresult> {
    if num.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if list.is_null() {
        // SAFETY: checked non-null.
        return unsafe { out(num, v.len()) };
    }
    // SAFETY: the caller's room for *num handles.
    unsafe {
        let room = num.read();
        for k in 0..room {
            list.add(k)
                .write(v.get(k).copied().unwrap_or(std::ptr::null_mut()));
        }
        num.write(room.min(v.len()));
    }
    Ok(())
}

/// The nodes `node` depends on (`dependents` false) or that depend on it.
fn neighbours(node: *mut GraphNode, dependents: bool) -> Result<Vec<*mut GraphNode>, CUresult> {
    let (g, i) = locate(node).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    with(|r| {
        let b = r.graphs.get(&g).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let dev = b.dev;
        let idx: Vec<usize> = if dependents {
            b.live()
                .filter(|(_, n)| n.deps.contains(&i))
                .map(|(k, _)| k)
                .collect()
        } else {
            b.nodes
                .get(i)
                .and_then(|n| n.as_ref())
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?
                .deps
                .clone()
        };
        Ok(idx.into_iter().map(|k| node_handle(r, g, k, dev)).collect())
    })
}

/// # Safety
/// As cuGraphNodeGetDependencies.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetDependencies(
    node: *mut GraphNode,
    deps: *mut *mut GraphNode,
    num: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { write_nodes(deps, num, &neighbours(node, false)?) })
}

/// # Safety
/// As cuGraphNodeGetDependentNodes.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetDependentNodes(
    node: *mut GraphNode,
    deps: *mut *mut GraphNode,
    num: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { write_nodes(deps, num, &neighbours(node, true)?) })
}

/// Writes default (all-zero) edge data for `n` edges where the caller asked for it.
///
/// # Safety
/// `data` is null or has room for `n` CUgraphEdgeData (8 bytes each).
unsafe fn zero_edges(data: *mut u64, n: usize) {
    if !data.is_null() {
        // SAFETY: per the contract.
        unsafe { std::ptr::write_bytes(data, 0, n) };
    }
}

/// As [`neighbours`] into the caller's list, with default edge data.
///
/// # Safety
/// As cuGraphNodeGetDependencies_v2.
unsafe fn neighbours_v2(
    node: *mut GraphNode,
    dependents: bool,
    list: *mut *mut GraphNode,
    data: *mut u64,
    num: *mut usize,
) -> Result<(), CUresult> {
    let v = neighbours(node, dependents)?;
    // SAFETY: forwarded contract.
    unsafe {
        write_nodes(list, num, &v)?;
        if !list.is_null() {
            zero_edges(data, num.read());
        }
    }
    Ok(())
}

/// # Safety
/// As cuGraphNodeGetDependencies_v2.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetDependencies_v2(
    node: *mut GraphNode,
    deps: *mut *mut GraphNode,
    data: *mut u64,
    num: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { neighbours_v2(node, false, deps, data, num) })
}

/// # Safety
/// As cuGraphNodeGetDependentNodes_v2.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetDependentNodes_v2(
    node: *mut GraphNode,
    deps: *mut *mut GraphNode,
    data: *mut u64,
    num: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { neighbours_v2(node, true, deps, data, num) })
}

/// A node's counterpart in a clone: the clone keeps every node's index.
///
/// # Safety
/// `ph` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeFindInClone(
    ph: *mut *mut GraphNode,
    original: *mut GraphNode,
    clone: CUgraph,
) -> CUresult {
    entry(|| {
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (_, i) = locate(original).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let h = with(|r| {
            let b = r
                .graphs
                .get(&(clone as usize))
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let dev = b.dev;
            b.nodes
                .get(i)
                .and_then(|n| n.as_ref())
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            Ok::<_, CUresult>(node_handle(r, clone as usize, i, dev))
        })?;
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(ph, h) }
    })
}

/// The nodes of built graph `g` that wait for none.
///
/// # Safety
/// As cuGraphGetRootNodes.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetRootNodes(
    g: CUgraph,
    roots: *mut *mut GraphNode,
    num: *mut usize,
) -> CUresult {
    entry(|| {
        graph_ref(g)?;
        let v = with(|r| {
            let b = r.graphs.get(&(g as usize))?;
            let (dev, idx): (usize, Vec<usize>) = (
                b.dev,
                b.live()
                    .filter(|(_, n)| n.deps.is_empty())
                    .map(|(i, _)| i)
                    .collect(),
            );
            Some(
                idx.into_iter()
                    .map(|i| node_handle(r, g as usize, i, dev))
                    .collect::<Vec<_>>(),
            )
        });
        let Some(v) = v else {
            return Err(crate::unsupported::unsupported(
                "cuGraphGetRootNodes of a captured graph",
            ));
        };
        // SAFETY: forwarded contract.
        unsafe { write_nodes(roots, num, &v) }
    })
}

#[no_mangle]
pub extern "C" fn cuGraphDestroyNode(node: *mut GraphNode) -> CUresult {
    entry(|| {
        let (g, i) = locate(node).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        with(|r| {
            let b = r.graphs.get_mut(&g).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            let gone = b
                .nodes
                .get_mut(i)
                .and_then(|n| n.take())
                .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            for n in b.nodes.iter_mut().flatten() {
                n.deps.retain(|&d| d != i);
            }
            r.nodes.remove(&(node as usize));
            r.handles.remove(&(g, i));
            // A child node's graph, and a conditional node's bodies, go with it.
            for c in gone.kind.owned() {
                drop_child(r, c);
            }
            Ok(())
        })
    })
}

/// # Safety
/// `ph` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphClone(ph: *mut CUgraph, original: CUgraph) -> CUresult {
    entry(|| {
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let gr = graph_ref(original)?;
        let h = if is_built(original) {
            let h = leak(GraphHandle::new(GRAPH_MAGIC, 0, gr.dev));
            if !clone_graph(original as usize, h as usize) {
                return Err(CUDA_ERROR_INVALID_HANDLE);
            }
            h
        } else {
            // The server copies a graph it captured; the copy holds its graph memory too.
            let (_, h) = super::server_graph::copy_of(gr)?;
            crate::api::graph_mem::share(original as usize, h as usize);
            h
        };
        crate::api::user_object::share(original as usize, h as usize);
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out(ph, h) }
    })
}
