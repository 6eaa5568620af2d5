//! The host GPU's graph family: stream capture (with conditional and child nodes),
//! graphs built, instantiated, launched, updated and inspected.

use super::ops::{cond_handles, HostOp};
use super::state::HostGpu;
use crate::gpu::{code, CuError, Gpu, GpuResult, ProfileTwin, TimedNode, TimedWork};
use std::sync::atomic::Ordering;

pub(super) fn capture_begin(gpu: &HostGpu, s: usize) -> GpuResult<()> {
    let mut st = gpu.state.lock().unwrap();
    st.check()?;
    if st.capturing.contains_key(&s) {
        return Err(CuError(code::ILLEGAL_STATE));
    }
    let id = st.next_handle;
    st.next_handle += 1;
    st.capturing.insert(s, (id, false, Vec::new()));
    Ok(())
}

pub(super) fn capture_end(gpu: &HostGpu, s: usize) -> GpuResult<u64> {
    let mut st = gpu.state.lock().unwrap();
    if let Some(&origin) = st.joined.get(&s) {
        // As the driver: ending the capture from a stream it forked into is refused
        // and invalidates the whole capture.
        if let Some(c) = st.capturing.get_mut(&origin) {
            c.1 = true;
        }
        return Err(CuError(code::STREAM_CAPTURE_UNMATCHED));
    }
    let (id, invalid, ops) = st
        .capturing
        .remove(&s)
        .ok_or(CuError(code::ILLEGAL_STATE))?;
    // The streams it forked into end with it.
    st.joined.retain(|_, o| *o != s);
    let into = st.capture_into.remove(&s);
    if invalid {
        // What it captured goes, conditional bodies made in it included.
        st.drop_bodies(&ops);
        return Err(CuError(code::STREAM_CAPTURE_INVALIDATED));
    }
    if let Some(g) = into {
        st.graphs.entry(g).or_default().extend(ops);
        return Ok(g);
    }
    // The graph is named by the capture's id (capture_graph gave it out).
    st.graphs.insert(id, ops);
    Ok(id)
}

pub(super) fn capture_status(gpu: &HostGpu, s: usize) -> GpuResult<(u32, u64)> {
    use omps_ring::wire::graph;
    let st = gpu.state.lock().unwrap();
    Ok(match st.capturing.get(&st.origin(s)) {
        None => (graph::STATUS_NONE, 0),
        Some(&(_, true, _)) => (graph::STATUS_INVALIDATED, 0),
        Some(&(id, false, _)) => (graph::STATUS_ACTIVE, id),
    })
}

pub(super) fn capture_graph(gpu: &HostGpu, s: usize) -> GpuResult<u64> {
    let st = gpu.state.lock().unwrap();
    let origin = st.origin(s);
    match st.capturing.get(&origin) {
        // A plain capture's graph is named by its capture id, which it ends in.
        Some(&(id, false, _)) => Ok(st.capture_into.get(&origin).copied().unwrap_or(id)),
        _ => Err(CuError(code::ILLEGAL_STATE)),
    }
}

pub(super) fn capture_invalidate(gpu: &HostGpu, s: usize) {
    let mut st = gpu.state.lock().unwrap();
    let o = st.origin(s);
    if let Some(c) = st.capturing.get_mut(&o) {
        c.1 = true;
    }
}

pub(super) fn graph_instantiate(gpu: &HostGpu, graph: u64, _flags: u64) -> GpuResult<u64> {
    let mut st = gpu.state.lock().unwrap();
    let ops = st.graphs.get(&graph).ok_or(CuError(code::INVALID_HANDLE))?;
    let ops = st.resolve(ops)?;
    // As the driver: conditional handles go into one executable graph only.
    let handles = cond_handles(&ops);
    if handles.iter().any(|h| st.cond_bound.contains(h)) {
        return Err(CuError(code::NOT_SUPPORTED));
    }
    st.cond_bound.extend(handles);
    let e = st.next_handle;
    st.next_handle += 1;
    st.execs.insert(e, ops);
    Ok(e)
}

pub(super) fn graph_launch(gpu: &HostGpu, exec: u64, s: usize) -> GpuResult<()> {
    let ops = {
        let mut st = gpu.state.lock().unwrap();
        let ops = st.execs.get(&exec).cloned();
        // A handle made to take its default value takes it at every launch.
        for (default, flags, now) in st.conds.values_mut() {
            if *flags & 1 != 0 {
                *now = *default;
            }
        }
        ops.ok_or(CuError(code::INVALID_HANDLE))?
    };
    gpu.run_ops(&ops, s)
}

