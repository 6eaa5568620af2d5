//! Nodes of graphs built by hand: each kind's parameters as cuda.h lays them out, the
//! add calls (one per kind and the generic `cuGraphAddNode`), and parameter reads and
//! writes.

use super::cond::{add_to_capture, cond_kind, CondParams};
use super::edges::default_edges;
use super::mem_nodes::{mem_alloc_kind, mem_free_kind, MemAllocNodeParams};
use super::registry::{add, child_kind, graph_ref, is_built, locate, node_kind, set_node};
use super::types::{node_type, CopyNode, HostFn, KernelNode, Kind, MemsetNodeParams};
use crate::api::hostmem::Memcpy3D;
use crate::cuda::*;
use crate::handles::GraphNode;
use crate::state::capture::CUgraph;
use crate::state::entry::{entry, out};
use crate::state::streams::{event, CUevent, CUfunction};
use std::ffi::{c_uint, c_void};

/// CUDA_KERNEL_NODE_PARAMS (v1); v2 appends a CUkernel and a context.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParams {
    pub func: CUfunction,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParamsV2 {
    pub v1: KernelNodeParams,
    pub kern: CUfunction,
    pub ctx: *mut c_void,
}

/// The node a kernel's parameters describe: arguments packed now, as the driver copies them.
///
/// # Safety
/// `p`'s argument pointers follow cuLaunchKernel's contract for its function.
pub(super) unsafe fn kernel_node(
    p: &KernelNodeParams,
    kern: CUfunction,
) -> Result<KernelNode, CUresult> {
    let f = if p.func.is_null() { kern } else { p.func };
    // A library's kernel: its function on the device the graph is built on.
    let func = crate::state::modules::function_here(f)?;
    let mut args = vec![0u8; func.args_size];
    // SAFETY: forwarded contract.
    unsafe { crate::api::exec::pack_args(func, p.kernel_params, p.extra, &mut args) }?;
    Ok(KernelNode {
        func: func as *const crate::handles::Function as usize,
        grid: p.grid,
        block: p.block,
        shared: p.shared,
        args,
        attrs: Vec::new(),
    })
}

/// A kernel node from CUDA_KERNEL_NODE_PARAMS (v1: the function only).
///
/// # Safety
/// As [`kernel_node`].
pub(crate) unsafe fn kernel_kind_v1(p: &KernelNodeParams) -> Result<Kind, CUresult> {
    // SAFETY: forwarded contract.
    unsafe { kernel_node(p, std::ptr::null_mut()) }.map(Kind::Kernel)
}

/// A kernel node from CUDA_KERNEL_NODE_PARAMS_v2 (the function or the CUkernel).
///
/// # Safety
/// As [`kernel_node`].
pub(crate) unsafe fn kernel_kind_v2(p: &KernelNodeParamsV2) -> Result<Kind, CUresult> {
    // SAFETY: forwarded contract.
    unsafe { kernel_node(&p.v1, p.kern) }.map(Kind::Kernel)
}

pub(crate) fn memset_kind(p: &MemsetNodeParams) -> Result<Kind, CUresult> {
    if !matches!(p.elem, 1 | 2 | 4) || p.width == 0 || p.height == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Kind::Memset(*p))
}

/// # Safety
/// As cuGraphAddEmptyNode.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { add(ph, g, deps, n, Kind::Empty) })
}

/// An event record or wait node of event `e`.
pub(crate) fn event_kind(ty: u32, e: CUevent) -> Result<Kind, CUresult> {
    event(e)?;
    Ok(if ty == node_type::EVENT_RECORD {
        Kind::EventRecord(e as usize)
    } else {
        Kind::EventWait(e as usize)
    })
}

