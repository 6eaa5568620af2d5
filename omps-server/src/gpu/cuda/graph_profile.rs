//! [`CudaGpu`]'s profiling twins (docs/design.md 12b, design G): a copy of a client's
//! graph with an event-record node before and after each kernel, memset and memcpy node,
//! so that a traced replay times each; each launch points the record nodes at the
//! client's own events first. Only a client that traces ever has one.

use super::device::{ck, CudaGpu};
use super::{graphs, streams};
use crate::gpu::{code, CuError, GpuResult, ProfileTwin, TimedNode, TimedWork};
use cudarc::driver::sys as cu;

/// CU_GRAPH_NODE_TYPE_KERNEL, _MEMCPY, _MEMSET and _GRAPH (a child graph).
const KERNEL: u32 = 0;
const MEMCPY: u32 = 1;
const MEMSET: u32 = 2;
const CHILD_GRAPH: u32 = 4;
/// Node types a copy cannot stand in for, in the graph or a child graph of it: memory
/// allocation and free (the copy would allocate its own), conditional (the graph's
/// kernels set the original's handles).
const NOT_COPIED: [u32; 3] = [10, 11, 13];

pub(super) fn graph_profile_twin(gpu: &CudaGpu, graph: u64, flags: u64) -> GpuResult<ProfileTwin> {
    copyable(gpu, graph)?;
    let copy = graphs::graph_clone(gpu, graph)?;
    let placeholder = match streams::event_create(gpu, 0) {
        Ok(e) => e,
        Err(e) => {
            let _ = graphs::graph_destroy(gpu, copy);
            return Err(e);
        }
    };
    let built = instrument(gpu, copy, placeholder).and_then(|nodes| {
        let exec = graphs::graph_instantiate(gpu, copy, flags)?;
        Ok((exec, nodes))
    });
    match built {
        Ok((exec, nodes)) => Ok(ProfileTwin {
            exec,
            graph: copy,
            placeholder,
            nodes,
        }),
        Err(e) => {
            let _ = graphs::graph_destroy(gpu, copy);
            let _ = streams::event_destroy(gpu, placeholder);
            Err(e)
        }
    }
}

/// Adds the record nodes around each kernel node of `g` (a copy the caller owns).
fn instrument(gpu: &CudaGpu, g: u64, placeholder: u64) -> GpuResult<Vec<TimedNode>> {
    let graph = g as cu::CUgraph;
    let event = placeholder as cu::CUevent;
    let mut out = Vec::new();
    let nodes = graphs::graph_nodes(gpu, g)?;
    let types = (nodes.iter())
        .map(|&n| graphs::graph_node_type(gpu, n))
        .collect::<GpuResult<Vec<u32>>>()?;
    for (&node, &ty) in nodes.iter().zip(&types) {
        let n = node as cu::CUgraphNode;
        let work = match ty {
            KERNEL => kernel_work(n)?,
            MEMSET => {
                // SAFETY: a memset node of the copy; a zeroed block for the driver to fill.
                let p = unsafe {
                    let mut p: cu::CUDA_MEMSET_NODE_PARAMS = std::mem::zeroed();
                    ck(cu::cuGraphMemsetNodeGetParams(n, &mut p))?;
                    p
                };
                let row = (p.width as u64).saturating_mul(p.elementSize as u64);
                TimedWork::Memset {
                    value: p.value,
                    bytes: row.saturating_mul(p.height.max(1) as u64),
                }
            }
            MEMCPY => {
                let p = graphs::memcpy_node_params(n)?;
                let bytes = (p.WidthInBytes as u64)
                    .saturating_mul(p.Height.max(1) as u64)
                    .saturating_mul(p.Depth.max(1) as u64);
                TimedWork::Memcpy {
                    src: p.srcMemoryType as u8,
                    dst: p.dstMemoryType as u8,
                    bytes,
                }
            }
            _ => continue,
        };
        let (deps, programmatic) = dependencies(n)?;
        let mut start = std::ptr::null_mut();
        // SAFETY: nodes of the copy; `deps` holds deps.len() of them.
        ck(unsafe {
            cu::cuGraphAddEventRecordNode(&mut start, graph, deps.as_ptr(), deps.len(), event)
        })?;
        // A node that may start before a dependency ends (a programmatic edge, as cuBLAS's
        // kernels on Hopper capture) is not held back by its start record: the record then
        // marks when its dependencies ended, a little after the kernel may have begun.
        if !programmatic {
            // SAFETY: two nodes of the copy; null edge data is the default edge.
            ck(unsafe { cu::cuGraphAddDependencies_v2(graph, &start, &n, std::ptr::null(), 1) })?;
        }
        let mut end = std::ptr::null_mut();
        // SAFETY: the timed node of the copy as the one dependency.
        ck(unsafe { cu::cuGraphAddEventRecordNode(&mut end, graph, &n, 1, event) })?;
        if programmatic {
            // The kernel may end before its start record runs (it began early): the end
            // record then waits for the start one, so that the span is never negative.
            // SAFETY: two record nodes of the copy; null edge data is the default edge.
            ck(unsafe { cu::cuGraphAddDependencies_v2(graph, &start, &end, std::ptr::null(), 1) })?;
        }
        out.push(TimedNode {
            start: start as u64,
            end: end as u64,
            work,
        });
    }
    Ok(out)
}

