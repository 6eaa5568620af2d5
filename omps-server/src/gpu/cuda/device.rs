//! The CUDA device as omps holds it: [`CudaGpu`]'s context, streams and driver entry
//! points, and what every family of its [`Gpu`](crate::gpu::Gpu) methods shares (binding
//! the context, a stream by index, describing a function). The families (memory.rs,
//! modules.rs, launch.rs, ...) sit above this file; mod.rs's `impl Gpu` forwards to them.

use crate::gpu::{code, func_attr, CuError, FunctionInfo, GpuResult, LoadedModule};
use cudarc::driver::sys as cu;
use std::cell::Cell;
use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

const _: () =
    assert!(std::mem::size_of::<cu::CUlaunchAttribute>() == omps_ring::wire::LAUNCH_ATTR_BYTES);

pub(super) fn ck(r: cu::CUresult) -> GpuResult<()> {
    if r == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CuError(r as i32))
    }
}

/// Whether libcuda can be loaded at all; checked before anything that would panic in cudarc.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cu::is_culib_present() }
}

pub(super) type RawAttrFn = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
pub(super) type RawFuncAttrFn = unsafe extern "C" fn(*mut c_int, c_int, cu::CUfunction) -> c_int;
pub(super) type RawFuncSetAttrFn = unsafe extern "C" fn(cu::CUfunction, c_int, c_int) -> c_int;
pub(super) type RawGetLimitFn = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
pub(super) type RawSetLimitFn = unsafe extern "C" fn(c_int, usize) -> c_int;
pub(super) type RawCacheConfigFn = unsafe extern "C" fn(cu::CUfunction, c_int) -> c_int;

/// Attribute getters taking a plain int: cudarc's enums cannot hold values this build of
/// the bindings does not know, and the snapshot asks for every attribute number.
pub(super) fn raw_fn<T: Copy>(name: &[u8]) -> GpuResult<T> {
    // SAFETY: the symbol has the C signature T describes (from cuda.h); the library stays
    // loaded for the life of the process (cudarc keeps it in a static).
    unsafe {
        cu::culib()
            .get::<T>(name)
            .map(|s| *s)
            .map_err(|_| CuError(code::NOT_FOUND))
    }
}

pub fn init() -> GpuResult<(i32, usize)> {
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        ck(cu::cuInit(0))?;
        let mut v = 0;
        ck(cu::cuDriverGetVersion(&mut v))?;
        let mut n = 0;
        ck(cu::cuDeviceGetCount(&mut n))?;
        Ok((v, n.max(0) as usize))
    }
}

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

pub struct CudaGpu {
    pub(super) ordinal: usize,
    pub(super) dev: cu::CUdevice,
    pub(super) ctx: cu::CUcontext,
    /// Work streams, as placement::Layout lays them out; atomics so that reset() can
    /// recreate them after a fault, and confined ones be made at first use.
    pub(super) streams: Vec<AtomicPtr<cu::CUstream_st>>,
    pub(super) layout: crate::sched::placement::Layout,
    /// The device's stream priority range (least, greatest).
    pub(super) priorities: (i32, i32),
    pub(super) green: crate::gpu::cuda::green::Green,
    /// Never given work: synchronizing it makes the driver write out printf output at once.
    pub(super) printf_stream: AtomicPtr<cu::CUstream_st>,
    /// Never given work either: frees are queued on it, so they wait for nothing.
    pub(super) release_stream: AtomicPtr<cu::CUstream_st>,
    /// Whether the device has the stream-ordered allocator (CU_DEVICE_ATTRIBUTE_MEMORY_
    /// POOLS_SUPPORTED), whose cuMemFreeAsync the releaser's frees use; without it (Pascal-
    /// like GPUs) they are plain cuMemFree.
    pub(super) pools: bool,
    pub(super) attr_fn: RawAttrFn,
    pub(super) func_attr_fn: RawFuncAttrFn,
    pub(super) func_set_attr_fn: RawFuncSetAttrFn,
    pub(super) get_limit_fn: RawGetLimitFn,
    pub(super) set_limit_fn: RawSetLimitFn,
    pub(super) cache_config_fn: RawCacheConfigFn,
    /// Graphs kept for runs of launches (batch.rs).
    pub(super) runs: super::run_graphs::RunGraphs,
}

