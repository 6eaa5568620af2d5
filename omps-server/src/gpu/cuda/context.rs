//! [`CudaGpu`]'s context family: the device snapshot, SM confinement, the reset after a
//! fault, peer access and printf flushing.

use super::device::{ck, device_of, peer_pairs, raw_fn, CudaGpu};
use crate::gpu::{code, CuError, Gpu, GpuResult};
use cudarc::driver::sys as cu;
use omps_ring::segment::{DeviceSnapshot, MAX_ATTRIBUTES, TPC_MAP_MAX};
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;

/// Export table 1734dc26 (cluster support): [4] allocates and fills the current context's
/// TPC-to-vGPC and TPC-in-GPC byte maps, [13] frees them. cuBLASLt reads them to pick
/// kernels, so a client must get the driver's bytes. The driver does not say how long the
/// maps are; they come from its malloc heap, so the usable size of each allocation bounds
/// what may be read.
pub(super) fn read_tpc_maps(s: &mut DeviceSnapshot) {
    const CLUSTER_TABLE: [u8; 16] = [
        0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b,
        0xca,
    ];
    type GetMaps = unsafe extern "C" fn(*mut *mut u8, *mut *mut u8) -> c_int;
    type FreeMaps = unsafe extern "C" fn(*mut u8, *mut u8) -> c_int;
    let mut table: *const c_void = std::ptr::null();
    let id = cu::CUuuid {
        bytes: CLUSTER_TABLE.map(|b| b as c_char),
    };
    // SAFETY: valid out-pointer and id; the driver returns a table or an error.
    if unsafe { cu::cuGetExportTable(&mut table, &id) } != cu::CUresult::CUDA_SUCCESS
        || table.is_null()
    {
        return;
    }
    let slots = table as *const usize;
    // SAFETY: slot 0 is the table's size in bytes; entries 4 and 13 exist when it covers
    // 14 slots, and are functions of the signatures above (checked on driver 580 by
    // scripts/probe/darktrace.c).
    unsafe {
        if *slots < 14 * 8 {
            return;
        }
        let get: GetMaps = std::mem::transmute(*slots.add(4));
        let free: FreeMaps = std::mem::transmute(*slots.add(13));
        let (mut vgpc, mut mtpc) = (std::ptr::null_mut(), std::ptr::null_mut());
        if get(&mut vgpc, &mut mtpc) != 0 || vgpc.is_null() || mtpc.is_null() {
            return;
        }
        for (i, (p, out)) in [(vgpc, &mut s.tpc_vgpc), (mtpc, &mut s.tpc_mtpc)]
            .into_iter()
            .enumerate()
        {
            let n = libc::malloc_usable_size(p as *mut c_void).min(TPC_MAP_MAX);
            std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), n);
            s.tpc_map_len[i] = n as u32;
        }
        free(vgpc, mtpc);
    }
}

pub(super) fn snapshot(gpu: &CudaGpu) -> DeviceSnapshot {
    let mut s: DeviceSnapshot = bytemuck::Zeroable::zeroed();
    // SAFETY: valid buffers and lengths; dev is a valid device.
    unsafe {
        cu::cuDeviceGetName(s.name.as_mut_ptr() as *mut c_char, 255, gpu.dev);
        let mut uuid: cu::CUuuid = std::mem::zeroed();
        if cu::cuDeviceGetUuid_v2(&mut uuid, gpu.dev) == cu::CUresult::CUDA_SUCCESS {
            for (d, b) in s.uuid.iter_mut().zip(uuid.bytes) {
                *d = b as u8;
            }
        }
        cu::cuDeviceGetPCIBusId(s.pci_bus_id.as_mut_ptr() as *mut c_char, 31, gpu.dev);
        gpu.bind();
        let (mut least, mut greatest) = (0, 0);
        if cu::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) == cu::CUresult::CUDA_SUCCESS
        {
            s.stream_priority = [least, greatest];
        }
        let mut total = 0usize;
        cu::cuDeviceTotalMem_v2(&mut total, gpu.dev);
        s.total_mem = total as u64;
        for a in 1..MAX_ATTRIBUTES {
            let mut v = 0;
            if (gpu.attr_fn)(&mut v, a as c_int, gpu.dev) == 0 {
                s.attributes[a] = v;
                s.attr_valid[a] = 1;
            }
        }
    }
    read_tpc_maps(&mut s);
    s
}