pub(super) fn graph_upload(gpu: &HostGpu, exec: u64, _s: usize) -> GpuResult<()> {
    let st = gpu.state.lock().unwrap();
    st.execs
        .get(&exec)
        .map(drop)
        .ok_or(CuError(code::INVALID_HANDLE))
}

pub(super) fn graph_destroy(gpu: &HostGpu, graph: u64) -> GpuResult<()> {
    let mut st = gpu.state.lock().unwrap();
    let ops = st
        .graphs
        .remove(&graph)
        .ok_or(CuError(code::INVALID_HANDLE))?;
    st.drop_bodies(&ops);
    Ok(())
}

pub(super) fn graph_memory_ranges(gpu: &HostGpu, graph: u64) -> GpuResult<Vec<(u64, u64)>> {
    fn collect(ops: &[HostOp], out: &mut Vec<(u64, u64)>, bodies: bool) {
        for op in ops {
            match op {
                HostOp::Memset {
                    dst, elem, count, ..
                } => out.push((*dst, *elem as u64 * *count as u64)),
                HostOp::Dtod { dst, src, len } => {
                    out.push((*dst, *len as u64));
                    out.push((*src, *len as u64));
                }
                HostOp::Htod { dst, src, len } => {
                    out.push((*dst, *len as u64));
                    out.push((*src as u64, *len as u64));
                }
                HostOp::Dtoh { dst, src, len } => {
                    out.push((*src, *len as u64));
                    out.push((*dst as u64, *len as u64));
                }
                HostOp::Cond { run, .. } if bodies => {
                    run.iter().for_each(|r| collect(r, out, bodies))
                }
                _ => {}
            }
        }
    }
    if gpu.graph_reads_fail.load(Ordering::Relaxed) {
        return Err(CuError(code::NOT_SUPPORTED));
    }
    let st = gpu.state.lock().unwrap();
    let ops = st.graphs.get(&graph).ok_or(CuError(code::INVALID_HANDLE))?;
    let ops = st.resolve(ops)?;
    let mut out = Vec::new();
    collect(
        &ops,
        &mut out,
        !gpu.cond_bodies_hidden.load(Ordering::Relaxed),
    );
    Ok(out)
}

pub(super) fn graph_nodes(gpu: &HostGpu, graph: u64) -> GpuResult<Vec<u64>> {
    let st = gpu.state.lock().unwrap();
    let ops = st.graphs.get(&graph).ok_or(CuError(code::INVALID_HANDLE))?;
    // A node names its graph and its place in it.
    Ok((0..ops.len() as u64).map(|i| graph << 16 | i).collect())
}

pub(super) fn graph_node_type(gpu: &HostGpu, node: u64) -> GpuResult<u32> {
    let st = gpu.state.lock().unwrap();
    let op = st
        .graphs
        .get(&(node >> 16))
        .and_then(|ops| ops.get((node & 0xffff) as usize))
        .ok_or(CuError(code::INVALID_HANDLE))?;
    // CUgraphNodeType: kernel 0, memcpy 1, memset 2, batch memory operation 12.
    Ok(match op {
        HostOp::Launch { .. } => 0,
        HostOp::Dtod { .. } | HostOp::Htod { .. } | HostOp::Dtoh { .. } => 1,
        HostOp::Memset { .. } => 2,
        HostOp::Word { .. } | HostOp::WaitEq { .. } => 12,
        HostOp::Record { .. } => 7,
        HostOp::Cond { .. } => 13,
    })
}

pub(super) fn graph_create(gpu: &HostGpu) -> GpuResult<u64> {
    let mut st = gpu.state.lock().unwrap();
    let g = st.next_handle;
    st.next_handle += 1;
    st.graphs.insert(g, Vec::new());
    Ok(g)
}

pub(super) fn cond_handle(gpu: &HostGpu, graph: u64, value: u32, flags: u32) -> GpuResult<u64> {
    let mut st = gpu.state.lock().unwrap();
    let capturing = st.capturing.values().any(|c| c.0 == graph);
    if !(st.graphs.contains_key(&graph) || capturing) || flags > 1 {
        return Err(CuError(code::INVALID_VALUE));
    }
    let h = st.next_handle;
    st.next_handle += 1;
    st.conds.insert(h, (value, flags, value));
    Ok(h)
}