// SAFETY: CUDA driver handles may be used from any thread once the context is current there
// (bind() makes it so); the struct never hands them out.
unsafe impl Send for CudaGpu {}
// SAFETY: as above; the driver API is thread safe.
unsafe impl Sync for CudaGpu {}

/// Pairs of GPUs (from, to, as ordinals) whose contexts have direct access enabled,
/// process-wide: a reset of either end enables the pair again.
pub(super) fn peer_pairs() -> std::sync::MutexGuard<'static, Vec<(usize, usize)>> {
    static PAIRS: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());
    PAIRS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The device of ordinal `o`.
pub(super) fn device_of(o: usize) -> GpuResult<cu::CUdevice> {
    let mut d = 0;
    // SAFETY: valid out-pointer; the driver checks the ordinal.
    ck(unsafe { cu::cuDeviceGet(&mut d, o as c_int) })?;
    Ok(d)
}

impl CudaGpu {
    pub fn open(ordinal: usize, layout: crate::sched::placement::Layout) -> GpuResult<CudaGpu> {
        let mut dev = 0;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid out-pointers; ordinal comes from cuDeviceGetCount.
        unsafe {
            ck(cu::cuDeviceGet(&mut dev, ordinal as c_int))?;
            ck(cu::cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
        }
        let mut g = CudaGpu {
            ordinal,
            dev,
            ctx,
            streams: Vec::new(),
            layout,
            priorities: (0, 0),
            green: crate::gpu::cuda::green::Green::open(dev, layout.confined),
            printf_stream: AtomicPtr::new(std::ptr::null_mut()),
            release_stream: AtomicPtr::new(std::ptr::null_mut()),
            pools: false,
            attr_fn: raw_fn(b"cuDeviceGetAttribute\0")?,
            func_attr_fn: raw_fn(b"cuFuncGetAttribute\0")?,
            func_set_attr_fn: raw_fn(b"cuFuncSetAttribute\0")?,
            get_limit_fn: raw_fn(b"cuCtxGetLimit\0")?,
            set_limit_fn: raw_fn(b"cuCtxSetLimit\0")?,
            cache_config_fn: raw_fn(b"cuFuncSetCacheConfig\0")?,
            runs: Default::default(),
        };
        const MEMORY_POOLS_SUPPORTED: c_int = 115;
        let mut pools = 0;
        // SAFETY: cuDeviceGetAttribute's C signature; valid out-pointer and device.
        g.pools =
            unsafe { (g.attr_fn)(&mut pools, MEMORY_POOLS_SUPPORTED, dev) } == 0 && pools != 0;
        g.streams = (0..layout.total())
            .map(|_| AtomicPtr::new(std::ptr::null_mut()))
            .collect();
        g.bind();
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: valid out-pointers; the context is current.
        ck(unsafe { cu::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) })?;
        g.priorities = (least, greatest);
        g.create_streams()?;
        Ok(g)
    }

    pub(super) fn create_streams(&self) -> GpuResult<()> {
        self.bind();
        let (least, greatest) = self.priorities;
        // Confined streams belong to green contexts and are made at first use.
        for (i, slot) in self.streams.iter().enumerate().take(self.layout.base()) {
            let mut s = std::ptr::null_mut();
            let priority = match self.layout.class_at(i) {
                Some(c) => crate::sched::placement::class_priority(c, least, greatest),
                None => least,
            };
            // SAFETY: context is current; non-blocking so the pool never syncs with stream 0.
            ck(unsafe { cu::cuStreamCreateWithPriority(&mut s, 1, priority) })?;
            slot.store(s, Ordering::Release);
        }
        let mut s = std::ptr::null_mut();
        // SAFETY: context is current; valid out-pointer.
        ck(unsafe { cu::cuStreamCreate(&mut s, 1) })?;
        self.printf_stream.store(s, Ordering::Release);
        let mut s = std::ptr::null_mut();
        // SAFETY: context is current; valid out-pointer.
        ck(unsafe { cu::cuStreamCreate(&mut s, 1) })?;
        self.release_stream.store(s, Ordering::Release);
        Ok(())
    }

    /// Makes the primary context current on this thread again, whatever the thread's
    /// cache says: green-context calls may leave another current.
    pub(super) fn rebind(&self) {
        CURRENT.with(|c| c.set(0));
        self.bind();
    }

