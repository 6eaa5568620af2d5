//! What a program may read back from a graph built by hand: a kernel node's parameters,
//! the edges, a DOT picture.

use super::nodes::{KernelNodeParams, KernelNodeParamsV2};
use super::registry::{built_node_type, edit_node, graph_ref, node_handles, node_kind, with};
use super::types::{node_type, KernelNode, Kind};
use crate::cuda::*;
use crate::handles::GraphNode;
use crate::state::capture::CUgraph;
use crate::state::entry::{entry, out};
use crate::state::streams::{function, CUfunction};
use std::collections::HashMap;
use std::ffi::{c_uint, c_void};
use std::sync::LazyLock;
use std::sync::Mutex;

/// Argument copies cuGraphKernelNodeGetParams handed out, by node handle: the packed
/// arguments and a pointer to each, valid until that node's parameters are read again.
type ReadBack = HashMap<usize, (Box<[u8]>, Box<[usize]>)>;
static READ_BACK: LazyLock<Mutex<ReadBack>> = LazyLock::new(Default::default);

fn kernel_params(node: *mut GraphNode) -> Result<KernelNodeParams, CUresult> {
    let Kind::Kernel(k) = node_kind(node)? else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let f = function(k.func as CUfunction)?;
    let args = k.args.clone().into_boxed_slice();
    let ptrs: Box<[usize]> = f
        .params
        .iter()
        .map(|&(off, _)| args.as_ptr() as usize + off as usize)
        .collect();
    let kernel_params = ptrs.as_ptr() as *mut *mut c_void;
    READ_BACK
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(node as usize, (args, ptrs));
    let p = KernelNodeParams {
        func: k.func as CUfunction,
        grid: k.grid,
        block: k.block,
        shared: k.shared,
        kernel_params,
        extra: std::ptr::null_mut(),
    };
    Ok(p)
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams(
    node: *mut GraphNode,
    p: *mut KernelNodeParams,
) -> CUresult {
    // SAFETY: the caller's pointer.
    entry(|| unsafe { out(p, kernel_params(node)?) })
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams_v2(
    node: *mut GraphNode,
    p: *mut KernelNodeParamsV2,
) -> CUresult {
    entry(|| {
        let v1 = kernel_params(node)?;
        // As the driver answers: the function, the kernel (one handle here) and the
        // context all filled; cudart finds its host entry through the kernel.
        let v = KernelNodeParamsV2 {
            v1,
            kern: v1.func,
            ctx: crate::state::ctx::current_ctx(),
        };
        // SAFETY: the caller's pointer.
        unsafe { out(p, v) }
    })
}

/// Built graph `g`'s edges, as (from, to) node handles in node order.
fn edges(g: CUgraph) -> Result<Vec<(*mut GraphNode, *mut GraphNode)>, CUresult> {
    graph_ref(g)?;
    let Some(handles) = node_handles(g) else {
        return Err(crate::unsupported::unsupported(
            "the edges of a captured graph",
        ));
    };
    with(|r| {
        let b = r
            .graphs
            .get(&(g as usize))
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let index: Vec<usize> = b.live().map(|(i, _)| i).collect();
        let at = |i: usize| handles[index.iter().position(|&x| x == i).expect("live")];
        Ok(b.live()
            .flat_map(|(i, n)| n.deps.iter().map(move |&d| (d, i)))
            .map(|(d, i)| (at(d), at(i)))
            .collect())
    })
}

/// # Safety
/// `from` and `to` are null or hold `*num` handles; `num` is null or valid.
unsafe fn write_edges(
    g: CUgraph,
    from: *mut *mut GraphNode,
    to: *mut *mut GraphNode,
    data: *mut u64,
    num: *mut usize,
) -> Result<(), CUresult> {
    let e = edges(g)?;
    if num.is_null() || from.is_null() != to.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's pointers, per the contract.
    unsafe {
        if from.is_null() {
            return out(num, e.len());
        }
        let room = num.read();
        for k in 0..room {
            let (a, b) = e
                .get(k)
                .copied()
                .unwrap_or((std::ptr::null_mut(), std::ptr::null_mut()));
            from.add(k).write(a);
            to.add(k).write(b);
            if !data.is_null() {
                data.add(k).write(0);
            }
        }
        num.write(room.min(e.len()));
    }
    Ok(())
}

/// # Safety
/// As cuGraphGetEdges.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetEdges(
    g: CUgraph,
    from: *mut *mut GraphNode,
    to: *mut *mut GraphNode,
    num: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { write_edges(g, from, to, std::ptr::null_mut(), num) })
}