pub(super) fn capture_conditional(
    gpu: &HostGpu,
    s: usize,
    handle: u64,
    kind: u32,
    size: u32,
    graph_ok: &dyn Fn(u64) -> bool,
) -> GpuResult<Vec<u64>> {
    let mut st = gpu.state.lock().unwrap();
    let origin = st.origin(s);
    let capture = st.capturing.get(&origin).map_or(0, |c| c.0);
    if !graph_ok(st.capture_into.get(&origin).copied().unwrap_or(capture)) {
        return Err(CuError(code::INVALID_VALUE));
    }
    let valid = match kind {
        0 => matches!(size, 1 | 2),
        1 => size == 1,
        2 => size >= 1,
        _ => false,
    };
    if !valid || !st.conds.contains_key(&handle) {
        return Err(CuError(code::INVALID_VALUE));
    }
    if !matches!(st.capturing.get(&origin), Some((_, false, _))) {
        return Err(CuError(code::ILLEGAL_STATE));
    }
    let bodies: Vec<u64> = (0..size)
        .map(|_| {
            let g = st.next_handle;
            st.next_handle += 1;
            st.graphs.insert(g, Vec::new());
            g
        })
        .collect();
    let op = HostOp::Cond {
        handle,
        kind,
        bodies: bodies.clone(),
        run: Vec::new(),
    };
    st.captured(s, op);
    Ok(bodies)
}

pub(super) fn capture_begin_to(gpu: &HostGpu, s: usize, graph: u64) -> GpuResult<()> {
    if !gpu.state.lock().unwrap().graphs.contains_key(&graph) {
        return Err(CuError(code::INVALID_VALUE));
    }
    gpu.capture_begin(s)?;
    gpu.state.lock().unwrap().capture_into.insert(s, graph);
    Ok(())
}

pub(super) fn graph_clone(gpu: &HostGpu, graph: u64) -> GpuResult<u64> {
    let mut st = gpu.state.lock().unwrap();
    let ops = st
        .graphs
        .get(&graph)
        .cloned()
        .ok_or(CuError(code::INVALID_HANDLE))?;
    // Conditional bodies are copied too: the copy's own, outliving the original's.
    let ops = st.copy_ops(&ops)?;
    let g = st.next_handle;
    st.next_handle += 1;
    st.graphs.insert(g, ops);
    Ok(g)
}

pub(super) fn capture_child(gpu: &HostGpu, s: usize, child: u64) -> GpuResult<()> {
    let mut st = gpu.state.lock().unwrap();
    let ops = st
        .graphs
        .get(&child)
        .cloned()
        .ok_or(CuError(code::INVALID_HANDLE))?;
    let origin = st.origin(s);
    if !st.capturing.contains_key(&origin) {
        return Err(CuError(code::ILLEGAL_STATE));
    }
    // A child's work runs in its place: copied in, as the driver copies the graph
    // (conditional bodies included).
    let ops = st.copy_ops(&ops)?;
    let ops = st.resolve(&ops)?;
    let c = st
        .capturing
        .get_mut(&origin)
        .ok_or(CuError(code::ILLEGAL_STATE))?;
    c.2.extend(ops);
    Ok(())
}

pub(super) fn graph_exec_update(gpu: &HostGpu, exec: u64, graph: u64) -> GpuResult<()> {
    let mut st = gpu.state.lock().unwrap();
    let ops = st.graphs.get(&graph).ok_or(CuError(code::INVALID_HANDLE))?;
    let ops = st.resolve(ops)?;
    let e = st
        .execs
        .get_mut(&exec)
        .ok_or(CuError(code::INVALID_HANDLE))?;
    if e.len() != ops.len() {
        // CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE.
        return Err(CuError(910));
    }
    *e = ops;
    Ok(())
}

pub(super) fn graph_clear(gpu: &HostGpu, graph: u64) -> GpuResult<()> {
    let mut st = gpu.state.lock().unwrap();
    let ops = st
        .graphs
        .get_mut(&graph)
        .ok_or(CuError(code::INVALID_HANDLE))?;
    let gone: Vec<u64> = std::mem::take(ops)
        .into_iter()
        .flat_map(|op| match op {
            HostOp::Cond { bodies, .. } => bodies,
            _ => Vec::new(),
        })
        .collect();
    // Bodies go with their nodes (nested ones are not tracked here: tests nest none).
    for b in gone {
        st.graphs.remove(&b);
    }
    Ok(())
}