    /// Adds a node with `add` (out-pointer, graph, dependencies, their count) where stream
    /// `s`'s capture stands, if `graph_ok` accepts the capture's graph, and moves the
    /// capture past it.
    /// Where stream `s`'s active capture stands: the stream, the capture's graph and its
    /// current dependencies (the driver's array, valid until the capture changes).
    pub(super) fn capture_point(
        &self,
        s: usize,
    ) -> GpuResult<(cu::CUstream, cu::CUgraph, *const cu::CUgraphNode, usize)> {
        self.bind();
        let st = self.stream(s)?;
        let mut status = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut graph: cu::CUgraph = std::ptr::null_mut();
        let mut deps: *const cu::CUgraphNode = std::ptr::null();
        let mut n = 0usize;
        // SAFETY: a work stream of this context; valid out-pointers.
        ck(unsafe {
            cu::cuStreamGetCaptureInfo_v3(
                st,
                &mut status,
                std::ptr::null_mut(),
                &mut graph,
                &mut deps,
                std::ptr::null_mut(),
                &mut n,
            )
        })?;
        if status != cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE || graph.is_null() {
            return Err(CuError(code::ILLEGAL_STATE));
        }
        Ok((st, graph, deps, n))
    }

    /// Adds a node with `add` (out-pointer, graph, dependencies, their count) where stream
    /// `s`'s capture stands, if `graph_ok` accepts the capture's graph, and moves the
    /// capture past it.
    pub(super) fn add_at_capture(
        &self,
        s: usize,
        graph_ok: &dyn Fn(u64) -> bool,
        add: impl FnOnce(
            *mut cu::CUgraphNode,
            cu::CUgraph,
            *const cu::CUgraphNode,
            usize,
        ) -> cu::CUresult,
    ) -> GpuResult<()> {
        let (st, graph, deps, n) = self.capture_point(s)?;
        if !graph_ok(graph as u64) {
            return Err(CuError(code::INVALID_VALUE));
        }
        let mut node: cu::CUgraphNode = std::ptr::null_mut();
        ck(add(&mut node, graph, deps, n))?;
        // SAFETY: the node just made; one dependency; 1 = CU_STREAM_SET_CAPTURE_DEPENDENCIES.
        let set = ck(unsafe {
            cu::cuStreamUpdateCaptureDependencies_v2(st, &mut node, std::ptr::null(), 1, 1)
        });
        if let Err(e) = set {
            // SAFETY: the node made above, not yet depended on.
            unsafe { cu::cuGraphDestroyNode(node) };
            return Err(e);
        }
        Ok(())
    }

