//! Instantiating a graph built by hand: its nodes issued in dependency order onto
//! private streams inside a capture on the server (see the parent module).

use super::registry::{child_graph, graph_ref};
use super::server_graph::cond_call;
use super::types::{Built, CondNode, Kind};
use crate::api::capture::{cuStreamBeginCapture_v2, cuStreamEndCapture};
use crate::api::exec::{
    cuEventCreate, cuEventDestroy_v2, cuEventRecord, cuEventRecordWithFlags, cuLaunchKernel,
    cuStreamDestroy_v2, cuStreamWaitEvent,
};
use crate::api::hostmem::cuMemcpy3DAsync_v2;
use crate::cuda::*;
use crate::handles::GRAPH_MAGIC;
use crate::state::capture::{CUgraph, MODE_RELAXED};
use crate::state::streams::{CUevent, CUfunction, CUstream};
use omps_ring::wire::graph as wg;
use std::collections::HashMap;
use std::ffi::{c_uint, c_void};

/// A node of the flat graph that is issued: a child graph's nodes are inlined.
struct Flat {
    kind: Kind,
    deps: Vec<usize>,
}

/// Inlines child graphs: a child's roots wait for what the child node waited for, and
/// whatever waited for the child node waits for all the child's nodes.
/// None when `b` or a child in it has a cycle.
fn flatten(
    b: &Built,
    out: &mut Vec<Flat>,
    outer_deps: &[usize],
) -> Option<Vec<Option<Vec<usize>>>> {
    // For each node of `b`, the flat indices that stand for its completion.
    let mut done: Vec<Option<Vec<usize>>> = vec![None; b.nodes.len()];
    let order = topo(b)?;
    for i in order {
        let n = b.nodes[i].as_ref().expect("topo lists live nodes");
        let mut deps: Vec<usize> = n
            .deps
            .iter()
            .flat_map(|&d| done[d].clone().unwrap_or_default())
            .collect();
        if n.deps.is_empty() {
            deps.extend_from_slice(outer_deps);
        }
        match &n.kind {
            Kind::Child(c) => {
                let inner = flatten(&child_graph(*c)?, out, &deps)?;
                let mut ends: Vec<usize> = inner.into_iter().flatten().flatten().collect();
                if ends.is_empty() {
                    ends = deps;
                }
                ends.sort_unstable();
                ends.dedup();
                done[i] = Some(ends);
            }
            k => {
                // A disabled node keeps its place in the order and does nothing.
                let kind = if n.disabled { Kind::Empty } else { k.clone() };
                out.push(Flat { kind, deps });
                done[i] = Some(vec![out.len() - 1]);
            }
        }
    }
    Some(done)
}

/// The live nodes in an order where every node follows its dependencies; None if the
/// edges form a cycle.
fn topo(b: &Built) -> Option<Vec<usize>> {
    let mut pending: HashMap<usize, usize> = b.live().map(|(i, n)| (i, n.deps.len())).collect();
    let mut ready: Vec<usize> = {
        let mut v: Vec<usize> = pending
            .iter()
            .filter(|(_, &k)| k == 0)
            .map(|(&i, _)| i)
            .collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v
    };
    let mut order = Vec::with_capacity(pending.len());
    while let Some(i) = ready.pop() {
        order.push(i);
        let mut next: Vec<usize> = b
            .live()
            .filter(|(_, n)| n.deps.contains(&i))
            .filter_map(|(k, _)| {
                let left = pending.get_mut(&k)?;
                *left -= 1;
                (*left == 0).then_some(k)
            })
            .collect();
        next.sort_unstable_by(|a, b| b.cmp(a));
        ready.extend(next);
    }
    (order.len() == pending.len()).then_some(order)
}

/// Which private stream each flat node goes on: a node continues the stream of one of
/// its dependencies when that dependency is the stream's last node, and otherwise opens
/// a new stream. Returns the stream of each node and how many streams there are.
fn lanes(flat: &[Flat]) -> (Vec<usize>, usize) {
    let mut lane_of: Vec<usize> = Vec::with_capacity(flat.len());
    let mut tails: Vec<Option<usize>> = vec![None];
    for (i, n) in flat.iter().enumerate() {
        let lane = n
            .deps
            .iter()
            .map(|&d| lane_of[d])
            .find(|&l| tails[l].is_some_and(|t| n.deps.contains(&t)))
            .or_else(|| tails.iter().position(|t| t.is_none()))
            .unwrap_or_else(|| {
                tails.push(None);
                tails.len() - 1
            });
        tails[lane] = Some(i);
        lane_of.push(lane);
    }
    (lane_of, tails.len())
}

/// Streams and events made for one instantiation, destroyed with it.
struct Scratch {
    streams: Vec<CUstream>,
    events: Vec<CUevent>,
}

impl Scratch {
    fn stream(&mut self) -> Result<CUstream, CUresult> {
        let mut s = std::ptr::null_mut();
        const NON_BLOCKING: c_uint = 1;
        // SAFETY: a valid out-pointer.
        ok(unsafe { crate::api::exec::cuStreamCreate(&mut s, NON_BLOCKING) })?;
        self.streams.push(s);
        Ok(s)
    }