/// The add, get and set calls of one kind of event node.
macro_rules! event_node_calls {
    ($($add:ident, $get:ident, $set:ident, $ty:expr;)*) => {$(
        /// # Safety
        /// `ph` is null or writable; `deps` is null or holds `n` node handles.
        #[no_mangle]
        pub unsafe extern "C" fn $add(
            ph: *mut *mut GraphNode,
            g: CUgraph,
            deps: *const *mut GraphNode,
            n: usize,
            e: CUevent,
        ) -> CUresult {
            entry(|| {
                let kind = event_kind($ty, e)?;
                // SAFETY: forwarded contract.
                unsafe { add(ph, g, deps, n, kind) }
            })
        }

        /// # Safety
        /// `pe` is null or writable.
        #[no_mangle]
        pub unsafe extern "C" fn $get(node: *mut GraphNode, pe: *mut CUevent) -> CUresult {
            entry(|| {
                match node_kind(node)? {
                    k if k.type_code() != $ty => Err(CUDA_ERROR_INVALID_VALUE),
                    // SAFETY: the caller's pointer.
                    Kind::EventRecord(e) | Kind::EventWait(e) => unsafe { out(pe, e as CUevent) },
                    _ => Err(CUDA_ERROR_INVALID_VALUE),
                }
            })
        }

        #[no_mangle]
        pub extern "C" fn $set(node: *mut GraphNode, e: CUevent) -> CUresult {
            entry(|| set_node(node, event_kind($ty, e)?))
        }
    )*};
}

event_node_calls! {
    cuGraphAddEventRecordNode, cuGraphEventRecordNodeGetEvent, cuGraphEventRecordNodeSetEvent,
        node_type::EVENT_RECORD;
    cuGraphAddEventWaitNode, cuGraphEventWaitNodeGetEvent, cuGraphEventWaitNodeSetEvent,
        node_type::WAIT_EVENT;
}

/// # Safety
/// As cuGraphAddChildGraphNode.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    child: CUgraph,
) -> CUresult {
    entry(|| {
        // The child is copied, as natively; a captured child is not supported yet.
        let kind = child_kind(child)?;
        // SAFETY: forwarded contract.
        unsafe { add(ph, g, deps, n, kind) }
    })
}

/// CUgraphNodeParams: the node type, then (at byte 16) the union of every kind's
/// parameters, 232 bytes, then 8 reserved.
#[repr(C)]
pub struct NodeParams {
    pub ty: c_uint,
    pub reserved0: [i32; 3],
    pub params: [u64; 29],
    pub reserved2: i64,
}

// The layouts cuda.h gives these structures.
const _: () = assert!(std::mem::size_of::<NodeParams>() == 256);
const _: () = assert!(std::mem::size_of::<KernelNodeParamsV2>() == 72);
const _: () = assert!(std::mem::size_of::<MemsetNodeParams>() == 40);
const _: () = assert!(std::mem::size_of::<Memcpy3D>() == 200);

/// CUDA_MEMCPY_NODE_PARAMS: flags, reserved, the copy's context, the copy.
#[repr(C)]
struct MemcpyNodeParams {
    flags: i32,
    reserved: i32,
    ctx: *mut c_void,
    copy: Memcpy3D,
}

/// The node a generic CUgraphNodeParams describes, for the kinds built graphs hold.
///
/// # Safety
/// `p` is a valid CUgraphNodeParams whose union member matches its type.
unsafe fn kind_from(g: CUgraph, p: &mut NodeParams) -> Result<Kind, CUresult> {
    let u = p.params.as_mut_ptr() as *mut u8;
    // SAFETY: each arm reads the union member its type names, at the union's start.
    unsafe {
        match p.ty {
            node_type::KERNEL => {
                let k = &*(u as *const KernelNodeParamsV2);
                kernel_kind_v2(k)
            }
            node_type::MEMSET => {
                let m = &*(u as *const MemsetNodeParams);
                memset_kind(m)
            }
            node_type::MEMCPY => copy_kind(&(*(u as *const MemcpyNodeParams)).copy),
            node_type::EMPTY => Ok(Kind::Empty),
            node_type::HOST => host_kind(&*(u as *const HostNodeParams)),
            node_type::EVENT_RECORD | node_type::WAIT_EVENT => {
                let e = *(u as *const CUevent);
                event_kind(p.ty, e)
            }
            node_type::GRAPH => child_kind(*(u as *const CUgraph)),
            node_type::MEM_ALLOC => mem_alloc_kind(g, &mut *(u as *mut MemAllocNodeParams)),
            node_type::MEM_FREE => mem_free_kind(*(u as *const u64)),
            node_type::CONDITIONAL => cond_kind(g, &mut *(u as *mut CondParams)),
            _ => Err(crate::unsupported::unsupported(
                "cuGraphAddNode of this node type (external semaphore, batch memory op)",
            )),
        }
    }
}