pub(super) fn graph_exec_destroy(gpu: &HostGpu, exec: u64) -> GpuResult<()> {
    let mut st = gpu.state.lock().unwrap();
    st.execs
        .remove(&exec)
        .map(drop)
        .ok_or(CuError(code::INVALID_HANDLE))
}

/// A profiling twin (docs/design.md 12b, design G): a copy of `graph` with a record op
/// before and after each launch, instantiated.
pub(super) fn graph_profile_twin(gpu: &HostGpu, graph: u64, flags: u64) -> GpuResult<ProfileTwin> {
    // As the driver's: a conditional node's handle would be the original's.
    let conditional = {
        let st = gpu.state.lock().unwrap();
        let ops = st.graphs.get(&graph).ok_or(CuError(code::INVALID_HANDLE))?;
        ops.iter().any(|op| matches!(op, HostOp::Cond { .. }))
    };
    if conditional {
        return Err(CuError(code::NOT_SUPPORTED));
    }
    let copy = graph_clone(gpu, graph)?;
    let mut nodes = Vec::new();
    {
        let mut st = gpu.state.lock().unwrap();
        let ops = st.graphs.remove(&copy).unwrap_or_default();
        if ops.len() * 3 >= 1 << 16 {
            // Record nodes are named by their place in the copy (16 bits).
            return Err(CuError(code::NOT_SUPPORTED));
        }
        let mut out = Vec::with_capacity(ops.len() * 3);
        for op in ops {
            // As the CUDA twin: kernels, memsets and copies are timed (CUmemorytype: 1
            // host, 2 device).
            let work = match &op {
                HostOp::Launch { func, .. } => TimedWork::Kernel {
                    func: *func,
                    grid: [1; 3],
                    block: [1; 3],
                    shared: 0,
                },
                HostOp::Memset {
                    value, elem, count, ..
                } => TimedWork::Memset {
                    value: *value,
                    bytes: *elem as u64 * *count as u64,
                },
                HostOp::Dtod { len, .. } => memcpy_work(2, 2, *len),
                HostOp::Htod { len, .. } => memcpy_work(1, 2, *len),
                HostOp::Dtoh { len, .. } => memcpy_work(2, 1, *len),
                _ => {
                    out.push(op);
                    continue;
                }
            };
            let start = (copy << 16) | out.len() as u64;
            out.push(HostOp::Record {
                node: start,
                event: 0,
            });
            out.push(op);
            let end = (copy << 16) | out.len() as u64;
            out.push(HostOp::Record {
                node: end,
                event: 0,
            });
            nodes.push(TimedNode { start, end, work });
        }
        st.graphs.insert(copy, out);
    }
    match graph_instantiate(gpu, copy, flags) {
        Ok(exec) => Ok(ProfileTwin {
            exec,
            graph: copy,
            placeholder: 0,
            nodes,
        }),
        Err(e) => {
            let _ = graph_destroy(gpu, copy);
            Err(e)
        }
    }
}

pub(super) fn graph_exec_set_event(
    gpu: &HostGpu,
    exec: u64,
    node: u64,
    event: u64,
) -> GpuResult<()> {
    let mut st = gpu.state.lock().unwrap();
    st.events.get(&event).ok_or(CuError(code::INVALID_HANDLE))?;
    let ops = st
        .execs
        .get_mut(&exec)
        .ok_or(CuError(code::INVALID_HANDLE))?;
    for op in ops.iter_mut() {
        if let HostOp::Record { node: n, event: e } = op {
            if *n == node {
                *e = event;
                return Ok(());
            }
        }
    }
    Err(CuError(code::INVALID_VALUE))
}

pub(super) fn graph_profile_twin_destroy(gpu: &HostGpu, twin: &ProfileTwin) {
    let _ = graph_exec_destroy(gpu, twin.exec);
    let _ = graph_destroy(gpu, twin.graph);
}

/// A timed copy of `len` bytes between sides of CUmemorytype `src` and `dst`.
fn memcpy_work(src: u8, dst: u8, len: usize) -> TimedWork {
    TimedWork::Memcpy {
        src,
        dst,
        bytes: len as u64,
    }
}
