//! Memory allocation and free nodes of graphs built by hand. The allocation is made when
//! the node is (graph_mem.rs says how graph memory is held); both nodes order the graph
//! as an empty node does.

use super::registry::{add, graph_ref, node_kind};
use super::types::{Built, Kind, MemAllocNode, PoolPropsBytes};
use crate::api::graph_mem::{allocate, is_graph_alloc, GraphAlloc};
use crate::cuda::*;
use crate::handles::GraphNode;
use crate::state::capture::CUgraph;
use crate::state::entry::{entry, out};
use std::ffi::c_uint;
use std::sync::Arc;

/// CUDA_MEM_ALLOC_NODE_PARAMS (v1, and v2 in CUgraphNodeParams): `dptr` is written.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAllocNodeParams {
    pub pool_props: PoolPropsBytes,
    pub access_descs: *const CUmemAccessDescRaw,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: u64,
}

/// CUmemAccessDesc: a location (type, id) and access flags.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemAccessDescRaw {
    pub location_type: c_uint,
    pub location_id: i32,
    pub flags: c_uint,
}

const _: () = assert!(std::mem::size_of::<MemAllocNodeParams>() == 120);

/// A 32-bit field of the pool properties.
fn field(p: &PoolPropsBytes, at: usize) -> u32 {
    u32::from_ne_bytes(p[at..at + 4].try_into().expect("4 bytes"))
}

/// Makes the allocation an alloc node's parameters ask for on graph `g`'s device and
/// writes its address into them.
///
/// # Safety
/// `p`'s access descriptors are null or `access_desc_count` readable entries.
pub(crate) unsafe fn mem_alloc_kind(
    g: CUgraph,
    p: &mut MemAllocNodeParams,
) -> Result<Kind, CUresult> {
    const PINNED: u32 = 1;
    const LOCATION_DEVICE: u32 = 1;
    const READ_WRITE: u32 = 3;
    let dev = graph_ref(g)?.dev;
    // Graph memory comes from the device's stream-ordered allocator.
    crate::api::pool::pools_on(dev)?;
    let own = |ty: u32, id: u32| ty == LOCATION_DEVICE && id as usize == dev;
    // Pinned device memory on the graph's device, not exportable (IPC is refused for
    // graph memory natively too).
    if p.bytesize == 0
        || field(&p.pool_props, 0) != PINNED
        || field(&p.pool_props, 4) != 0
        || !own(field(&p.pool_props, 8), field(&p.pool_props, 12))
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if p.access_desc_count > 0 {
        if p.access_descs.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: per the contract, that many descriptors.
        let descs = unsafe { std::slice::from_raw_parts(p.access_descs, p.access_desc_count) };
        // A client sees one device of its server's: peer access names no other.
        if descs
            .iter()
            .any(|d| !own(d.location_type, d.location_id as u32) || d.flags != READ_WRITE)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    let alloc = allocate(dev, p.bytesize)?;
    p.dptr = alloc.ptr;
    Ok(Kind::MemAlloc(MemAllocNode {
        alloc,
        props: p.pool_props,
    }))
}

/// A free node may free only what an alloc node (or a capture) allocated.
pub(crate) fn mem_free_kind(ptr: u64) -> Result<Kind, CUresult> {
    if !is_graph_alloc(ptr) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Kind::MemFree(ptr))
}

/// The allocations of built graph `b` that no free node of it frees.
pub(crate) fn unfreed(b: &Built) -> Vec<Arc<GraphAlloc>> {
    let frees: Vec<u64> = b
        .live()
        .filter_map(|(_, n)| match n.kind {
            Kind::MemFree(p) => Some(p),
            _ => None,
        })
        .collect();
    b.live()
        .filter_map(|(_, n)| match &n.kind {
            Kind::MemAlloc(m) if !frees.contains(&m.alloc.ptr) => Some(m.alloc.clone()),
            _ => None,
        })
        .collect()
}

/// # Safety
/// `ph` is null or writable; `deps` is null or holds `n` node handles; `p` is null or
/// valid and writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    p: *mut MemAllocNodeParams,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's parameters.
        let p = unsafe { p.as_mut() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: forwarded contract.
        let kind = unsafe { mem_alloc_kind(g, p) }?;
        // SAFETY: forwarded contract.
        unsafe { add(ph, g, deps, n, kind) }
    })
}

/// # Safety
/// `ph` is null or writable; `deps` is null or holds `n` node handles.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    ptr: u64,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { add(ph, g, deps, n, mem_free_kind(ptr)?) })
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphMemAllocNodeGetParams(
    node: *mut GraphNode,
    p: *mut MemAllocNodeParams,
) -> CUresult {
    entry(|| match node_kind(node)? {
        Kind::MemAlloc(m) => {
            let v = MemAllocNodeParams {
                pool_props: m.props,
                access_descs: std::ptr::null(),
                access_desc_count: 0,
                bytesize: m.alloc.size as usize,
                dptr: m.alloc.ptr,
            };
            // SAFETY: the caller's pointer.
            unsafe { out(p, v) }
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphMemFreeNodeGetParams(
    node: *mut GraphNode,
    p: *mut u64,
) -> CUresult {
    entry(|| match node_kind(node)? {
        // SAFETY: the caller's pointer.
        Kind::MemFree(ptr) => unsafe { out(p, ptr) },
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    })
}