/// # Safety
/// As cuGraphAddNode.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    p: *mut NodeParams,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| unsafe { add_generic(ph, g, deps, n, p) })
}

/// cuGraphAddNode's work: a node of the kind the parameters name; a conditional node may
/// also go into a capture going on.
///
/// # Safety
/// As cuGraphAddNode.
unsafe fn add_generic(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    n: usize,
    p: *mut NodeParams,
) -> Result<(), CUresult> {
    // SAFETY: the caller's parameters, per the contract.
    let params = unsafe { p.as_mut() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if params.ty == node_type::CONDITIONAL && !is_built(g) {
        graph_ref(g)?;
        // SAFETY: the union's start holds the conditional parameters.
        let c = unsafe { &mut *(params.params.as_mut_ptr() as *mut CondParams) };
        return add_to_capture(ph, g, c);
    }
    // SAFETY: the caller's parameters, per the contract.
    let kind = unsafe { kind_from(g, params) }?;
    // SAFETY: forwarded contract.
    unsafe { add(ph, g, deps, n, kind) }
}

/// The kind generic parameters describe for node `node`, for the generic set calls:
/// memory and conditional nodes cannot be given new parameters, as natively; child-graph nodes take theirs
/// through the child calls here (cuGraphExecChildGraphNodeSetParams).
///
/// # Safety
/// `p` is null or a valid CUgraphNodeParams whose union member matches its type.
pub(crate) unsafe fn settable_kind(
    node: *mut GraphNode,
    p: *mut NodeParams,
) -> Result<Kind, CUresult> {
    // SAFETY: the caller's parameters.
    let p = unsafe { p.as_mut() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if matches!(
        p.ty,
        node_type::MEM_ALLOC | node_type::MEM_FREE | node_type::CONDITIONAL
    ) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if p.ty == node_type::GRAPH {
        return Err(crate::unsupported::unsupported(
            "the generic SetParams calls for child-graph nodes",
        ));
    }
    let (g, _) = locate(node).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    // SAFETY: forwarded contract.
    unsafe { kind_from(g as CUgraph, p) }
}

/// # Safety
/// As cuGraphNodeSetParams.
#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeSetParams(
    node: *mut GraphNode,
    p: *mut NodeParams,
) -> CUresult {
    // SAFETY: forwarded contract.
    entry(|| set_node(node, unsafe { settable_kind(node, p) }?))
}

/// # Safety
/// As cuGraphAddNode_v2.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    ph: *mut *mut GraphNode,
    g: CUgraph,
    deps: *const *mut GraphNode,
    data: *const u64,
    n: usize,
    p: *mut NodeParams,
) -> CUresult {
    entry(|| {
        // SAFETY: forwarded contract.
        unsafe { default_edges(data, n) }?;
        // SAFETY: forwarded contract.
        unsafe { add_generic(ph, g, deps, n, p) }
    })
}

/// CUDA_HOST_NODE_PARAMS: the function and its argument (v2 adds a sync mode after them,
/// which only the driver's own host-node scheduling reads).
#[repr(C)]
pub struct HostNodeParams {
    pub f: Option<HostFn>,
    pub data: *mut c_void,
}

