//! [`CudaGpu`]'s graph family: stream capture (with conditional and child nodes), graph
//! building, instantiation, launch, update and the inspection the session does of them.

use super::device::{ck, raw_fn, CudaGpu};
use crate::gpu::{code, CuError, Gpu, GpuResult};
use cudarc::driver::sys as cu;
use std::ffi::c_int;

/// CUDA_MEMCPY3D as the driver writes it: cudarc's has Rust enums for the memory types,
/// which have no zero and cannot hold a value a newer driver might write, so neither a
/// zeroed one nor one the driver filled is safe to have (zeroing it panics).
#[repr(C)]
#[derive(Default)]
#[allow(non_snake_case)]
pub(super) struct Memcpy3dRaw {
    srcXInBytes: usize,
    srcY: usize,
    srcZ: usize,
    srcLOD: usize,
    pub(super) srcMemoryType: u32,
    srcHost: usize,
    srcDevice: u64,
    srcArray: usize,
    reserved0: usize,
    srcPitch: usize,
    srcHeight: usize,
    dstXInBytes: usize,
    dstY: usize,
    dstZ: usize,
    dstLOD: usize,
    pub(super) dstMemoryType: u32,
    dstHost: usize,
    dstDevice: u64,
    dstArray: usize,
    reserved1: usize,
    dstPitch: usize,
    dstHeight: usize,
    pub(super) WidthInBytes: usize,
    pub(super) Height: usize,
    pub(super) Depth: usize,
}

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<Memcpy3dRaw>() == size_of::<cu::CUDA_MEMCPY3D>());
    assert!(align_of::<Memcpy3dRaw>() == align_of::<cu::CUDA_MEMCPY3D>());
    assert!(offset_of!(Memcpy3dRaw, srcHost) == offset_of!(cu::CUDA_MEMCPY3D, srcHost));
    assert!(offset_of!(Memcpy3dRaw, dstMemoryType) == offset_of!(cu::CUDA_MEMCPY3D, dstMemoryType));
    assert!(offset_of!(Memcpy3dRaw, Depth) == offset_of!(cu::CUDA_MEMCPY3D, Depth));
};

pub(super) fn capture_begin(gpu: &CudaGpu, s: usize) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: a work stream of this context.
    ck(unsafe {
        cu::cuStreamBeginCapture_v2(st, cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
    })
}

pub(super) fn capture_end(gpu: &CudaGpu, s: usize) -> GpuResult<u64> {
    gpu.bind();
    let st = gpu.stream(s)?;
    let mut g = std::ptr::null_mut();
    // SAFETY: a work stream of this context; valid out-pointer.
    ck(unsafe { cu::cuStreamEndCapture(st, &mut g) })?;
    Ok(g as u64)
}

pub(super) fn capture_status(gpu: &CudaGpu, s: usize) -> GpuResult<(u32, u64)> {
    gpu.bind();
    let st = gpu.stream(s)?;
    let mut status = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: u64 = 0;
    // SAFETY: a work stream of this context; valid out-pointers, the rest null.
    ck(unsafe {
        cu::cuStreamGetCaptureInfo_v3(
            st,
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    })?;
    Ok((status as u32, id))
}

pub(super) fn capture_graph(gpu: &CudaGpu, s: usize) -> GpuResult<u64> {
    gpu.capture_point(s).map(|(_, g, _, _)| g as u64)
}

pub(super) fn capture_invalidate(gpu: &CudaGpu, s: usize) {
    gpu.bind();
    if let Ok(st) = gpu.stream(s) {
        // SAFETY: a work stream of this context. Querying a capturing stream is illegal
        // during capture: the driver answers with an error and invalidates it.
        let _ = unsafe { cu::cuStreamQuery(st) };
    }
}

pub(super) fn graph_instantiate(gpu: &CudaGpu, graph: u64, flags: u64) -> GpuResult<u64> {
    gpu.bind();
    let mut e = std::ptr::null_mut();
    // SAFETY: the session checked `graph` is one of this client's graphs.
    ck(unsafe { cu::cuGraphInstantiateWithFlags(&mut e, graph as cu::CUgraph, flags) })?;
    Ok(e as u64)
}

pub(super) fn graph_launch(gpu: &CudaGpu, exec: u64, s: usize) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: the session checked `exec` is one of this client's executable graphs.
    ck(unsafe { cu::cuGraphLaunch(exec as cu::CUgraphExec, st) })
}

