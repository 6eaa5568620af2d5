//! Conditional nodes of graphs built here. Their handles must be the driver's, made by
//! the driver graph the built graph becomes, and a program bakes them into kernel
//! arguments long before that; so a built graph that makes handles gets a server graph
//! of its own, its [`Home`], and every instantiation captures into that home
//! (omps-server/src/session/conditional.rs). A conditional node's bodies are graphs built
//! here, which the node owns (as a child node owns its graph); at instantiation the
//! server adds the node where the capture stands and each body is captured into the body
//! graph the driver made for it.

use super::registry::{graph_ref, is_built, with};
use super::server_graph::cond_call;
use super::types::{Built, CondNode, Home, Kind};
use crate::cuda::*;
use crate::handles::{leak, GraphHandle, GraphNode, GRAPH_MAGIC, NODE_MAGIC};
use crate::state::capture::CUgraph;
use crate::state::entry::{entry, out};
use omps_ring::wire::graph as wg;
use std::collections::HashMap;
use std::ffi::{c_uint, c_void};
use std::sync::Arc;
use std::sync::Mutex;

/// CUDA_CONDITIONAL_NODE_PARAMS.
#[repr(C)]
pub struct CondParams {
    pub handle: u64,
    pub ty: c_uint,
    pub size: c_uint,
    pub graph_out: *mut CUgraph,
    pub ctx: *mut c_void,
}

/// Built graph `g`'s home, made at its first handle.
fn home(g: CUgraph, dev: usize) -> Result<Arc<Home>, CUresult> {
    if let Some(h) = with(|r| r.graphs.get(&(g as usize)).and_then(|b| b.home.clone())) {
        return Ok(h);
    }
    let id = cond_call(dev, wg::COND_HOME, |_| {})? as u32;
    let made = Arc::new(Home {
        dev,
        id,
        busy: Mutex::new(()),
        handles: Mutex::new(Vec::new()),
    });
    // Another thread may have made one meanwhile: the first stays, ours goes.
    with(|r| {
        let b = r
            .graphs
            .get_mut(&(g as usize))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        Ok(b.home.get_or_insert(made).clone())
    })
}