pub(super) fn quiet(gpu: &CudaGpu) -> bool {
    gpu.bind();
    let busy = |s: cu::CUstream| {
        if s.is_null() {
            return false;
        }
        // A capturing stream is never queried (a query would invalidate a client's
        // capture): it counts as busy.
        let mut status = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a stream of this context; valid out-pointer, the rest null. Asking
        // for capture info is legal during a capture.
        let r = unsafe {
            cu::cuStreamGetCaptureInfo_v3(
                s,
                &mut status,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if r != cu::CUresult::CUDA_SUCCESS
            || status != cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        {
            return true;
        }
        // SAFETY: a stream of this context, not capturing.
        unsafe { cu::cuStreamQuery(s) != cu::CUresult::CUDA_SUCCESS }
    };
    !gpu.streams
        .iter()
        .map(|c| c.load(Ordering::Acquire))
        .chain([gpu.release_stream.load(Ordering::Acquire)])
        .any(busy)
}

pub(super) fn confine(
    gpu: &CudaGpu,
    slot: usize,
    set: &crate::sched::confine::SmSet,
) -> GpuResult<u32> {
    gpu.bind();
    // The slot's old streams belong to the old green context: new ones at next use.
    let slots = gpu.layout.class_in(Some(slot), 0).start
        ..gpu
            .layout
            .class_in(Some(slot), crate::sched::placement::CLASSES - 1)
            .end;
    for cell in gpu.streams.get(slots).unwrap_or(&[]) {
        let old = cell.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: a stream of this slot; whatever it still runs completes first.
            unsafe { cu::cuStreamDestroy_v2(old) };
        }
    }
    let r = gpu.green.create(slot, set);
    gpu.rebind();
    r
}

pub(super) fn reset(gpu: &CudaGpu) -> GpuResult<()> {
    let step = |what: &'static str| {
        move |e: CuError| {
            tracing::error!("context reset: {what} failed: CUDA error {}", e.0);
            e
        }
    };
    // SAFETY: called by the worker once no client of this GPU is left; the reset
    // destroys everything the context held, and the primary context stays current.
    ck(unsafe { cu::cuDevicePrimaryCtxReset_v2(gpu.dev) })
        .map_err(step("cuDevicePrimaryCtxReset"))?;
    let mut ctx = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the reference from open() was dropped by the reset.
    ck(unsafe { cu::cuDevicePrimaryCtxRetain(&mut ctx, gpu.dev) })
        .map_err(step("cuDevicePrimaryCtxRetain"))?;
    if ctx != gpu.ctx {
        tracing::error!("the primary context changed handle across a reset");
        return Err(CuError(code::UNKNOWN));
    }
    // SAFETY: ctx is retained; make it current here again.
    ck(unsafe { cu::cuCtxSetCurrent(ctx) }).map_err(step("cuCtxSetCurrent"))?;
    // Graphs kept for launch runs went with the context.
    gpu.runs.forget();
    // The confined streams went with their green contexts' work; made again at use.
    for cell in &gpu.streams[gpu.layout.base()..] {
        cell.store(std::ptr::null_mut(), Ordering::Release);
    }
    gpu.green.remake();
    gpu.rebind();
    gpu.create_streams().map_err(step("creating the streams"))?;
    // The old context's peer access went with it, both ways: every pair with this GPU
    // at either end is enabled again.
    let pairs = peer_pairs().clone();
    for (from, to) in pairs
        .into_iter()
        .filter(|&(f, t)| f == gpu.ordinal || t == gpu.ordinal)
    {
        let again = if from == gpu.ordinal {
            device_of(to).and_then(|d| CudaGpu::peer_access(gpu.ctx, d))
        } else {
            device_of(from).and_then(|d| {
                let mut pctx = std::ptr::null_mut();
                // SAFETY: valid out-pointer; the peer's CudaGpu keeps its context retained.
                ck(unsafe { cu::cuDevicePrimaryCtxRetain(&mut pctx, d) })?;
                let r = CudaGpu::peer_access(pctx, gpu.dev);
                // SAFETY: the reference taken above.
                unsafe { cu::cuDevicePrimaryCtxRelease_v2(d) };
                r
            })
        };
        if let Err(e) = again {
            tracing::warn!(
                from,
                to,
                "peer access after a reset failed: CUDA error {}",
                e.0
            );
        }
    }
    gpu.rebind();
    Ok(())
}

pub(super) fn reaches(gpu: &CudaGpu, peer: usize) -> bool {
    peer_pairs().contains(&(gpu.ordinal, peer))
}

pub(super) fn peer_attributes(
    gpu: &CudaGpu,
    peer: usize,
) -> [i32; omps_ring::segment::P2P_ATTRIBUTES] {
    let mut out = [0; omps_ring::segment::P2P_ATTRIBUTES];
    let Some(pdev) = gpu.peer_device(peer) else {
        return out;
    };
    type RawP2pFn = unsafe extern "C" fn(*mut c_int, c_int, c_int, c_int) -> c_int;
    if let Ok(f) = raw_fn::<RawP2pFn>(b"cuDeviceGetP2PAttribute\0") {
        for (a, v) in out
            .iter_mut()
            .enumerate()
            .take(omps_ring::segment::P2P_DEFINED)
        {
            let mut x = 0;
            // SAFETY: cuDeviceGetP2PAttribute's C signature; valid out-pointer.
            if unsafe { f(&mut x, a as c_int + 1, gpu.dev, pdev) } == 0 {
                *v = x;
            }
        }
    }
    out
}

pub(super) fn enable_peer(gpu: &CudaGpu, peer: usize) -> GpuResult<()> {
    // Enabling maps every allocation of the context on the peer and may take a while:
    // under its own lock, so that `reaches` on other lanes never waits for it.
    static ENABLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ENABLING.lock().unwrap_or_else(|e| e.into_inner());
    if gpu.reaches(peer) {
        return Ok(());
    }
    let pdev = gpu
        .peer_device(peer)
        .ok_or(CuError(code::PEER_ACCESS_UNSUPPORTED))?;
    let enabled = CudaGpu::peer_access(gpu.ctx, pdev);
    gpu.rebind();
    if let Err(e) = enabled {
        tracing::warn!(
            gpu = gpu.ordinal,
            peer,
            "enabling peer access failed: CUDA error {}",
            e.0
        );
        return Err(e);
    }
    tracing::info!(
        gpu = gpu.ordinal,
        peer,
        "direct access to a peer GPU enabled"
    );
    peer_pairs().push((gpu.ordinal, peer));
    Ok(())
}

pub(super) fn flush_printf(gpu: &CudaGpu) -> GpuResult<()> {
    gpu.bind();
    let st = gpu.printf_stream.load(Ordering::Acquire);
    // SAFETY: a live stream of this context with no work, so this returns at once
    // (measured 20-90 us on an H100, also with other streams busy).
    ck(unsafe { cu::cuStreamSynchronize(st) })
}