pub(super) fn graph_upload(gpu: &CudaGpu, exec: u64, s: usize) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: as graph_launch.
    ck(unsafe { cu::cuGraphUpload(exec as cu::CUgraphExec, st) })
}

pub(super) fn graph_destroy(gpu: &CudaGpu, graph: u64) -> GpuResult<()> {
    gpu.bind();
    // SAFETY: one of a client's graphs, given up by it.
    ck(unsafe { cu::cuGraphDestroy(graph as cu::CUgraph) })
}

pub(super) fn graph_nodes(gpu: &CudaGpu, graph: u64) -> GpuResult<Vec<u64>> {
    gpu.bind();
    let g = graph as cu::CUgraph;
    let mut n = 0usize;
    // SAFETY: one of the client's graphs; a null array asks for the count.
    ck(unsafe { cu::cuGraphGetNodes(g, std::ptr::null_mut(), &mut n) })?;
    if n == 0 {
        // The driver refuses a non-null array of no room: an empty capture (PyTorch's
        // cudagraph trees begin with one) has no nodes to ask for.
        return Ok(Vec::new());
    }
    let mut nodes = vec![std::ptr::null_mut(); n];
    // SAFETY: room for n nodes.
    ck(unsafe { cu::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut n) })?;
    nodes.truncate(n);
    Ok(nodes.into_iter().map(|p| p as u64).collect())
}

/// A memcpy node's parameters, as the driver gives them.
pub(super) fn memcpy_node_params(n: cu::CUgraphNode) -> GpuResult<Memcpy3dRaw> {
    let mut p = Memcpy3dRaw::default();
    // SAFETY: a memcpy node of a graph the server holds; Memcpy3dRaw has CUDA_MEMCPY3D's
    // layout (checked below it) with plain integers where cudarc has enums, so any value
    // the driver writes is valid.
    ck(unsafe {
        cu::cuGraphMemcpyNodeGetParams(n, (&mut p as *mut Memcpy3dRaw).cast::<cu::CUDA_MEMCPY3D>())
    })?;
    Ok(p)
}