    fn event_on(&mut self, s: CUstream) -> Result<CUevent, CUresult> {
        let mut e = std::ptr::null_mut();
        const DISABLE_TIMING: c_uint = 2;
        // SAFETY: a valid out-pointer.
        ok(unsafe { cuEventCreate(&mut e, DISABLE_TIMING) })?;
        self.events.push(e);
        ok(cuEventRecord(e, s))?;
        Ok(e)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for &e in &self.events {
            cuEventDestroy_v2(e);
        }
        for &s in &self.streams {
            // SAFETY: a stream this instantiation made and nothing else holds.
            unsafe { cuStreamDestroy_v2(s) };
        }
    }
}

fn ok(r: CUresult) -> Result<(), CUresult> {
    if r == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(r)
    }
}

/// Issues one node on stream `s`.
fn issue(kind: &Kind, s: CUstream) -> Result<(), CUresult> {
    match kind {
        // Graph memory is allocated when its node is made (mem_nodes.rs).
        Kind::Empty | Kind::Child(_) | Kind::MemAlloc(_) | Kind::MemFree(_) => Ok(()),
        Kind::Kernel(k) => {
            const BUFFER_POINTER: usize = 1;
            const BUFFER_SIZE: usize = 2;
            let mut size = k.args.len();
            let mut extra: [*mut c_void; 5] = [
                BUFFER_POINTER as *mut c_void,
                k.args.as_ptr() as *mut c_void,
                BUFFER_SIZE as *mut c_void,
                &mut size as *mut usize as *mut c_void,
                std::ptr::null_mut(),
            ];
            let [gx, gy, gz] = k.grid;
            let [bx, by, bz] = k.block;
            if !k.attrs.is_empty() {
                let config = crate::state::launch::LaunchConfig {
                    grid: k.grid,
                    block: k.block,
                    shared_mem: k.shared,
                    stream: s,
                    attrs: k.attrs.as_ptr() as *const u8,
                    num_attrs: k.attrs.len() as c_uint,
                };
                // SAFETY: as below; the attributes are whole CUlaunchAttribute records.
                return ok(unsafe {
                    crate::api::exec::cuLaunchKernelEx(
                        &config,
                        k.func as CUfunction,
                        std::ptr::null_mut(),
                        extra.as_mut_ptr(),
                    )
                });
            }
            // SAFETY: `extra` lays out the packed arguments of this very function.
            ok(unsafe {
                cuLaunchKernel(
                    k.func as CUfunction,
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    k.shared,
                    s,
                    std::ptr::null_mut(),
                    extra.as_mut_ptr(),
                )
            })
        }
        Kind::Memset(m) => {
            crate::api::mem::memset_2d(m.dst, m.pitch, m.value, m.elem, m.width, m.height, s)
        }
        Kind::Memcpy(c) => {
            // SAFETY: the description the caller gave; its host pointers are the caller's.
            ok(unsafe { cuMemcpy3DAsync_v2(&c.0, s) })
        }
        // The external forms: in a capture, nodes of the graph rather than edges.
        &Kind::EventRecord(e) => ok(cuEventRecordWithFlags(e as CUevent, s, 1)),
        &Kind::EventWait(e) => ok(cuStreamWaitEvent(s, e as CUevent, 1)),
        // In the capture, a host node (crate::hostfn).
        &Kind::Host(f, data) => {
            // SAFETY: the function and argument the program gave for the node.
            ok(unsafe { crate::api::exec::cuLaunchHostFunc(s, Some(f), data as *mut c_void) })
        }
        Kind::Conditional(c) => issue_conditional(c, s),
        Kind::ServerChild(c) => super::server_child::issue_server_child(c, s),
    }
}

/// Where a capture of a built graph goes: a new server graph, or the server graph
/// with this id (a conditional node's home or body).
#[derive(Clone, Copy, PartialEq)]
enum Target {
    New,
    Into(u32),
}

/// Issues conditional node `c` where stream `s`'s capture stands: the server adds the
/// node, and each body is captured into the body graph the driver made for it.
fn issue_conditional(c: &CondNode, s: CUstream) -> Result<(), CUresult> {
    let (stream, dev) = crate::state::streams::stream_dev(s)?;
    let first = cond_call(dev, wg::COND_NODE, |g| {
        g.stream = stream;
        g.handle = c.handle;
        g.value = c.ty;
        g.size = c.bodies.len() as u32;
    })? as u32;
    for (k, &b) in c.bodies.iter().enumerate() {
        let body = child_graph(b).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        capture_into(&body, first + k as u32)?;
    }
    Ok(())
}