/// # Safety
/// `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphConditionalHandleCreate(
    out: *mut u64,
    g: CUgraph,
    _ctx: *mut c_void,
    default: c_uint,
    flags: c_uint,
) -> CUresult {
    entry(|| {
        const ASSIGN_DEFAULT: c_uint = 1;
        if out.is_null() || flags & !ASSIGN_DEFAULT != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let gr = graph_ref(g)?;
        if !is_built(g) {
            let h = match crate::state::capture::capture_stream_of(g) {
                Some((dev, stream)) => capture_handle(dev, stream, default, flags)?,
                None => {
                    return Err(crate::unsupported::unsupported(
                        "conditional handles of a graph the server captured",
                    ))
                }
            };
            // SAFETY: checked non-null; the caller's pointer.
            unsafe { out.write(h) };
            return Ok(());
        }
        let home = home(g, gr.dev)?;
        let h = cond_call(gr.dev, wg::COND_HANDLE, |c| {
            c.graph = home.id;
            c.value = default;
            c.flags = flags;
        })?;
        lock(&home.handles).push(h);
        // SAFETY: checked non-null; the caller's pointer.
        unsafe { out.write(h) };
        Ok(())
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A conditional node of built graph `g` from its parameters: its bodies are made (empty
/// built graphs sharing `g`'s home) and given out through `p.graph_out`.
pub(crate) fn cond_kind(g: CUgraph, p: &mut CondParams) -> Result<Kind, CUresult> {
    let (dev, home) = with(|r| {
        r.graphs
            .get(&(g as usize))
            .map(|b| (b.dev, b.home.clone()))
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    })?;
    // The handle must be one of this graph's (its home's).
    let home = home
        .filter(|h| lock(&h.handles).contains(&p.handle))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let fits = match p.ty {
        0 => matches!(p.size, 1 | 2),
        1 => p.size == 1,
        2 => (1..=wg::MAX_BODIES).contains(&p.size),
        _ => false,
    };
    if !fits {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let bodies: Arc<[usize]> = with(|r| {
        (0..p.size)
            .map(|_| {
                let h = leak(GraphHandle::new(GRAPH_MAGIC, 0, dev)) as usize;
                r.graphs.insert(
                    h,
                    Built {
                        dev,
                        nodes: Vec::new(),
                        home: Some(home.clone()),
                    },
                );
                h
            })
            .collect()
    });
    p.graph_out = bodies.as_ptr() as *mut CUgraph;
    Ok(Kind::Conditional(CondNode {
        handle: p.handle,
        ty: p.ty,
        bodies,
    }))
}

/// Whether `b` has conditional nodes (and so a home), which changes how its executable
/// graphs take new parameters.
pub(crate) fn has_conditionals(b: &Built) -> bool {
    b.home.is_some()
}

/// Conditional nodes added to captures going on (the CUDA guide's way, and PyTorch's for
/// torch.cond): their node handles -> the capturing stream (device, server stream id) the
/// server added them on, and the handles of the bodies the driver made for them.
#[derive(Default)]
struct CapturedConds {
    nodes: HashMap<usize, (usize, u32)>,
    bodies: std::collections::HashSet<usize>,
    /// Each node's body array, which `phGraph_out` points at for the process's life.
    arrays: Vec<Box<[usize]>>,
}

static CAPTURED: std::sync::LazyLock<Mutex<CapturedConds>> =
    std::sync::LazyLock::new(Default::default);

/// A handle of the graph of the capture going on on origin stream `stream`.
pub(crate) fn capture_handle(
    dev: usize,
    stream: u32,
    default: c_uint,
    flags: c_uint,
) -> Result<u64, CUresult> {
    cond_call(dev, wg::COND_HANDLE_CAPTURE, |c| {
        c.stream = stream;
        c.value = default;
        c.flags = flags;
    })
}

/// cuGraphAddNode of a conditional node to graph `g` of a capture going on: the server
/// adds it where the capture's origin stream stands (the dependencies passed are those
/// the program read from cuStreamGetCaptureInfo, which omps gives as none) and moves the
/// stream past it, as the cuStreamUpdateCaptureDependencies the program calls next would.
pub(crate) fn add_to_capture(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    p: &mut CondParams,
) -> Result<(), CUresult> {
    let (dev, stream) = crate::state::capture::capture_stream_of(g).ok_or_else(|| {
        crate::unsupported::unsupported("adding nodes to a graph the server captured")
    })?;
    if ph.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let first = cond_call(dev, wg::COND_NODE, |c| {
        c.stream = stream;
        c.handle = p.handle;
        c.value = p.ty;
        c.size = p.size;
    })? as u32;
    let bodies: Box<[usize]> = (0..p.size)
        .map(|k| leak(GraphHandle::new(GRAPH_MAGIC, first + k, dev)) as usize)
        .collect();
    p.graph_out = bodies.as_ptr() as *mut CUgraph;
    let node = leak(GraphNode {
        magic: std::sync::atomic::AtomicU32::new(NODE_MAGIC),
        graph: 0,
        index: u32::MAX,
        dev,
    });
    let mut c = lock(&CAPTURED);
    c.nodes.insert(node as usize, (dev, stream));
    c.bodies.extend(bodies.iter().copied());
    c.arrays.push(bodies);
    drop(c);
    // SAFETY: checked non-null; the caller's pointer.
    unsafe { out(ph, node) }
}

/// Whether `node` is a conditional node added on capturing stream (device, stream id).
pub(crate) fn added_on(node: *mut GraphNode, dev: usize, stream: u32) -> bool {
    lock(&CAPTURED).nodes.get(&(node as usize)) == Some(&(dev, stream))
}

/// Whether `g` is a body of a conditional node added to a capture.
pub(crate) fn is_captured_body(g: CUgraph) -> bool {
    lock(&CAPTURED).bodies.contains(&(g as usize))
}