/// Edge data is all default here (no programmatic edges).
///
/// # Safety
/// As cuGraphGetEdges_v2.
#[no_mangle]
pub unsafe extern "C" fn cuGraphGetEdges_v2(
    g: CUgraph,
    from: *mut *mut GraphNode,
    to: *mut *mut GraphNode,
    data: *mut u64,
    num: *mut usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { write_edges(g, from, to, data, num) })
}

/// A DOT picture of a built graph: one box per node (its kind), one arrow per edge.
///
/// # Safety
/// `path` is null or a C string.
#[no_mangle]
pub unsafe extern "C" fn cuGraphDebugDotPrint(
    g: CUgraph,
    path: *const std::ffi::c_char,
    _flags: c_uint,
) -> CUresult {
    entry(|| {
        if path.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's C string.
        let path = unsafe { std::ffi::CStr::from_ptr(path) }
            .to_string_lossy()
            .into_owned();
        let e = edges(g)?;
        let nodes = node_handles(g).unwrap_or_default();
        let kinds: Vec<u32> = nodes
            .iter()
            .map(|&n| built_node_type(n).and_then(Result::ok).unwrap_or(u32::MAX))
            .collect();
        let name = |t: u32| match t {
            node_type::KERNEL => "kernel",
            node_type::MEMCPY => "memcpy",
            node_type::MEMSET => "memset",
            node_type::HOST => "host",
            node_type::GRAPH => "graph",
            node_type::EMPTY => "empty",
            node_type::WAIT_EVENT => "wait event",
            node_type::EVENT_RECORD => "event record",
            node_type::MEM_ALLOC => "mem alloc",
            node_type::MEM_FREE => "mem free",
            _ => "node",
        };
        let idx = |h: *mut GraphNode| nodes.iter().position(|&x| x == h).unwrap_or(0);
        let mut dot = String::from("digraph omps {\n");
        for (i, &t) in kinds.iter().enumerate() {
            dot += &format!("  n{i} [shape=box label=\"{i}: {}\"];\n", name(t));
        }
        for (a, b) in e {
            dot += &format!("  n{} -> n{};\n", idx(a), idx(b));
        }
        dot += "}\n";
        // CUDA_ERROR_OPERATING_SYSTEM, as the driver answers a file it cannot write.
        std::fs::write(&path, dot).map_err(|_| 304)
    })
}

/// CUlaunchAttributeValue: 64 bytes.
pub type AttrValue = [u8; 64];

fn kernel_of(node: *mut GraphNode) -> Result<KernelNode, CUresult> {
    match node_kind(node)? {
        Kind::Kernel(k) => Ok(k),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Sets launch attribute `id` of a kernel node; attributes that carry handles are
/// refused, as cuLaunchKernelEx refuses them here.
///
/// # Safety
/// `value` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeSetAttribute(
    node: *mut GraphNode,
    id: c_uint,
    value: *const AttrValue,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's value.
        let value = unsafe { value.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if !omps_ring::wire::launch_attr_forwardable(id) {
            return Err(crate::unsupported::unsupported(
                "a kernel node attribute that carries a handle",
            ));
        }
        let mut k = kernel_of(node)?;
        let mut rec = [0u8; omps_ring::wire::LAUNCH_ATTR_BYTES];
        rec[..4].copy_from_slice(&id.to_le_bytes());
        rec[8..].copy_from_slice(value);
        match k.attrs.iter().position(|r| r[..4] == id.to_le_bytes()) {
            Some(i) => k.attrs[i] = rec,
            None if k.attrs.len() < omps_ring::wire::MAX_LAUNCH_ATTRS as usize => k.attrs.push(rec),
            None => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        edit_node(node, |_| Kind::Kernel(k))
    })
}

/// A kernel node's launch attribute `id`: what was set, or the default (all zero).
///
/// # Safety
/// `value` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeGetAttribute(
    node: *mut GraphNode,
    id: c_uint,
    value: *mut AttrValue,
) -> CUresult {
    entry(|| {
        let k = kernel_of(node)?;
        let mut v = [0u8; 64];
        if let Some(r) = k.attrs.iter().find(|r| r[..4] == id.to_le_bytes()) {
            v.copy_from_slice(&r[8..]);
        }
        // SAFETY: the caller's pointer.
        unsafe { out(value, v) }
    })
}

#[no_mangle]
pub extern "C" fn cuGraphKernelNodeCopyAttributes(
    dst: *mut GraphNode,
    src: *mut GraphNode,
) -> CUresult {
    entry(|| {
        let from = kernel_of(src)?;
        let mut to = kernel_of(dst)?;
        to.attrs = from.attrs;
        edit_node(dst, |_| Kind::Kernel(to))
    })
}