pub(super) fn graph_memory_ranges(gpu: &CudaGpu, graph: u64) -> GpuResult<Vec<(u64, u64)>> {
    const MEMCPY: u32 = 1;
    const MEMSET: u32 = 2;
    const CHILD_GRAPH: u32 = 4;
    const CONDITIONAL: u32 = 13;
    const MEM_ALLOC: u32 = 10;
    // The bytes a pitched 3D region spans from its first: whole rows and slices but
    // the last, then the last row's width.
    fn span(width: usize, height: usize, depth: usize, pitch: usize, rows: usize) -> u64 {
        let slices = (depth.saturating_sub(1) as u64)
            .saturating_mul(rows as u64)
            .saturating_mul(pitch as u64);
        slices
            .saturating_add((height.saturating_sub(1) as u64).saturating_mul(pitch as u64))
            .saturating_add(width as u64)
    }
    // CU_MEMORYTYPE_DEVICE and CU_MEMORYTYPE_UNIFIED name device addresses;
    // CU_MEMORYTYPE_HOST a host pointer: the client's page-locked memory, mapped at the
    // same address here, which a replay reaches as well (held past its unregistration
    // while a graph uses it, as device memory past its free).
    let device_side = |t: u32| t == 2 || t == 4;
    const HOST: u32 = 1;
    let mut out = Vec::new();
    // Memory the graph allocates itself (its allocation nodes): the graph's, not a
    // client's, and reused only once the graph frees it.
    let mut own: Vec<(u64, u64)> = Vec::new();
    let mut graphs = vec![graph];
    while let Some(g) = graphs.pop() {
        for node in gpu.graph_nodes(g)? {
            let n = node as cu::CUgraphNode;
            match gpu.graph_node_type(node)? {
                MEMSET => {
                    // SAFETY: a memset node of one of the client's graphs; a
                    // zeroed parameter block for the driver to fill.
                    let p = unsafe {
                        let mut p: cu::CUDA_MEMSET_NODE_PARAMS = std::mem::zeroed();
                        ck(cu::cuGraphMemsetNodeGetParams(n, &mut p))?;
                        p
                    };
                    let width = p.width.saturating_mul(p.elementSize as usize);
                    out.push((p.dst, span(width, p.height, 1, p.pitch, p.height)));
                }
                MEMCPY => {
                    let p = memcpy_node_params(n)?;
                    // Each side in device or page-locked memory: where its region
                    // starts, and its span with its own pitch and rows per slice.
                    let side_base = |t: u32, host: usize, dev: u64| match t {
                        HOST => Some(host as u64),
                        t if device_side(t) => Some(dev),
                        _ => None,
                    };
                    let sides = [
                        (
                            side_base(p.srcMemoryType, p.srcHost, p.srcDevice),
                            [p.srcXInBytes, p.srcY, p.srcZ],
                            p.srcPitch,
                            p.srcHeight,
                        ),
                        (
                            side_base(p.dstMemoryType, p.dstHost, p.dstDevice),
                            [p.dstXInBytes, p.dstY, p.dstZ],
                            p.dstPitch,
                            p.dstHeight,
                        ),
                    ];
                    for (base, [x, y, z], pitch, height) in sides {
                        if let Some(base) = base {
                            let pitch = pitch.max(p.WidthInBytes);
                            // Wrapping: the driver's numbers, whatever a client made them.
                            let at = base.wrapping_add(x as u64).wrapping_add(
                                (y as u64)
                                    .wrapping_add((z as u64).wrapping_mul(height as u64))
                                    .wrapping_mul(pitch as u64),
                            );
                            let rows = height.max(p.Height);
                            out.push((at, span(p.WidthInBytes, p.Height, p.Depth, pitch, rows)));
                        }
                    }
                }
                CHILD_GRAPH => {
                    let mut child = std::ptr::null_mut();
                    // SAFETY: a child-graph node; the graph stays its node's.
                    ck(unsafe { cu::cuGraphChildGraphNodeGetGraph(n, &mut child) })?;
                    graphs.push(child as u64);
                }
                MEM_ALLOC => {
                    // SAFETY: a memory-allocation node; a zeroed block for the driver.
                    let p = unsafe {
                        let mut p: cu::CUDA_MEM_ALLOC_NODE_PARAMS = std::mem::zeroed();
                        ck(cu::cuGraphMemAllocNodeGetParams(n, &mut p))?;
                        p
                    };
                    own.push((p.dptr, p.bytesize as u64));
                }
                CONDITIONAL => {
                    // cuGraphNodeGetParams is newer than CUDA 13.0's headers: looked
                    // up, and without it a conditional's bodies are not read.
                    type GetParams =
                        unsafe extern "C" fn(cu::CUgraphNode, *mut cu::CUgraphNodeParams) -> c_int;
                    let Ok(get) = raw_fn::<GetParams>(b"cuGraphNodeGetParams\0") else {
                        continue;
                    };
                    // SAFETY: a conditional node; all-zero is a valid parameter block
                    // for the driver to fill; its body graphs live as long as the node.
                    unsafe {
                        let mut p: cu::CUgraphNodeParams = std::mem::zeroed();
                        if get(n, &mut p) != 0 {
                            continue;
                        }
                        let c = p.__bindgen_anon_1.conditional;
                        if !c.phGraph_out.is_null() {
                            graphs
                                .extend((0..c.size as usize).map(|i| *c.phGraph_out.add(i) as u64));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    out.retain(|&(a, n)| {
        !own.iter()
            .any(|&(o, m)| a >= o && a.saturating_add(n) <= o.saturating_add(m))
    });
    Ok(out)
}

pub(super) fn graph_node_type(gpu: &CudaGpu, node: u64) -> GpuResult<u32> {
    gpu.bind();
    // A plain u32 where cudarc has an enum: a node type newer than its headers is a
    // number the caller does not know, not an invalid enum.
    let mut t: u32 = 0;
    // SAFETY: a node of one of the client's graphs (graph_nodes gave it);
    // CUgraphNodeType is a u32-sized C enum.
    ck(unsafe {
        cu::cuGraphNodeGetType(
            node as cu::CUgraphNode,
            (&mut t as *mut u32).cast::<cu::CUgraphNodeType>(),
        )
    })?;
    Ok(t)
}

pub(super) fn graph_create(gpu: &CudaGpu) -> GpuResult<u64> {
    gpu.bind();
    let mut g = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; flags 0.
    ck(unsafe { cu::cuGraphCreate(&mut g, 0) })?;
    Ok(g as u64)
}

pub(super) fn cond_handle(gpu: &CudaGpu, graph: u64, value: u32, flags: u32) -> GpuResult<u64> {
    gpu.bind();
    let mut h: cu::CUgraphConditionalHandle = 0;
    // SAFETY: one of the client's graphs; the server's context; a valid out-pointer.
    ck(unsafe {
        cu::cuGraphConditionalHandleCreate(&mut h, graph as cu::CUgraph, gpu.ctx, value, flags)
    })?;
    Ok(h)
}

pub(super) fn capture_conditional(
    gpu: &CudaGpu,
    s: usize,
    handle: u64,
    kind: u32,
    size: u32,
    graph_ok: &dyn Fn(u64) -> bool,
) -> GpuResult<Vec<u64>> {
    let kind = match kind {
        0 => cu::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
        1 => cu::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE,
        2 => cu::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_SWITCH,
        _ => return Err(CuError(code::INVALID_VALUE)),
    };
    // SAFETY: all-zero is a valid CUgraphNodeParams (a plain C struct).
    let mut p: cu::CUgraphNodeParams = unsafe { std::mem::zeroed() };
    p.type_ = cu::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p.__bindgen_anon_1.conditional = cu::CUDA_CONDITIONAL_NODE_PARAMS {
        handle,
        type_: kind,
        size,
        phGraph_out: std::ptr::null_mut(),
        ctx: gpu.ctx,
    };
    gpu.add_at_capture(s, graph_ok, |node, graph, deps, n| {
        // SAFETY: the capture's graph and its dependencies as the driver gave them;
        // valid params and out-pointer.
        unsafe { cu::cuGraphAddNode_v2(node, graph, deps, std::ptr::null(), n, &mut p) }
    })?;
    // SAFETY: the driver filled phGraph_out with `size` body graphs, which live as
    // long as the node.
    let bodies = unsafe {
        let out = p.__bindgen_anon_1.conditional.phGraph_out;
        (0..size as usize).map(|i| *out.add(i) as u64).collect()
    };
    Ok(bodies)
}

pub(super) fn capture_begin_to(gpu: &CudaGpu, s: usize, graph: u64) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.stream(s)?;
    // SAFETY: a work stream of this context; one of the client's graphs; no
    // dependencies.
    ck(unsafe {
        cu::cuStreamBeginCaptureToGraph(
            st,
            graph as cu::CUgraph,
            std::ptr::null(),
            std::ptr::null(),
            0,
            cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
    })
}

pub(super) fn graph_clone(gpu: &CudaGpu, graph: u64) -> GpuResult<u64> {
    gpu.bind();
    let mut g = std::ptr::null_mut();
    // SAFETY: one of the client's graphs; a valid out-pointer.
    ck(unsafe { cu::cuGraphClone(&mut g, graph as cu::CUgraph) })?;
    Ok(g as u64)
}

pub(super) fn capture_child(gpu: &CudaGpu, s: usize, child: u64) -> GpuResult<()> {
    gpu.add_at_capture(s, &|_| true, |node, graph, deps, n| {
        // SAFETY: the capture's graph and its dependencies as the driver gave them;
        // one of the client's graphs, which the driver copies into the node.
        unsafe { cu::cuGraphAddChildGraphNode(node, graph, deps, n, child as cu::CUgraph) }
    })
}

pub(super) fn graph_exec_update(gpu: &CudaGpu, exec: u64, graph: u64) -> GpuResult<()> {
    gpu.bind();
    let mut info = cu::CUgraphExecUpdateResultInfo {
        result: cu::CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
        errorNode: std::ptr::null_mut(),
        errorFromNode: std::ptr::null_mut(),
    };
    // SAFETY: the client's executable graph and graph; a valid out-pointer.
    ck(unsafe {
        cu::cuGraphExecUpdate_v2(exec as cu::CUgraphExec, graph as cu::CUgraph, &mut info)
    })
}

pub(super) fn graph_clear(gpu: &CudaGpu, graph: u64) -> GpuResult<()> {
    for n in gpu.graph_nodes(graph)? {
        // SAFETY: a node of one of the client's graphs, listed just now.
        ck(unsafe { cu::cuGraphDestroyNode(n as cu::CUgraphNode) })?;
    }
    Ok(())
}

pub(super) fn graph_exec_destroy(gpu: &CudaGpu, exec: u64) -> GpuResult<()> {
    gpu.bind();
    // SAFETY: one of a client's executable graphs, given up by it.
    ck(unsafe { cu::cuGraphExecDestroy(exec as cu::CUgraphExec) })
}