/// A kernel node's function (its library kernel's, where it names one), shape and
/// dynamic shared memory.
fn kernel_work(n: cu::CUgraphNode) -> GpuResult<TimedWork> {
    // SAFETY: all-zero is a valid CUDA_KERNEL_NODE_PARAMS (pointers null, sizes 0).
    let mut p: cu::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: a kernel node of the copy; a valid out-pointer.
    ck(unsafe { cu::cuGraphKernelNodeGetParams_v2(n, &mut p) })?;
    let mut func = p.func;
    if func.is_null() && !p.kern.is_null() {
        // SAFETY: the node's library kernel; a valid out-pointer.
        ck(unsafe { cu::cuKernelGetFunction(&mut func, p.kern) })?;
    }
    Ok(TimedWork::Kernel {
        func: func as u64,
        grid: [p.gridDimX, p.gridDimY, p.gridDimZ],
        block: [p.blockDimX, p.blockDimY, p.blockDimZ],
        shared: p.sharedMemBytes,
    })
}

/// Whether a copy of `graph` can stand in for it: no node of a kind in NOT_COPIED, in it
/// or in its child graphs, and no edge but default and programmatic ones.
fn copyable(gpu: &CudaGpu, graph: u64) -> GpuResult<()> {
    gpu.bind();
    for node in graphs::graph_nodes(gpu, graph)? {
        let ty = graphs::graph_node_type(gpu, node)?;
        if NOT_COPIED.contains(&ty) {
            return Err(CuError(code::NOT_SUPPORTED));
        }
        let n = node as cu::CUgraphNode;
        dependencies(n)?;
        if ty == CHILD_GRAPH {
            let mut child = std::ptr::null_mut();
            // SAFETY: a child-graph node; the graph stays its node's.
            ck(unsafe { cu::cuGraphChildGraphNodeGetGraph(n, &mut child) })?;
            copyable(gpu, child as u64)?;
        }
    }
    Ok(())
}

/// The nodes `n` depends on, and whether any edge from them is programmatic (the kernel
/// may start before that dependency ends); NOT_SUPPORTED for an edge of another type or
/// into a port of `n` (none is defined).
fn dependencies(n: cu::CUgraphNode) -> GpuResult<(Vec<cu::CUgraphNode>, bool)> {
    let mut count = 0usize;
    // SAFETY: a node of a graph the caller holds; null arrays ask for the count.
    ck(unsafe {
        cu::cuGraphNodeGetDependencies_v2(n, std::ptr::null_mut(), std::ptr::null_mut(), &mut count)
    })?;
    let mut deps = vec![std::ptr::null_mut(); count];
    if count > 0 {
        // SAFETY: all-zero edge data is the default edge, a valid value.
        let zero: cu::CUgraphEdgeData = unsafe { std::mem::zeroed() };
        let mut edges = vec![zero; count];
        // SAFETY: room for `count` nodes and as many edges.
        ck(unsafe {
            cu::cuGraphNodeGetDependencies_v2(n, deps.as_mut_ptr(), edges.as_mut_ptr(), &mut count)
        })?;
        deps.truncate(count);
        let edges = &edges[..count];
        // CU_GRAPH_DEPENDENCY_TYPE_DEFAULT (0) and _PROGRAMMATIC (1); ports out of a kernel
        // node are CU_GRAPH_KERNEL_NODE_PORT_DEFAULT, _PROGRAMMATIC and _LAUNCH_ORDER.
        let known = |e: &cu::CUgraphEdgeData| e.to_port == 0 && e.type_ <= 1 && e.from_port <= 2;
        if !edges.iter().all(known) {
            return Err(CuError(code::NOT_SUPPORTED));
        }
        let programmatic = edges.iter().any(|e| e.type_ != 0 || e.from_port != 0);
        return Ok((deps, programmatic));
    }
    Ok((deps, false))
}

pub(super) fn graph_exec_set_event(
    gpu: &CudaGpu,
    exec: u64,
    node: u64,
    event: u64,
) -> GpuResult<()> {
    gpu.bind();
    // SAFETY: a twin's executable graph and one of its record nodes (the session checks
    // both against the twin), and one of the client's events.
    ck(unsafe {
        cu::cuGraphExecEventRecordNodeSetEvent(
            exec as cu::CUgraphExec,
            node as cu::CUgraphNode,
            event as cu::CUevent,
        )
    })
}

pub(super) fn graph_profile_twin_destroy(gpu: &CudaGpu, twin: &ProfileTwin) {
    let _ = graphs::graph_exec_destroy(gpu, twin.exec);
    let _ = graphs::graph_destroy(gpu, twin.graph);
    let _ = streams::event_destroy(gpu, twin.placeholder);
}