/// Captures built graph `b` on the server and runs `then` with the server graph's id
/// (to instantiate it); the graph is let go after, or, for a graph with conditional
/// nodes, its home is cleared for the next instantiation. The capture runs on the
/// graph's device, whichever is current.
pub(crate) fn capture_then(
    b: &Built,
    then: impl FnOnce(u32) -> Result<u32, CUresult>,
) -> Result<u32, CUresult> {
    let ctx = crate::state::ctx::primary_handle(b.dev);
    // SAFETY: the primary context of the graph's device, a handle of this shim.
    ok(unsafe { crate::state::ctx::push_current(ctx as _) })?;
    let r = match &b.home {
        None => capture_built(b, Target::New).and_then(|g| {
            let r = then(g);
            destroy_server_graph(b.dev, g);
            r
        }),
        Some(home) => {
            let _busy = home.busy.lock().unwrap_or_else(|e| e.into_inner());
            let r = capture_built(b, Target::Into(home.id)).and_then(then);
            let cleared =
                super::server_graph::cond_call(b.dev, omps_ring::wire::graph::COND_CLEAR, |c| {
                    c.graph = home.id
                });
            r.and_then(|e| cleared.map(|_| e))
        }
    };
    let mut popped = std::ptr::null_mut();
    // SAFETY: pops what was pushed above; a valid out-pointer.
    unsafe { crate::state::ctx::pop_current(&mut popped) };
    r
}

/// Captures conditional body `b` into the server's body graph `id`.
pub(super) fn capture_into(b: &Built, id: u32) -> Result<(), CUresult> {
    capture_built(b, Target::Into(id)).map(drop)
}

fn capture_built(b: &Built, target: Target) -> Result<u32, CUresult> {
    let mut flat = Vec::new();
    flatten(b, &mut flat, &[]).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    capture_flat(&flat, target)
}

fn destroy_server_graph(dev: usize, id: u32) {
    let h = omps_ring::wire::Handle { id, _pad: 0 };
    let _ = crate::state::entry::live().and_then(|c| {
        c.push(
            dev,
            omps_ring::wire::Op::GraphDestroy,
            &[bytemuck::bytes_of(&h)],
        )
    });
}

fn capture_flat(flat: &[Flat], target: Target) -> Result<u32, CUresult> {
    let (lane_of, n_lanes) = lanes(flat);
    // Which nodes another stream waits for: those get an event after them.
    let mut needed = vec![false; flat.len()];
    for (i, n) in flat.iter().enumerate() {
        for &d in &n.deps {
            if lane_of[d] != lane_of[i] {
                needed[d] = true;
            }
        }
    }
    let mut sc = Scratch {
        streams: Vec::new(),
        events: Vec::new(),
    };
    let streams: Vec<CUstream> = (0..n_lanes)
        .map(|_| sc.stream())
        .collect::<Result<_, _>>()?;
    match target {
        Target::New => ok(cuStreamBeginCapture_v2(streams[0], MODE_RELAXED))?,
        Target::Into(id) => crate::api::capture::begin_to(streams[0], id, None, MODE_RELAXED)?,
    }
    let mut started = vec![false; n_lanes];
    started[0] = true;
    let issued = (|| {
        let fork = sc.event_on(streams[0])?;
        let mut after: Vec<Option<CUevent>> = vec![None; flat.len()];
        for (i, n) in flat.iter().enumerate() {
            let s = streams[lane_of[i]];
            let mut joined = started[lane_of[i]];
            for &d in &n.deps {
                if lane_of[d] != lane_of[i] {
                    ok(cuStreamWaitEvent(
                        s,
                        after[d].expect("recorded after it"),
                        0,
                    ))?;
                    joined = true;
                }
            }
            if !joined {
                // A root on a stream of its own joins the capture at its start.
                ok(cuStreamWaitEvent(s, fork, 0))?;
            }
            started[lane_of[i]] = true;
            issue(&n.kind, s)?;
            if needed[i] {
                after[i] = Some(sc.event_on(s)?);
            }
        }
        Ok(())
    })();
    // Every stream that joined goes back into the origin, also after a failure, so the
    // capture ends cleanly (an unjoined fork would leave it half open).
    for (l, &s) in streams.iter().enumerate().skip(1) {
        if started[l] {
            if let Ok(e) = sc.event_on(s) {
                let _ = cuStreamWaitEvent(streams[0], e, 0);
            }
        }
    }
    let mut g: CUgraph = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let ended = ok(unsafe { cuStreamEndCapture(streams[0], &mut g) });
    if ended.is_ok() {
        let h = graph_ref(g)?;
        let id = h.id();
        // What the graph holds (staged copies' buffers) goes to the executable graph.
        crate::api::staged::adopt_from(g as usize);
        // The handle was only the vehicle; the server's graph is the caller's to release.
        let _ = crate::handles::retire(&h.magic, GRAPH_MAGIC);
        if let Err(e) = issued {
            // A node failed: a new partial graph goes (a home is cleared by the caller).
            if target == Target::New {
                destroy_server_graph(h.dev, id);
            }
            return Err(e);
        }
        return Ok(id);
    }
    issued.and(ended).map(|_| 0)
}