    /// Enables access from context `from` (current on this thread afterwards) to the
    /// primary context of device `to`.
    pub(super) fn peer_access(from: cu::CUcontext, to: cu::CUdevice) -> GpuResult<()> {
        let mut peer = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `to` is a device of this machine. The peer's own
        // CudaGpu holds a reference too, so the release below leaves it alive.
        ck(unsafe { cu::cuDevicePrimaryCtxRetain(&mut peer, to) })?;
        // SAFETY: `from` is a retained primary context; `peer` was just retained.
        let r = unsafe {
            CURRENT.with(|c| c.set(0));
            cu::cuCtxSetCurrent(from);
            cu::cuCtxEnablePeerAccess(peer, 0)
        };
        // SAFETY: the reference taken above.
        unsafe { cu::cuDevicePrimaryCtxRelease_v2(to) };
        match r {
            cu::CUresult::CUDA_SUCCESS | cu::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(())
            }
            e => Err(CuError(e as i32)),
        }
    }

    /// The device of ordinal `peer`, if this GPU can reach it directly.
    pub(super) fn peer_device(&self, peer: usize) -> Option<cu::CUdevice> {
        let pdev = device_of(peer).ok()?;
        let mut can = 0;
        // SAFETY: valid out-pointer; both are devices of this machine.
        ck(unsafe { cu::cuDeviceCanAccessPeer(&mut can, self.dev, pdev) }).ok()?;
        (can != 0 && pdev != self.dev).then_some(pdev)
    }

    pub(super) fn bind(&self) {
        let want = self.ctx as usize;
        CURRENT.with(|c| {
            if c.get() != want {
                // SAFETY: ctx is a retained primary context.
                unsafe { cu::cuCtxSetCurrent(self.ctx) };
                c.set(want);
            }
        });
    }

    pub(super) fn stream(&self, s: usize) -> GpuResult<cu::CUstream> {
        let cell = self.streams.get(s).ok_or(CuError(code::INVALID_HANDLE))?;
        let p = cell.load(Ordering::Acquire);
        if !p.is_null() {
            return Ok(p);
        }
        // A confined stream's first use: made in its slot's green context (3 us; it waits
        // for nothing). The stream table never hands out a null (the legacy stream).
        let slot = self
            .layout
            .slot_at(s)
            .ok_or(CuError(code::INVALID_HANDLE))?;
        let c = self
            .layout
            .class_at(s)
            .unwrap_or(crate::sched::placement::NORMAL);
        let (least, greatest) = self.priorities;
        self.bind();
        let new = self.green.stream(
            slot,
            crate::sched::placement::class_priority(c, least, greatest),
        );
        self.rebind();
        let new = new?;
        match cell.compare_exchange(
            std::ptr::null_mut(),
            new,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Ok(new),
            Err(theirs) => {
                // SAFETY: our own stream, never used; another thread's won the slot.
                unsafe { cu::cuStreamDestroy_v2(new) };
                Ok(theirs)
            }
        }
    }

    pub(super) fn func_attr(&self, f: cu::CUfunction, attr: i32) -> GpuResult<i32> {
        let mut v = 0;
        // SAFETY: f is a function handle of a loaded module; valid out-pointer.
        let r = unsafe { (self.func_attr_fn)(&mut v, attr, f) };
        if r == 0 {
            Ok(v)
        } else {
            Err(CuError(r))
        }
    }

    /// A module just loaded, with its functions described; unloaded again if that fails.
    pub(super) fn loaded(&self, m: cu::CUmodule) -> GpuResult<LoadedModule> {
        let result = (|| {
            let mut n = 0u32;
            // SAFETY: m is a loaded module; valid out-pointer.
            ck(unsafe { cu::cuModuleGetFunctionCount(&mut n, m) })
                .inspect_err(|e| tracing::warn!("cuModuleGetFunctionCount: {}", e.0))?;
            let mut fs = vec![std::ptr::null_mut(); n as usize];
            // SAFETY: the buffer holds n handles.
            ck(unsafe { cu::cuModuleEnumerateFunctions(fs.as_mut_ptr(), n, m) })
                .inspect_err(|e| tracing::warn!("cuModuleEnumerateFunctions({n}): {}", e.0))?;
            fs.into_iter()
                .map(|f| self.describe(f))
                .collect::<GpuResult<Vec<_>>>()
        })();
        match result {
            Ok(functions) => Ok(LoadedModule {
                handle: m as u64,
                functions,
            }),
            Err(e) => {
                // SAFETY: unloading the module loaded above.
                unsafe { cu::cuModuleUnload(m) };
                Err(e)
            }
        }
    }

    pub(super) fn describe(&self, f: cu::CUfunction) -> GpuResult<FunctionInfo> {
        // Under lazy loading (the default) a function's name, parameters and attributes
        // are only known once it is loaded.
        // SAFETY: f is a function of a module that is loaded.
        ck(unsafe { cu::cuFuncLoad(f) }).inspect_err(|e| tracing::warn!("cuFuncLoad: {}", e.0))?;
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: valid function handle and out-pointer; the name is owned by the driver.
        ck(unsafe { cu::cuFuncGetName(&mut name, f) })
            .inspect_err(|e| tracing::warn!("cuFuncGetName: {}", e.0))?;
        // SAFETY: the driver returns a NUL-terminated string that lives with the module.
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let mut params = Vec::new();
        loop {
            let (mut off, mut size) = (0usize, 0usize);
            // SAFETY: valid handle and out-pointers; past the last parameter it errors.
            let r = unsafe { cu::cuFuncGetParamInfo(f, params.len(), &mut off, &mut size) };
            if r != cu::CUresult::CUDA_SUCCESS {
                break;
            }
            params.push((off as u32, size as u32));
        }
        Ok(FunctionInfo {
            handle: f as u64,
            name,
            max_threads_per_block: self
                .func_attr(f, func_attr::MAX_THREADS_PER_BLOCK)
                .inspect_err(|e| tracing::warn!("cuFuncGetAttribute: {}", e.0))?,
            static_shared: self.func_attr(f, func_attr::SHARED_SIZE_BYTES)?,
            max_dynamic_shared: self.func_attr(f, func_attr::MAX_DYNAMIC_SHARED_SIZE_BYTES)?,
            params,
        })
    }
}
