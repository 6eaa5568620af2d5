//! [`CudaGpu`]'s launch runs: consecutive plain launches of one client stream queued as
//! one graph launch (issue 25: past one context's launch ceiling).
//!
//! One context takes about 300k `cuLaunchKernel` a second from one thread and 815k from
//! eight (H100, `scripts/probe/launch_batching.cu`), while MPS's clients, each in a
//! context of its own, reached 989k together. A graph of K chained kernel nodes, made and
//! instantiated once and launched with `cuGraphLaunch`, ran 4.6M kernels a second from
//! eight threads with every node's parameters set anew before each launch (0.16 us a
//! node): the lanes keep such a graph per work stream and length, and set each node to
//! the run's launch before launching it. Chained nodes run one after another, in order
//! and after the stream's earlier work, as the launches would have; a node set to a new
//! function, grid or parameters is a launch of those (the parameter buffer is copied when
//! set). Instantiated without CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY, a graph runs
//! at the priority of the stream it is launched into, its class's, as the stream's own
//! launches do. Before any module is unloaded every kept graph is destroyed (a node may
//! still name one of its functions).
//!
//! **Off unless `OMPS_LAUNCH_RUNS=1`** (issue 25, 2026-11-27): measured on an H100 (the
//! rate measure, gpu-e2e, the QoS measure), but the PyTorch suite has not yet run with it
//! (docs/design.md).
//!
//! A graph is used on its one work stream only, by one lane at a time (the map's lock is
//! held while it is set and launched): its launches follow each other on that stream, as
//! the stream's launches do, and never order one stream behind another. Streams of green
//! contexts are left out (their launches go one by one). A context reset forgets the
//! graphs with everything else of the context.

use super::device::{ck, CudaGpu};
use super::launch::{LAUNCH_PARAM_BUFFER_POINTER, LAUNCH_PARAM_BUFFER_SIZE};
use super::run_graphs::{destroy, RunGraph, SHARDS};
use crate::gpu::{code, CuError, GpuResult, PlainLaunch, RUN_LENGTHS};
use cudarc::driver::sys as cu;
use std::ffi::c_void;

/// Node parameters for launch `l`; `size` and `extra` must outlive their use.
fn params(
    l: &PlainLaunch<'_>,
    extra: &mut [*mut c_void; 5],
    size: &mut usize,
) -> cu::CUDA_KERNEL_NODE_PARAMS {
    *size = l.args.len();
    *extra = [
        LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
        l.args.as_ptr() as *mut c_void,
        LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
        size as *mut usize as *mut c_void,
        std::ptr::null_mut(),
    ];
    cu::CUDA_KERNEL_NODE_PARAMS {
        func: l.func as cu::CUfunction,
        gridDimX: l.grid[0],
        gridDimY: l.grid[1],
        gridDimZ: l.grid[2],
        blockDimX: l.block[0],
        blockDimY: l.block[1],
        blockDimZ: l.block[2],
        sharedMemBytes: l.shared,
        kernelParams: std::ptr::null_mut(),
        extra: if l.args.is_empty() {
            std::ptr::null_mut()
        } else {
            extra.as_mut_ptr()
        },
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

/// A graph of `run.len()` chained kernel nodes set to `run`, instantiated.
fn make(run: &[PlainLaunch<'_>]) -> GpuResult<RunGraph> {
    let mut graph = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the context is current (the caller bound it).
    ck(unsafe { cu::cuGraphCreate(&mut graph, 0) })?;
    let mut g = RunGraph {
        graph,
        exec: std::ptr::null_mut(),
        nodes: Vec::with_capacity(run.len()),
    };
    let built = (|| {
        for l in run {
            let (mut extra, mut size) = ([std::ptr::null_mut(); 5], 0usize);
            let p = params(l, &mut extra, &mut size);
            let mut node = std::ptr::null_mut();
            let dep = g.nodes.last().copied();
            // SAFETY: `graph` is ours; `p` and what it points at live through the call;
            // the dependency, when there is one, is this graph's previous node.
            ck(unsafe {
                cu::cuGraphAddKernelNode_v2(
                    &mut node,
                    g.graph,
                    dep.as_ref().map_or(std::ptr::null(), |d| d as *const _),
                    usize::from(dep.is_some()),
                    &p,
                )
            })?;
            g.nodes.push(node);
        }
        let mut exec = std::ptr::null_mut();
        // SAFETY: `graph` is complete; a valid out-pointer.
        ck(unsafe { cu::cuGraphInstantiateWithFlags(&mut exec, g.graph, 0) })?;
        g.exec = exec;
        Ok(())
    })();
    match built {
        Ok(()) => Ok(g),
        Err(e) => {
            destroy(g);
            Err(e)
        }
    }
}

/// Whether the server gathers launch runs: `OMPS_LAUNCH_RUNS=1` (read once).
pub(super) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("OMPS_LAUNCH_RUNS").is_ok_and(|v| v == "1"))
}

/// Whether launches on work stream `s` are gathered: runs on, and not a green context's
/// stream (its launches go one by one).
pub(super) fn takes_runs(gpu: &CudaGpu, s: usize) -> bool {
    enabled() && s < gpu.layout.base()
}

/// Queues `run` on work stream `s` as one launch of a kept graph. Err: nothing of it was
/// queued (the caller launches one by one).
pub(super) fn launch_run(gpu: &CudaGpu, s: usize, run: &[PlainLaunch<'_>]) -> GpuResult<()> {
    if !takes_runs(gpu, s) || !RUN_LENGTHS.contains(&run.len()) {
        return Err(CuError(code::NOT_SUPPORTED));
    }
    gpu.bind();
    let st = gpu.stream(s)?;
    let mut shard = gpu.runs.shards[s % SHARDS]
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let key = (s, run.len());
    if let Some(g) = shard.get(&key) {
        for (l, &node) in run.iter().zip(&g.nodes) {
            let (mut extra, mut size) = ([std::ptr::null_mut(); 5], 0usize);
            let p = params(l, &mut extra, &mut size);
            // SAFETY: the node is of this exec's graph; `p` and its pointers live through
            // the call, which copies the parameter buffer.
            ck(unsafe { cu::cuGraphExecKernelNodeSetParams_v2(g.exec, node, &p) })?;
        }
    } else {
        shard.insert(key, make(run)?);
    }
    let g = shard.get(&key).expect("present");
    // SAFETY: a work stream of this context and an exec of ours, launched under the lock.
    ck(unsafe { cu::cuGraphLaunch(g.exec, st) })
}