pub(crate) fn host_kind(p: &HostNodeParams) -> Result<Kind, CUresult> {
    Ok(Kind::Host(
        p.f.ok_or(CUDA_ERROR_INVALID_VALUE)?,
        p.data as usize,
    ))
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphHostNodeGetParams(
    node: *mut GraphNode,
    p: *mut HostNodeParams,
) -> CUresult {
    entry(|| match node_kind(node)? {
        Kind::Host(f, data) => {
            let hp = HostNodeParams {
                f: Some(f),
                data: data as *mut c_void,
            };
            // SAFETY: the caller's pointer.
            unsafe { out(p, hp) }
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// A memcpy node. Its host sides are read or written when it runs, on every replay: a
/// pageable one (host to host too) is staged by host nodes (api/staged.rs).
pub(crate) fn copy_kind(p: &Memcpy3D) -> Result<Kind, CUresult> {
    Ok(Kind::Memcpy(CopyNode(*p)))
}

/// The add and set calls of the kinds whose parameters come as one structure (memset and
/// memcpy also name a context, which is the graph's device's here). A kernel's arguments
/// are packed as the call is made, as the driver copies them.
macro_rules! add_node_calls {
    ($($name:ident($params:ty) => $kind:ident $(, $ctx:ident)?;)*) => {$(
        /// # Safety
        /// `ph` is null or writable; `deps` is null or holds `n` node handles; `p` is null
        /// or valid.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            ph: *mut *mut GraphNode,
            g: CUgraph,
            deps: *const *mut GraphNode,
            n: usize,
            p: *const $params,
            $($ctx: *mut c_void,)?
        ) -> CUresult {
            entry(|| {
                // SAFETY: the caller's parameters.
                #[allow(unused_unsafe)]
                let kind = unsafe { $kind(p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?) }?;
                // SAFETY: forwarded contract.
                unsafe { add(ph, g, deps, n, kind) }
            })
        }
    )*};
}

macro_rules! set_node_calls {
    ($($name:ident($params:ty) => $kind:ident;)*) => {$(
        /// # Safety
        /// `p` is null or valid.
        #[no_mangle]
        pub unsafe extern "C" fn $name(node: *mut GraphNode, p: *const $params) -> CUresult {
            entry(|| {
                // SAFETY: the caller's parameters.
                #[allow(unused_unsafe)]
                let kind = unsafe { $kind(p.as_ref().ok_or(CUDA_ERROR_INVALID_VALUE)?) }?;
                set_node(node, kind)
            })
        }
    )*};
}

set_node_calls! {
    cuGraphKernelNodeSetParams(KernelNodeParams) => kernel_kind_v1;
    cuGraphKernelNodeSetParams_v2(KernelNodeParamsV2) => kernel_kind_v2;
    cuGraphMemsetNodeSetParams(MemsetNodeParams) => memset_kind;
    cuGraphMemcpyNodeSetParams(Memcpy3D) => copy_kind;
    cuGraphHostNodeSetParams(HostNodeParams) => host_kind;
}

add_node_calls! {
    cuGraphAddKernelNode(KernelNodeParams) => kernel_kind_v1;
    cuGraphAddKernelNode_v2(KernelNodeParamsV2) => kernel_kind_v2;
    cuGraphAddMemsetNode(MemsetNodeParams) => memset_kind, _ctx;
    cuGraphAddMemcpyNode(Memcpy3D) => copy_kind, _ctx;
    cuGraphAddHostNode(HostNodeParams) => host_kind;
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphMemsetNodeGetParams(
    node: *mut GraphNode,
    p: *mut MemsetNodeParams,
) -> CUresult {
    entry(|| match node_kind(node)? {
        // SAFETY: the caller's pointer.
        Kind::Memset(m) => unsafe { out(p, m) },
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphMemcpyNodeGetParams(
    node: *mut GraphNode,
    p: *mut Memcpy3D,
) -> CUresult {
    entry(|| match node_kind(node)? {
        // SAFETY: the caller's pointer.
        Kind::Memcpy(c) => unsafe { out(p, c.0) },
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// The graph a child node owns: changes to it are the node's.
///
/// # Safety
/// `p` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuGraphChildGraphNodeGetGraph(
    node: *mut GraphNode,
    p: *mut CUgraph,
) -> CUresult {
    entry(|| match node_kind(node)? {
        // SAFETY: the caller's pointer.
        Kind::Child(c) => unsafe { out(p, c as CUgraph) },
        // SAFETY: the caller's pointer.
        Kind::ServerChild(c) => unsafe { out(p, c.handle as CUgraph) },
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    })
}
