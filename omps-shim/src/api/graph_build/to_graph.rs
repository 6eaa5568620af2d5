//! Capturing into graphs the client holds (cuStreamBeginCaptureToGraph, and moving a
//! capture past a conditional node added to it): here beside the built graphs it reads,
//! so that capture.rs, which this calls, never calls back into graph_build.

use super::cond::{added_on, is_captured_body};
use super::registry::is_built;
use super::server_child::{add_captured, check_deps};
use crate::api::capture::{begin_to, begun, capture_call};
use crate::cuda::*;
use crate::handles::{GraphHandle, GRAPH_MAGIC};
use crate::state::capture::CUgraph;
use crate::state::capture::{IntoBuilt, MODE_RELAXED};
use crate::state::entry::entry;
use crate::state::streams::CUstream;
use crate::state::streams::{per_thread, stream_dev};
use omps_ring::wire::Op;
use std::ffi::c_uint;

/// Capturing into an existing graph: the bodies of a conditional node added to a capture
/// (how the CUDA guide and PyTorch fill them), with no dependencies; or a graph built by
/// hand, which receives what was captured as one child-graph node after `deps` (the
/// capture is an ordinary one on the server, and its graph the node's). Graphs the server
/// captured are not captured into.
fn begin_to_graph(
    s: CUstream,
    g: CUgraph,
    deps: *const *mut crate::handles::GraphNode,
    n: usize,
    mode: c_uint,
) -> Result<(), CUresult> {
    if mode > MODE_RELAXED || (n > 0 && deps.is_null()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passed a graph handle, as the API requires.
    let h = unsafe { crate::handles::resolve(g as *const GraphHandle, GRAPH_MAGIC) }?;
    if is_built(g) {
        // SAFETY: forwarded contract: n node handles.
        let deps = unsafe { check_deps(g, deps, n) }?;
        let (_, dev) = stream_dev(s)?;
        if dev != h.dev {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        capture_call(Op::CaptureBegin, s, mode)?;
        let into = IntoBuilt {
            graph: g as usize,
            deps,
            add: add_captured,
        };
        return begun(s, None, mode, Some(into));
    }
    if !is_captured_body(g) {
        return Err(crate::unsupported::unsupported(
            "cuStreamBeginCaptureToGraph into a graph other than a conditional node's body",
        ));
    }
    if n > 0 {
        return Err(crate::unsupported::unsupported(
            "cuStreamBeginCaptureToGraph with dependencies",
        ));
    }
    begin_to(s, h.id(), Some(g), mode)
}

/// # Safety
/// `deps` is null or holds `n` node handles.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph(
    s: CUstream,
    g: CUgraph,
    deps: *const *mut crate::handles::GraphNode,
    _data: *const u8,
    n: usize,
    mode: c_uint,
) -> CUresult {
    entry(|| begin_to_graph(s, g, deps, n, mode))
}

/// # Safety
/// As [`cuStreamBeginCaptureToGraph`].
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph_ptsz(
    s: CUstream,
    g: CUgraph,
    deps: *const *mut crate::handles::GraphNode,
    data: *const u8,
    n: usize,
    mode: c_uint,
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamBeginCaptureToGraph(s, g, deps, data, n, mode) })
}

/// What omps takes of cuStreamUpdateCaptureDependencies: moving a capture past the
/// conditional node just added to it, which the server already did when it added the
/// node (graph_build/cond.rs). The capture's other nodes are the server's and have no
/// handles here.
fn update_dependencies(
    s: CUstream,
    deps: *const *mut crate::handles::GraphNode,
    n: usize,
    flags: c_uint,
) -> Result<(), CUresult> {
    const SET: c_uint = 1;
    if flags > SET || (n > 0 && deps.is_null()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (stream, dev) = stream_dev(s)?;
    // SAFETY: n > 0 and non-null: the caller's array of n handles.
    let first = (n == 1).then(|| unsafe { *deps });
    match first {
        Some(node) if flags == SET && added_on(node, dev, stream) => Ok(()),
        _ => Err(crate::unsupported::unsupported(
            "cuStreamUpdateCaptureDependencies beyond moving a capture past a conditional node added to it",
        )),
    }
}

/// # Safety
/// `deps` is null or holds `n` node handles.
#[no_mangle]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies(
    s: CUstream,
    deps: *const *mut crate::handles::GraphNode,
    n: usize,
    flags: c_uint,
) -> CUresult {
    entry(|| update_dependencies(s, deps, n, flags))
}

/// # Safety
/// As [`cuStreamUpdateCaptureDependencies`]; `data` (edge data) is null or default.
#[no_mangle]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies_v2(
    s: CUstream,
    deps: *const *mut crate::handles::GraphNode,
    _data: *const u8,
    n: usize,
    flags: c_uint,
) -> CUresult {
    entry(|| update_dependencies(s, deps, n, flags))
}

/// # Safety
/// As [`cuStreamUpdateCaptureDependencies`].
#[no_mangle]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies_ptsz(
    s: CUstream,
    deps: *const *mut crate::handles::GraphNode,
    n: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamUpdateCaptureDependencies(s, deps, n, flags) })
}

/// # Safety
/// As [`cuStreamUpdateCaptureDependencies_v2`].
#[no_mangle]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies_v2_ptsz(
    s: CUstream,
    deps: *const *mut crate::handles::GraphNode,
    data: *const u8,
    n: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: forwarded contract.
    per_thread(|| unsafe { cuStreamUpdateCaptureDependencies_v2(s, deps, data, n, flags) })
}
