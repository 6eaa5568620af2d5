//! [`Gpu`] on the real CUDA driver, loaded at run time through cudarc's `sys` layer.

pub mod arrays;
pub mod green;

use crate::gpu::{code, func_attr, CuError, FunctionInfo, Gpu, GpuResult, LoadedModule};
use cudarc::driver::sys as cu;
use omps_ring::segment::{DeviceSnapshot, MAX_ATTRIBUTES, TPC_MAP_MAX};
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicPtr, Ordering};

const _: () =
    assert!(std::mem::size_of::<cu::CUlaunchAttribute>() == omps_ring::wire::LAUNCH_ATTR_BYTES);

fn ck(r: cu::CUresult) -> GpuResult<()> {
    if r == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CuError(r as i32))
    }
}

/// One launch attribute as the client sent it: CUlaunchAttribute's bytes, aligned as it
/// is. Kept as bytes, never as cudarc's type, whose id enum lacks ids newer than its
/// headers (17, 18 are forwarded): only the driver reads them.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct LaunchAttrBytes([u8; omps_ring::wire::LAUNCH_ATTR_BYTES]);

const _: () = assert!(
    std::mem::align_of::<LaunchAttrBytes>() == std::mem::align_of::<cu::CUlaunchAttribute>()
        && std::mem::size_of::<LaunchAttrBytes>() == std::mem::size_of::<cu::CUlaunchAttribute>()
);

/// Launch attributes from the wire (whole CUlaunchAttribute records) in an aligned list,
/// for the driver (`as_mut_ptr().cast()`).
fn attr_list(attrs: &[u8]) -> Vec<LaunchAttrBytes> {
    attrs
        .chunks_exact(omps_ring::wire::LAUNCH_ATTR_BYTES)
        .map(|c| LaunchAttrBytes(c.try_into().expect("chunks of the size")))
        .collect()
}

/// Whether libcuda can be loaded at all; checked before anything that would panic in cudarc.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cu::is_culib_present() }
}

type RawAttrFn = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
type RawFuncAttrFn = unsafe extern "C" fn(*mut c_int, c_int, cu::CUfunction) -> c_int;
type RawFuncSetAttrFn = unsafe extern "C" fn(cu::CUfunction, c_int, c_int) -> c_int;
type RawGetLimitFn = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
type RawSetLimitFn = unsafe extern "C" fn(c_int, usize) -> c_int;
type RawCacheConfigFn = unsafe extern "C" fn(cu::CUfunction, c_int) -> c_int;
type Desc = *mut [u8; 128];
type RawTiledFn = unsafe extern "C" fn(
    Desc,
    u32,
    u32,
    u64,
    *const u64,
    *const u64,
    *const u32,
    *const u32,
    u32,
    u32,
    u32,
    u32,
) -> c_int;
type RawIm2colFn = unsafe extern "C" fn(
    Desc,
    u32,
    u32,
    u64,
    *const u64,
    *const u64,
    *const i32,
    *const i32,
    u32,
    u32,
    *const u32,
    u32,
    u32,
    u32,
    u32,
) -> c_int;
type RawIm2colWideFn = unsafe extern "C" fn(
    Desc,
    u32,
    u32,
    u64,
    *const u64,
    *const u64,
    i32,
    i32,
    u32,
    u32,
    *const u32,
    u32,
    u32,
    u32,
    u32,
    u32,
) -> c_int;
type RawReplaceFn = unsafe extern "C" fn(Desc, u64) -> c_int;

/// Attribute getters taking a plain int: cudarc's enums cannot hold values this build of
/// the bindings does not know, and the snapshot asks for every attribute number.
fn raw_fn<T: Copy>(name: &[u8]) -> GpuResult<T> {
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

/// The image verifier's load (crate::image::verifier, in its own process): `image` loaded on GPU
/// `ordinal` in that GPU's primary context, then unloaded; the CUresult, or
/// [`crate::image::verifier::NO_CONTEXT`] when the GPU cannot be opened.
pub fn verify_load(ordinal: usize, image: &[u8]) -> i32 {
    if let Err(e) = verify_context(ordinal) {
        return e;
    }
    let mut m = std::ptr::null_mut();
    // SAFETY: the current context is one this process retained; the image is this
    // process's copy, whole per check_image (the server checked it before sending).
    unsafe {
        let r = cu::cuModuleLoadData(&mut m, image.as_ptr() as *const c_void);
        if r == cu::CUresult::CUDA_SUCCESS {
            cu::cuModuleUnload(m);
        }
        r as i32
    }
}

/// The verifier child's link of a container, as the server's would link it: the
/// CUresult of the whole link.
pub fn verify_link(ordinal: usize, container: &[u8]) -> i32 {
    if let Err(e) = verify_context(ordinal) {
        return e;
    }
    crate::session::link_verdict(container, |o, i| link_here(o, i).0.map(drop))
}

/// Makes GPU `ordinal`'s primary context current in the verifier child (retained once);
/// Err(NO_CONTEXT) when it cannot be had.
fn verify_context(ordinal: usize) -> Result<(), i32> {
    use std::sync::OnceLock;
    static INIT: OnceLock<bool> = OnceLock::new();
    static CONTEXTS: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());
    if !*INIT.get_or_init(|| init().is_ok()) {
        return Err(crate::image::verifier::NO_CONTEXT);
    }
    let mut ctxs = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    let ctx = match ctxs.iter().find(|c| c.0 == ordinal) {
        Some(&(_, c)) => c as cu::CUcontext,
        None => {
            let (mut dev, mut ctx) = (0, std::ptr::null_mut());
            // SAFETY: valid out-pointers; a bad ordinal is the driver's to refuse.
            let r = unsafe {
                match cu::cuDeviceGet(&mut dev, ordinal as c_int) {
                    cu::CUresult::CUDA_SUCCESS => cu::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                    e => e,
                }
            };
            if r != cu::CUresult::CUDA_SUCCESS {
                return Err(crate::image::verifier::NO_CONTEXT);
            }
            ctxs.push((ordinal, ctx as usize));
            ctx
        }
    };
    // SAFETY: a context this process retained.
    if unsafe { cu::cuCtxSetCurrent(ctx) } != cu::CUresult::CUDA_SUCCESS {
        return Err(crate::image::verifier::NO_CONTEXT);
    }
    Ok(())
}

/// cuModuleLoadDataEx of NUL-terminated `ptx` with value `options` in the current
/// context: the module or the error, and the info and error logs.
fn load_jit_here(ptx: &[u8], options: &[(u32, u64)]) -> (GpuResult<cu::CUmodule>, String, String) {
    type LoadEx = unsafe extern "C" fn(
        *mut cu::CUmodule,
        *const c_void,
        u32,
        *mut u32,
        *mut *mut c_void,
    ) -> c_int;
    let mut o = JitOptions::new(options);
    let load: LoadEx = match raw_fn(b"cuModuleLoadDataEx\0") {
        Ok(f) => f,
        Err(e) => return (Err(e), String::new(), String::new()),
    };
    let mut m = std::ptr::null_mut();
    // SAFETY: NUL-terminated PTX (the session checks), this process's copy; options and
    // values are parallel arrays of value options and our own log buffers.
    let r = unsafe {
        load(
            &mut m,
            ptx.as_ptr() as *const c_void,
            o.opts.len() as u32,
            o.opts.as_mut_ptr(),
            o.vals.as_mut_ptr(),
        )
    };
    let result = if r == 0 { Ok(m) } else { Err(CuError(r)) };
    let (i, e) = o.logs();
    (result, i, e)
}

/// The verifier child's compile of a JIT load's container (value options and one PTX
/// input, as the server's handle_jit_load reads it): the CUresult.
pub fn verify_jit(ordinal: usize, container: &[u8]) -> i32 {
    if let Err(e) = verify_context(ordinal) {
        return e;
    }
    crate::session::jit_verdict(container, |ptx, o| {
        load_jit_here(ptx, o).0.map(|m| {
            // SAFETY: the module just loaded here, unloaded once.
            unsafe { cu::cuModuleUnload(m) };
        })
    })
}

/// JIT-links `inputs` with value `options` in the current context (the server's GPU, or
/// the verifier child's): the image or the error, and the info and error logs.
fn link_here(
    options: &[(u32, u64)],
    inputs: &[(u32, &str, &[u8])],
) -> (GpuResult<Vec<u8>>, String, String) {
    type Create = unsafe extern "C" fn(u32, *mut u32, *mut *mut c_void, *mut *mut c_void) -> c_int;
    type Add = unsafe extern "C" fn(
        *mut c_void,
        u32,
        *const c_void,
        usize,
        *const c_char,
        u32,
        *mut u32,
        *mut *mut c_void,
    ) -> c_int;
    type Complete = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut usize) -> c_int;
    type Destroy = unsafe extern "C" fn(*mut c_void) -> c_int;
    let mut o = JitOptions::new(options);
    let fns = (|| -> GpuResult<(Create, Add, Complete, Destroy)> {
        Ok((
            raw_fn(b"cuLinkCreate_v2\0")?,
            raw_fn(b"cuLinkAddData_v2\0")?,
            raw_fn(b"cuLinkComplete\0")?,
            raw_fn(b"cuLinkDestroy\0")?,
        ))
    })();
    let (create, add, complete, destroy) = match fns {
        Ok(f) => f,
        Err(e) => return (Err(e), String::new(), String::new()),
    };
    let mut state = std::ptr::null_mut();
    // SAFETY: options and values are parallel arrays of value options (checked by the
    // session) and our own log buffers with their sizes; the state is destroyed below.
    let r = unsafe {
        create(
            o.opts.len() as u32,
            o.opts.as_mut_ptr(),
            o.vals.as_mut_ptr(),
            &mut state,
        )
    };
    if r != 0 {
        let (i, e) = o.logs();
        return (Err(CuError(r)), i, e);
    }
    let mut result = Ok(Vec::new());
    for (kind, name, data) in inputs {
        let name = CString::new(*name).unwrap_or_default();
        // SAFETY: data is a live slice of its length; the driver copies it.
        let r = unsafe {
            add(
                state,
                *kind,
                data.as_ptr() as *const c_void,
                data.len(),
                name.as_ptr(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if r != 0 {
            result = Err(CuError(r));
            break;
        }
    }
    if result.is_ok() {
        let (mut img, mut n) = (std::ptr::null_mut(), 0usize);
        // SAFETY: valid out-pointers; the image lives until destroy, copied before.
        let r = unsafe { complete(state, &mut img, &mut n) };
        result = if r != 0 || img.is_null() {
            Err(CuError(if r != 0 { r } else { code::UNKNOWN }))
        } else {
            // SAFETY: the driver's image of n bytes.
            Ok(unsafe { std::slice::from_raw_parts(img as *const u8, n) }.to_vec())
        };
    }
    // SAFETY: the state from create, destroyed once.
    unsafe { destroy(state) };
    let (i, e) = o.logs();
    (result, i, e)
}

/// `extra` keys of cuLaunchKernel (cuda.h: CU_LAUNCH_PARAM_*).
const LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
const LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

pub struct CudaGpu {
    ordinal: usize,
    dev: cu::CUdevice,
    ctx: cu::CUcontext,
    /// Work streams, as placement::Layout lays them out; atomics so that reset() can
    /// recreate them after a fault, and confined ones be made at first use.
    streams: Vec<AtomicPtr<cu::CUstream_st>>,
    layout: crate::sched::placement::Layout,
    /// The device's stream priority range (least, greatest).
    priorities: (i32, i32),
    green: crate::gpu::cuda::green::Green,
    /// Never given work: synchronizing it makes the driver write out printf output at once.
    printf_stream: AtomicPtr<cu::CUstream_st>,
    /// Never given work either: frees are queued on it, so they wait for nothing.
    release_stream: AtomicPtr<cu::CUstream_st>,
    /// Whether the device has the stream-ordered allocator (CU_DEVICE_ATTRIBUTE_MEMORY_
    /// POOLS_SUPPORTED), whose cuMemFreeAsync the releaser's frees use; without it (Pascal-
    /// like GPUs) they are plain cuMemFree.
    pools: bool,
    attr_fn: RawAttrFn,
    func_attr_fn: RawFuncAttrFn,
    func_set_attr_fn: RawFuncSetAttrFn,
    get_limit_fn: RawGetLimitFn,
    set_limit_fn: RawSetLimitFn,
    cache_config_fn: RawCacheConfigFn,
}

// SAFETY: CUDA driver handles may be used from any thread once the context is current there
// (bind() makes it so); the struct never hands them out.
unsafe impl Send for CudaGpu {}
// SAFETY: as above; the driver API is thread safe.
unsafe impl Sync for CudaGpu {}

/// Pairs of GPUs (from, to, as ordinals) whose contexts have direct access enabled,
/// process-wide: a reset of either end enables the pair again.
fn peer_pairs() -> std::sync::MutexGuard<'static, Vec<(usize, usize)>> {
    static PAIRS: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());
    PAIRS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The device of ordinal `o`.
fn device_of(o: usize) -> GpuResult<cu::CUdevice> {
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

    fn create_streams(&self) -> GpuResult<()> {
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
    fn rebind(&self) {
        CURRENT.with(|c| c.set(0));
        self.bind();
    }

    /// Adds a node with `add` (out-pointer, graph, dependencies, their count) where stream
    /// `s`'s capture stands, if `graph_ok` accepts the capture's graph, and moves the
    /// capture past it.
    /// Where stream `s`'s active capture stands: the stream, the capture's graph and its
    /// current dependencies (the driver's array, valid until the capture changes).
    fn capture_point(
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
    fn add_at_capture(
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
    fn peer_access(from: cu::CUcontext, to: cu::CUdevice) -> GpuResult<()> {
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
    fn peer_device(&self, peer: usize) -> Option<cu::CUdevice> {
        let pdev = device_of(peer).ok()?;
        let mut can = 0;
        // SAFETY: valid out-pointer; both are devices of this machine.
        ck(unsafe { cu::cuDeviceCanAccessPeer(&mut can, self.dev, pdev) }).ok()?;
        (can != 0 && pdev != self.dev).then_some(pdev)
    }

    fn bind(&self) {
        let want = self.ctx as usize;
        CURRENT.with(|c| {
            if c.get() != want {
                // SAFETY: ctx is a retained primary context.
                unsafe { cu::cuCtxSetCurrent(self.ctx) };
                c.set(want);
            }
        });
    }

    fn stream(&self, s: usize) -> GpuResult<cu::CUstream> {
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

    fn func_attr(&self, f: cu::CUfunction, attr: i32) -> GpuResult<i32> {
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
    fn loaded(&self, m: cu::CUmodule) -> GpuResult<LoadedModule> {
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

    fn describe(&self, f: cu::CUfunction) -> GpuResult<FunctionInfo> {
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

/// A JIT compile's options: the client's value options, then our own info and error log
/// buffers and their sizes, which the driver fills.
struct JitOptions {
    opts: Vec<u32>,
    vals: Vec<*mut c_void>,
    info: Vec<u8>,
    error: Vec<u8>,
}

impl JitOptions {
    const LOG: usize = 64 << 10;

    fn new(options: &[(u32, u64)]) -> Self {
        const INFO_BUF: u32 = 3;
        const INFO_SIZE: u32 = 4;
        const ERROR_BUF: u32 = 5;
        const ERROR_SIZE: u32 = 6;
        let (mut info, mut error) = (vec![0u8; Self::LOG], vec![0u8; Self::LOG]);
        let mut opts: Vec<u32> = options.iter().map(|o| o.0).collect();
        let mut vals: Vec<*mut c_void> = options.iter().map(|o| o.1 as *mut c_void).collect();
        for (o, v) in [
            (INFO_BUF, info.as_mut_ptr() as *mut c_void),
            (INFO_SIZE, Self::LOG as *mut c_void),
            (ERROR_BUF, error.as_mut_ptr() as *mut c_void),
            (ERROR_SIZE, Self::LOG as *mut c_void),
        ] {
            opts.push(o);
            vals.push(v);
        }
        JitOptions {
            opts,
            vals,
            info,
            error,
        }
    }

    /// The info and error logs as the driver left them (up to their NUL).
    fn logs(&self) -> (String, String) {
        let text = |b: &[u8]| {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            String::from_utf8_lossy(&b[..end]).into_owned()
        };
        (text(&self.info), text(&self.error))
    }
}

impl Gpu for CudaGpu {
    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn snapshot(&self) -> DeviceSnapshot {
        let mut s: DeviceSnapshot = bytemuck::Zeroable::zeroed();
        // SAFETY: valid buffers and lengths; dev is a valid device.
        unsafe {
            cu::cuDeviceGetName(s.name.as_mut_ptr() as *mut c_char, 255, self.dev);
            let mut uuid: cu::CUuuid = std::mem::zeroed();
            if cu::cuDeviceGetUuid_v2(&mut uuid, self.dev) == cu::CUresult::CUDA_SUCCESS {
                for (d, b) in s.uuid.iter_mut().zip(uuid.bytes) {
                    *d = b as u8;
                }
            }
            cu::cuDeviceGetPCIBusId(s.pci_bus_id.as_mut_ptr() as *mut c_char, 31, self.dev);
            self.bind();
            let (mut least, mut greatest) = (0, 0);
            if cu::cuCtxGetStreamPriorityRange(&mut least, &mut greatest)
                == cu::CUresult::CUDA_SUCCESS
            {
                s.stream_priority = [least, greatest];
            }
            let mut total = 0usize;
            cu::cuDeviceTotalMem_v2(&mut total, self.dev);
            s.total_mem = total as u64;
            for a in 1..MAX_ATTRIBUTES {
                let mut v = 0;
                if (self.attr_fn)(&mut v, a as c_int, self.dev) == 0 {
                    s.attributes[a] = v;
                    s.attr_valid[a] = 1;
                }
            }
        }
        read_tpc_maps(&mut s);
        s
    }

    fn layout(&self) -> crate::sched::placement::Layout {
        self.layout
    }

    fn quiet(&self) -> bool {
        self.bind();
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
        !self
            .streams
            .iter()
            .map(|c| c.load(Ordering::Acquire))
            .chain([self.release_stream.load(Ordering::Acquire)])
            .any(busy)
    }

    fn sm_chunks(&self) -> crate::sched::confine::SmChunks {
        self.green.chunks
    }

    fn confine(&self, slot: usize, set: &crate::sched::confine::SmSet) -> GpuResult<u32> {
        self.bind();
        // The slot's old streams belong to the old green context: new ones at next use.
        let slots = self.layout.class_in(Some(slot), 0).start
            ..self
                .layout
                .class_in(Some(slot), crate::sched::placement::CLASSES - 1)
                .end;
        for cell in self.streams.get(slots).unwrap_or(&[]) {
            let old = cell.swap(std::ptr::null_mut(), Ordering::AcqRel);
            if !old.is_null() {
                // SAFETY: a stream of this slot; whatever it still runs completes first.
                unsafe { cu::cuStreamDestroy_v2(old) };
            }
        }
        let r = self.green.create(slot, set);
        self.rebind();
        r
    }

    fn reset(&self) -> GpuResult<()> {
        let step = |what: &'static str| {
            move |e: CuError| {
                tracing::error!("context reset: {what} failed: CUDA error {}", e.0);
                e
            }
        };
        // SAFETY: called by the worker once no client of this GPU is left; the reset
        // destroys everything the context held, and the primary context stays current.
        ck(unsafe { cu::cuDevicePrimaryCtxReset_v2(self.dev) })
            .map_err(step("cuDevicePrimaryCtxReset"))?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the reference from open() was dropped by the reset.
        ck(unsafe { cu::cuDevicePrimaryCtxRetain(&mut ctx, self.dev) })
            .map_err(step("cuDevicePrimaryCtxRetain"))?;
        if ctx != self.ctx {
            tracing::error!("the primary context changed handle across a reset");
            return Err(CuError(code::UNKNOWN));
        }
        // SAFETY: ctx is retained; make it current here again.
        ck(unsafe { cu::cuCtxSetCurrent(ctx) }).map_err(step("cuCtxSetCurrent"))?;
        // The confined streams went with their green contexts' work; made again at use.
        for cell in &self.streams[self.layout.base()..] {
            cell.store(std::ptr::null_mut(), Ordering::Release);
        }
        self.green.remake();
        self.rebind();
        self.create_streams()
            .map_err(step("creating the streams"))?;
        // The old context's peer access went with it, both ways: every pair with this GPU
        // at either end is enabled again.
        let pairs = peer_pairs().clone();
        for (from, to) in pairs
            .into_iter()
            .filter(|&(f, t)| f == self.ordinal || t == self.ordinal)
        {
            let again = if from == self.ordinal {
                device_of(to).and_then(|d| Self::peer_access(self.ctx, d))
            } else {
                device_of(from).and_then(|d| {
                    let mut pctx = std::ptr::null_mut();
                    // SAFETY: valid out-pointer; the peer's CudaGpu keeps its context retained.
                    ck(unsafe { cu::cuDevicePrimaryCtxRetain(&mut pctx, d) })?;
                    let r = Self::peer_access(pctx, self.dev);
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
        self.rebind();
        Ok(())
    }

    fn reaches(&self, peer: usize) -> bool {
        peer_pairs().contains(&(self.ordinal, peer))
    }

    fn peer_attributes(&self, peer: usize) -> [i32; omps_ring::segment::P2P_ATTRIBUTES] {
        let mut out = [0; omps_ring::segment::P2P_ATTRIBUTES];
        let Some(pdev) = self.peer_device(peer) else {
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
                if unsafe { f(&mut x, a as c_int + 1, self.dev, pdev) } == 0 {
                    *v = x;
                }
            }
        }
        out
    }

    fn enable_peer(&self, peer: usize) -> GpuResult<()> {
        // Enabling maps every allocation of the context on the peer and may take a while:
        // under its own lock, so that `reaches` on other lanes never waits for it.
        static ENABLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = ENABLING.lock().unwrap_or_else(|e| e.into_inner());
        if self.reaches(peer) {
            return Ok(());
        }
        let pdev = self
            .peer_device(peer)
            .ok_or(CuError(code::PEER_ACCESS_UNSUPPORTED))?;
        let enabled = Self::peer_access(self.ctx, pdev);
        self.rebind();
        if let Err(e) = enabled {
            tracing::warn!(
                gpu = self.ordinal,
                peer,
                "enabling peer access failed: CUDA error {}",
                e.0
            );
            return Err(e);
        }
        tracing::info!(
            gpu = self.ordinal,
            peer,
            "direct access to a peer GPU enabled"
        );
        peer_pairs().push((self.ordinal, peer));
        Ok(())
    }

    fn mem_alloc(&self, size: u64) -> GpuResult<u64> {
        self.bind();
        let mut p = 0;
        // SAFETY: valid out-pointer.
        ck(unsafe { cu::cuMemAlloc_v2(&mut p, size as usize) })?;
        Ok(p)
    }

    fn mem_free(&self, ptr: u64) -> GpuResult<()> {
        self.bind();
        // SAFETY: the caller frees only pointers it allocated, once, when idle.
        ck(unsafe { cu::cuMemFree_v2(ptr) })
    }

    fn mem_free_async(&self, ptr: u64) -> GpuResult<()> {
        if !self.pools {
            return self.mem_free(ptr);
        }
        self.bind();
        let st = self.release_stream.load(Ordering::Acquire);
        // SAFETY: as mem_free; a stream of this context with no work, so the free happens
        // as soon as the driver gets to it (cuMemFreeAsync takes cuMemAlloc's memory too:
        // scripts/probe/blocking_calls.cu).
        ck(unsafe { cu::cuMemFreeAsync(ptr, st) })
    }

    fn settle_frees(&self) -> GpuResult<()> {
        if !self.pools {
            return Ok(());
        }
        self.bind();
        let st = self.release_stream.load(Ordering::Acquire);
        // SAFETY: a live stream of this context that holds only frees.
        ck(unsafe { cu::cuStreamSynchronize(st) })
    }

    fn vmm_reserve(&self, size: u64, align: u64, hint: u64) -> GpuResult<u64> {
        self.bind();
        let mut p = 0;
        // SAFETY: valid out-pointer; the driver checks sizes and alignment.
        ck(unsafe { cu::cuMemAddressReserve(&mut p, size as usize, align as usize, hint, 0) })?;
        Ok(p)
    }

    fn vmm_address_free(&self, ptr: u64, size: u64) -> GpuResult<()> {
        self.bind();
        // SAFETY: the session checked this is one whole reservation of the client.
        ck(unsafe { cu::cuMemAddressFree(ptr, size as usize) })
    }

    fn vmm_create(&self, size: u64, compressible: bool) -> GpuResult<(u64, bool)> {
        self.bind();
        let prop = self.vmm_prop(compressible);
        let mut h = 0;
        // SAFETY: valid out-pointer and property block.
        ck(unsafe { cu::cuMemCreate(&mut h, size as usize, &prop, 0) })?;
        if !compressible {
            return Ok((h, false));
        }
        // The driver may make the memory without compression (no compression on this GPU,
        // or none left): what it granted is in the handle's properties.
        // SAFETY: all-zero is a valid CUmemAllocationProp (plain integers, a null pointer).
        let mut got: cu::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer; a handle just made.
        if let Err(e) = ck(unsafe { cu::cuMemGetAllocationPropertiesFromHandle(&mut got, h) }) {
            // SAFETY: the handle just made, released once.
            unsafe { cu::cuMemRelease(h) };
            return Err(e);
        }
        Ok((h, got.allocFlags.compressionType != 0))
    }

    fn vmm_release(&self, handle: u64) -> GpuResult<()> {
        self.bind();
        // SAFETY: a handle this server created, released once.
        ck(unsafe { cu::cuMemRelease(handle) })
    }

    fn vmm_map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> GpuResult<()> {
        self.bind();
        // SAFETY: the session checked the range lies in the client's reservation and the
        // handle is the client's; the driver checks sizes and offsets.
        ck(unsafe { cu::cuMemMap(ptr, size as usize, offset as usize, handle, 0) })
    }

    fn vmm_unmap(&self, ptr: u64, size: u64) -> GpuResult<()> {
        self.bind();
        // SAFETY: the session checked this is one whole mapping of the client.
        ck(unsafe { cu::cuMemUnmap(ptr, size as usize) })
    }

    fn vmm_set_access(&self, ptr: u64, size: u64, gpus: &[usize]) -> GpuResult<()> {
        self.bind();
        // Another GPU's location needs no peer access between the contexts: the driver
        // checks that the two devices can reach each other.
        let descs = gpus
            .iter()
            .map(|&g| {
                let dev = match g == self.ordinal {
                    true => self.dev,
                    false => self.peer_device(g).ok_or(CuError(code::INVALID_DEVICE))?,
                };
                Ok(cu::CUmemAccessDesc {
                    location: cu::CUmemLocation {
                        type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                        id: dev,
                    },
                    flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                })
            })
            .collect::<GpuResult<Vec<_>>>()?;
        // SAFETY: the session checked the range lies in the client's mappings; `descs`
        // holds as many descriptors as passed.
        ck(unsafe { cu::cuMemSetAccess(ptr, size as usize, descs.as_ptr(), descs.len()) })
    }

    fn vmm_granularity(&self, recommended: bool, compressible: bool) -> GpuResult<u64> {
        self.bind();
        let prop = self.vmm_prop(compressible);
        let option = if recommended {
            cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
        } else {
            cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM
        };
        let mut g = 0usize;
        // SAFETY: valid out-pointer and property block.
        ck(unsafe { cu::cuMemGetAllocationGranularity(&mut g, &prop, option) })?;
        Ok(g as u64)
    }

    fn link(
        &self,
        options: &[(u32, u64)],
        inputs: &[(u32, &str, &[u8])],
    ) -> (GpuResult<Vec<u8>>, String, String) {
        self.bind();
        link_here(options, inputs)
    }

    fn tensor_map(
        &self,
        t: &omps_ring::wire::TensorMap,
        old: Option<&[u8; 128]>,
    ) -> GpuResult<[u8; 128]> {
        use omps_ring::wire::tensor_map as k;
        // A device address is checked against the current context.
        self.bind();
        // The descriptor is the driver's own bytes; enums pass as plain integers (the
        // driver checks them), arrays are the record's, of the sizes cuda.h gives.
        let mut d = old.copied().unwrap_or([0; 128]);
        // SAFETY: each symbol has the signature declared above (cuda.h, CUDA 13); every
        // pointer argument is into `t` or `d`, with room for rank 5.
        let r = unsafe {
            match t.kind {
                k::TILED => raw_fn::<RawTiledFn>(b"cuTensorMapEncodeTiled\0")?(
                    &mut d,
                    t.dtype,
                    t.rank,
                    t.global_address,
                    t.global_dim.as_ptr(),
                    t.global_strides.as_ptr(),
                    t.box_dim.as_ptr(),
                    t.element_strides.as_ptr(),
                    t.interleave,
                    t.swizzle,
                    t.l2_promotion,
                    t.oob_fill,
                ),
                k::IM2COL => raw_fn::<RawIm2colFn>(b"cuTensorMapEncodeIm2col\0")?(
                    &mut d,
                    t.dtype,
                    t.rank,
                    t.global_address,
                    t.global_dim.as_ptr(),
                    t.global_strides.as_ptr(),
                    t.lower.as_ptr(),
                    t.upper.as_ptr(),
                    t.channels_per_pixel,
                    t.pixels_per_column,
                    t.element_strides.as_ptr(),
                    t.interleave,
                    t.swizzle,
                    t.l2_promotion,
                    t.oob_fill,
                ),
                k::IM2COL_WIDE => raw_fn::<RawIm2colWideFn>(b"cuTensorMapEncodeIm2colWide\0")?(
                    &mut d,
                    t.dtype,
                    t.rank,
                    t.global_address,
                    t.global_dim.as_ptr(),
                    t.global_strides.as_ptr(),
                    t.lower_w,
                    t.upper_w,
                    t.channels_per_pixel,
                    t.pixels_per_column,
                    t.element_strides.as_ptr(),
                    t.interleave,
                    t.wide_mode,
                    t.swizzle,
                    t.l2_promotion,
                    t.oob_fill,
                ),
                k::REPLACE_ADDRESS => raw_fn::<RawReplaceFn>(b"cuTensorMapReplaceAddress\0")?(
                    &mut d,
                    t.global_address,
                ),
                _ => return Err(CuError(code::INVALID_VALUE)),
            }
        };
        if r != 0 {
            return Err(CuError(r));
        }
        Ok(d)
    }

    fn mem_info(&self) -> GpuResult<(u64, u64)> {
        self.bind();
        let (mut f, mut t) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        ck(unsafe { cu::cuMemGetInfo_v2(&mut f, &mut t) })?;
        Ok((f as u64, t as u64))
    }

    unsafe fn copy_htod(&self, dst: u64, src: *const u8, len: usize, s: usize) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        // SAFETY: the caller guarantees the host range; the driver checks the device range.
        ck(unsafe { cu::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, st) })
    }

    unsafe fn copy_dtoh(&self, dst: *mut u8, src: u64, len: usize, s: usize) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        // SAFETY: as copy_htod.
        ck(unsafe { cu::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, st) })
    }

    fn copy_dtod(&self, dst: u64, src: u64, len: usize, s: usize) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        // SAFETY: device addresses only; the driver checks them.
        ck(unsafe { cu::cuMemcpyDtoDAsync_v2(dst, src, len, st) })
    }

    fn memset(
        &self,
        dst: u64,
        value: u32,
        elem_size: u32,
        count: usize,
        s: usize,
    ) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        // SAFETY: device addresses only; the driver checks them.
        ck(unsafe {
            match elem_size {
                1 => cu::cuMemsetD8Async(dst, value as u8, count, st),
                2 => cu::cuMemsetD16Async(dst, value as u16, count, st),
                4 => cu::cuMemsetD32Async(dst, value, count, st),
                _ => return Err(CuError(code::INVALID_VALUE)),
            }
        })
    }

    unsafe fn write_u32(&self, addr: *mut u32, value: u32, s: usize) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        // SAFETY: registered with DEVICEMAP and unified addressing, so the host address is
        // the device address (checked in register_host).
        ck(unsafe { cu::cuStreamWriteValue32_v2(st, addr as u64, value, 0) })
    }

    unsafe fn wait_u32(&self, addr: *mut u32, value: u32, s: usize) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        // CU_STREAM_WAIT_VALUE_GEQ compares with wrap-around: a slot's sequence only grows,
        // so a later function's acknowledgement through the same slot also releases this
        // wait (EQ could miss the moment and wait forever).
        const WAIT_VALUE_GEQ: u32 = 0;
        // SAFETY: as write_u32: registered with DEVICEMAP, host address = device address.
        ck(unsafe { cu::cuStreamWaitValue32_v2(st, addr as u64, value, WAIT_VALUE_GEQ) })
    }

    unsafe fn wait_u32_eq(&self, addr: *mut u32, value: u32, s: usize) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        const WAIT_VALUE_EQ: u32 = 1;
        // SAFETY: as write_u32: registered with DEVICEMAP, host address = device address.
        ck(unsafe { cu::cuStreamWaitValue32_v2(st, addr as u64, value, WAIT_VALUE_EQ) })
    }

    unsafe fn register_host(&self, ptr: *mut u8, len: usize) -> GpuResult<()> {
        self.bind();
        const PORTABLE: u32 = 1;
        const DEVICEMAP: u32 = 2;
        // SAFETY: the caller keeps the range mapped until unregister.
        ck(unsafe { cu::cuMemHostRegister_v2(ptr as *mut c_void, len, PORTABLE | DEVICEMAP) })?;
        let mut d = 0;
        // SAFETY: ptr was just registered; valid out-pointer.
        ck(unsafe { cu::cuMemHostGetDevicePointer_v2(&mut d, ptr as *mut c_void, 0) })?;
        if d != ptr as u64 {
            // write_u32 relies on the identity mapping; refuse rather than write elsewhere.
            // SAFETY: undoing the registration above.
            unsafe { cu::cuMemHostUnregister(ptr as *mut c_void) };
            return Err(CuError(code::NOT_SUPPORTED));
        }
        Ok(())
    }

    unsafe fn unregister_host(&self, ptr: *mut u8) -> GpuResult<()> {
        self.bind();
        // SAFETY: the caller guarantees nothing is in flight.
        ck(unsafe { cu::cuMemHostUnregister(ptr as *mut c_void) })
    }

    fn module_load(&self, image: &[u8]) -> GpuResult<LoadedModule> {
        self.bind();
        let mut m = std::ptr::null_mut();
        // SAFETY: the image is a server-owned copy; the driver parses it (fatbin, cubin, or
        // NUL-terminated PTX, which the session checks).
        ck(unsafe { cu::cuModuleLoadData(&mut m, image.as_ptr() as *const c_void) })?;
        self.loaded(m)
    }

    fn module_load_jit(
        &self,
        ptx: &[u8],
        options: &[(u32, u64)],
    ) -> (GpuResult<LoadedModule>, String, String) {
        self.bind();
        let (r, i, e) = load_jit_here(ptx, options);
        (r.and_then(|m| self.loaded(m)), i, e)
    }

    fn image_data_bytes(&self, image: &[u8]) -> u64 {
        // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR.
        let a = &self.snapshot().attributes;
        crate::image::module_cache::data_bytes(image, (a[75] * 10 + a[76]) as u32)
    }

    fn module_unload(&self, module: u64) -> GpuResult<()> {
        self.bind();
        // SAFETY: module is a handle from module_load, unloaded once.
        ck(unsafe { cu::cuModuleUnload(module as cu::CUmodule) })
    }

    fn module_global(&self, module: u64, name: &str) -> GpuResult<(u64, u64)> {
        self.bind();
        let name = CString::new(name).map_err(|_| CuError(code::INVALID_VALUE))?;
        let (mut p, mut n) = (0, 0usize);
        // SAFETY: valid module handle, NUL-terminated name, valid out-pointers.
        ck(unsafe {
            cu::cuModuleGetGlobal_v2(&mut p, &mut n, module as cu::CUmodule, name.as_ptr())
        })?;
        Ok((p, n as u64))
    }

    fn func_attribute(&self, func: u64, attr: i32) -> GpuResult<i32> {
        self.bind();
        self.func_attr(func as cu::CUfunction, attr)
    }

    fn func_set_attribute(&self, func: u64, attr: i32, value: i32) -> GpuResult<()> {
        self.bind();
        // SAFETY: func is a live function handle; the driver validates attr and value.
        let r = unsafe { (self.func_set_attr_fn)(func as cu::CUfunction, attr, value) };
        if r == 0 {
            Ok(())
        } else {
            Err(CuError(r))
        }
    }

    fn query(&self, kind: u32, func: u64, a: [i64; 7], attrs: &[u8]) -> GpuResult<i64> {
        use omps_ring::wire::query;
        self.bind();
        let f = func as cu::CUfunction;
        let raw = |r: c_int| if r == 0 { Ok(()) } else { Err(CuError(r)) };
        match kind {
            query::OCC_MAX_BLOCKS => {
                let mut n = 0;
                // SAFETY: f is a live function; valid out-pointer.
                ck(unsafe {
                    cu::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
                        &mut n,
                        f,
                        a[0] as c_int,
                        a[1] as usize,
                        a[2] as u32,
                    )
                })?;
                Ok(n as i64)
            }
            query::OCC_DYN_SMEM => {
                let mut n = 0usize;
                // SAFETY: f is a live function; valid out-pointer.
                ck(unsafe {
                    cu::cuOccupancyAvailableDynamicSMemPerBlock(
                        &mut n,
                        f,
                        a[0] as c_int,
                        a[1] as c_int,
                    )
                })?;
                Ok(n as i64)
            }
            query::OCC_MAX_CLUSTERS | query::OCC_MAX_CLUSTER_SIZE => {
                let mut list = attr_list(attrs);
                let n = list.len();
                let config = cu::CUlaunchConfig {
                    gridDimX: a[0] as u32,
                    gridDimY: a[1] as u32,
                    gridDimZ: a[2] as u32,
                    blockDimX: a[3] as u32,
                    blockDimY: a[4] as u32,
                    blockDimZ: a[5] as u32,
                    sharedMemBytes: a[6] as u32,
                    hStream: std::ptr::null_mut(),
                    attrs: list.as_mut_ptr().cast(),
                    numAttrs: n as u32,
                };
                let mut r = 0;
                // SAFETY: f is a live function; config and list outlive the call.
                ck(unsafe {
                    if kind == query::OCC_MAX_CLUSTERS {
                        cu::cuOccupancyMaxActiveClusters(&mut r, f, &config)
                    } else {
                        cu::cuOccupancyMaxPotentialClusterSize(&mut r, f, &config)
                    }
                })?;
                Ok(r as i64)
            }
            query::CTX_GET_LIMIT => {
                let mut v = 0usize;
                // SAFETY: valid out-pointer; the driver checks the limit number.
                raw(unsafe { (self.get_limit_fn)(&mut v, a[0] as c_int) })?;
                Ok(v as i64)
            }
            query::CTX_SET_LIMIT => {
                // SAFETY: the driver checks the limit number and value.
                raw(unsafe { (self.set_limit_fn)(a[0] as c_int, a[1] as usize) }).map(|_| 0)
            }
            query::CTX_RESET_PERSISTING_L2 => {
                // SAFETY: no arguments; acts on the bound context.
                ck(unsafe { cu::cuCtxResetPersistingL2Cache() }).map(|_| 0)
            }
            query::FUNC_CACHE_CONFIG => {
                // SAFETY: f is a live function; the driver checks the config.
                raw(unsafe { (self.cache_config_fn)(f, a[0] as c_int) }).map(|_| 0)
            }
            _ => Err(CuError(code::NOT_SUPPORTED)),
        }
    }

    fn launch(
        &self,
        func: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        s: usize,
        attrs: &[u8],
        args: &[u8],
    ) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        let mut size = args.len();
        // The packed buffer form: the session checked its size against the function's
        // parameter layout, so the driver reads exactly what is there.
        let mut extra = [
            LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            args.as_ptr() as *mut c_void,
            LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            &mut size as *mut usize as *mut c_void,
            std::ptr::null_mut(), // CU_LAUNCH_PARAM_END
        ];
        let extra_ptr = if args.is_empty() {
            std::ptr::null_mut()
        } else {
            extra.as_mut_ptr()
        };
        if attrs.is_empty() {
            // SAFETY: func is a live function handle; extra points at locals alive for the call.
            return ck(unsafe {
                cu::cuLaunchKernel(
                    func as cu::CUfunction,
                    grid[0],
                    grid[1],
                    grid[2],
                    block[0],
                    block[1],
                    block[2],
                    shared,
                    st,
                    std::ptr::null_mut(),
                    extra_ptr,
                )
            });
        }
        let (least, greatest) = self.priorities;
        let class = self
            .layout
            .class_at(s)
            .unwrap_or(crate::sched::placement::NORMAL);
        let floor = crate::sched::placement::class_priority(class, least, greatest);
        let attrs = crate::sched::placement::hold_launch_priority(attrs, floor, least);
        let mut list = attr_list(&attrs);
        let n = list.len();
        let config = cu::CUlaunchConfig {
            gridDimX: grid[0],
            gridDimY: grid[1],
            gridDimZ: grid[2],
            blockDimX: block[0],
            blockDimY: block[1],
            blockDimZ: block[2],
            sharedMemBytes: shared,
            hStream: st,
            attrs: list.as_mut_ptr().cast(),
            numAttrs: n as u32,
        };
        // SAFETY: as above; config and list outlive the call.
        ck(unsafe {
            cu::cuLaunchKernelEx(
                &config,
                func as cu::CUfunction,
                std::ptr::null_mut(),
                extra_ptr,
            )
        })
    }

    fn event_create(&self, flags: u32) -> GpuResult<u64> {
        self.bind();
        let mut e = std::ptr::null_mut();
        // Blocking sync is meaningless in a server that never blocks; keep disable-timing.
        let flags = flags & 0x2;
        // SAFETY: valid out-pointer.
        ck(unsafe { cu::cuEventCreate(&mut e, flags) })?;
        Ok(e as u64)
    }

    fn event_destroy(&self, ev: u64) -> GpuResult<()> {
        self.bind();
        // SAFETY: ev from event_create, destroyed once.
        ck(unsafe { cu::cuEventDestroy_v2(ev as cu::CUevent) })
    }

    fn event_record(&self, ev: u64, s: usize) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        // SAFETY: live event and stream.
        ck(unsafe { cu::cuEventRecord(ev as cu::CUevent, st) })
    }

    fn stream_wait_event(&self, s: usize, ev: u64) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        // SAFETY: live event and stream.
        ck(unsafe { cu::cuStreamWaitEvent(st, ev as cu::CUevent, 0) })
    }

    fn event_record_external(&self, ev: u64, s: usize) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        const RECORD_EXTERNAL: u32 = 1;
        // SAFETY: live event and stream.
        ck(unsafe { cu::cuEventRecordWithFlags(ev as cu::CUevent, st, RECORD_EXTERNAL) })
    }

    fn stream_wait_event_external(&self, s: usize, ev: u64) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        const WAIT_EXTERNAL: u32 = 1;
        // SAFETY: live event and stream.
        ck(unsafe { cu::cuStreamWaitEvent(st, ev as cu::CUevent, WAIT_EXTERNAL) })
    }

    fn event_query(&self, ev: u64) -> GpuResult<bool> {
        self.bind();
        // SAFETY: live event.
        match unsafe { cu::cuEventQuery(ev as cu::CUevent) } {
            cu::CUresult::CUDA_SUCCESS => Ok(true),
            cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(CuError(e as i32)),
        }
    }

    fn capture_begin(&self, s: usize) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        // SAFETY: a work stream of this context.
        ck(unsafe {
            cu::cuStreamBeginCapture_v2(st, cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        })
    }

    fn capture_end(&self, s: usize) -> GpuResult<u64> {
        self.bind();
        let st = self.stream(s)?;
        let mut g = std::ptr::null_mut();
        // SAFETY: a work stream of this context; valid out-pointer.
        ck(unsafe { cu::cuStreamEndCapture(st, &mut g) })?;
        Ok(g as u64)
    }

    fn capture_status(&self, s: usize) -> GpuResult<(u32, u64)> {
        self.bind();
        let st = self.stream(s)?;
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

    fn capture_graph(&self, s: usize) -> GpuResult<u64> {
        self.capture_point(s).map(|(_, g, _, _)| g as u64)
    }

    fn capture_invalidate(&self, s: usize) {
        self.bind();
        if let Ok(st) = self.stream(s) {
            // SAFETY: a work stream of this context. Querying a capturing stream is illegal
            // during capture: the driver answers with an error and invalidates it.
            let _ = unsafe { cu::cuStreamQuery(st) };
        }
    }

    fn graph_instantiate(&self, graph: u64, flags: u64) -> GpuResult<u64> {
        self.bind();
        let mut e = std::ptr::null_mut();
        // SAFETY: the session checked `graph` is one of this client's graphs.
        ck(unsafe { cu::cuGraphInstantiateWithFlags(&mut e, graph as cu::CUgraph, flags) })?;
        Ok(e as u64)
    }

    fn graph_launch(&self, exec: u64, s: usize) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        // SAFETY: the session checked `exec` is one of this client's executable graphs.
        ck(unsafe { cu::cuGraphLaunch(exec as cu::CUgraphExec, st) })
    }

    fn graph_upload(&self, exec: u64, s: usize) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        // SAFETY: as graph_launch.
        ck(unsafe { cu::cuGraphUpload(exec as cu::CUgraphExec, st) })
    }

    fn graph_destroy(&self, graph: u64) -> GpuResult<()> {
        self.bind();
        // SAFETY: one of a client's graphs, given up by it.
        ck(unsafe { cu::cuGraphDestroy(graph as cu::CUgraph) })
    }

    fn graph_nodes(&self, graph: u64) -> GpuResult<Vec<u64>> {
        self.bind();
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

    fn graph_memory_ranges(&self, graph: u64) -> GpuResult<Vec<(u64, u64)>> {
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
            for node in self.graph_nodes(g)? {
                let n = node as cu::CUgraphNode;
                match self.graph_node_type(node)? {
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
                        let mut p = Memcpy3dRaw::default();
                        // SAFETY: a memcpy node of one of the client's graphs; Memcpy3dRaw
                        // has CUDA_MEMCPY3D's layout (checked below it) with plain integers
                        // where cudarc has enums, so any value the driver writes is valid.
                        ck(unsafe {
                            cu::cuGraphMemcpyNodeGetParams(
                                n,
                                (&mut p as *mut Memcpy3dRaw).cast::<cu::CUDA_MEMCPY3D>(),
                            )
                        })?;
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
                                out.push((
                                    at,
                                    span(p.WidthInBytes, p.Height, p.Depth, pitch, rows),
                                ));
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
                        type GetParams = unsafe extern "C" fn(
                            cu::CUgraphNode,
                            *mut cu::CUgraphNodeParams,
                        ) -> c_int;
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
                                graphs.extend(
                                    (0..c.size as usize).map(|i| *c.phGraph_out.add(i) as u64),
                                );
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

    fn graph_node_type(&self, node: u64) -> GpuResult<u32> {
        self.bind();
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

    fn graph_create(&self) -> GpuResult<u64> {
        self.bind();
        let mut g = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; flags 0.
        ck(unsafe { cu::cuGraphCreate(&mut g, 0) })?;
        Ok(g as u64)
    }

    fn cond_handle(&self, graph: u64, value: u32, flags: u32) -> GpuResult<u64> {
        self.bind();
        let mut h: cu::CUgraphConditionalHandle = 0;
        // SAFETY: one of the client's graphs; the server's context; a valid out-pointer.
        ck(unsafe {
            cu::cuGraphConditionalHandleCreate(&mut h, graph as cu::CUgraph, self.ctx, value, flags)
        })?;
        Ok(h)
    }

    fn capture_conditional(
        &self,
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
            ctx: self.ctx,
        };
        self.add_at_capture(s, graph_ok, |node, graph, deps, n| {
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

    fn capture_begin_to(&self, s: usize, graph: u64) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
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

    fn graph_clone(&self, graph: u64) -> GpuResult<u64> {
        self.bind();
        let mut g = std::ptr::null_mut();
        // SAFETY: one of the client's graphs; a valid out-pointer.
        ck(unsafe { cu::cuGraphClone(&mut g, graph as cu::CUgraph) })?;
        Ok(g as u64)
    }

    fn capture_child(&self, s: usize, child: u64) -> GpuResult<()> {
        self.add_at_capture(s, &|_| true, |node, graph, deps, n| {
            // SAFETY: the capture's graph and its dependencies as the driver gave them;
            // one of the client's graphs, which the driver copies into the node.
            unsafe { cu::cuGraphAddChildGraphNode(node, graph, deps, n, child as cu::CUgraph) }
        })
    }

    fn graph_exec_update(&self, exec: u64, graph: u64) -> GpuResult<()> {
        self.bind();
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

    fn graph_clear(&self, graph: u64) -> GpuResult<()> {
        for n in self.graph_nodes(graph)? {
            // SAFETY: a node of one of the client's graphs, listed just now.
            ck(unsafe { cu::cuGraphDestroyNode(n as cu::CUgraphNode) })?;
        }
        Ok(())
    }

    fn graph_exec_destroy(&self, exec: u64) -> GpuResult<()> {
        self.bind();
        // SAFETY: one of a client's executable graphs, given up by it.
        ck(unsafe { cu::cuGraphExecDestroy(exec as cu::CUgraphExec) })
    }

    fn event_elapsed(&self, start: u64, end: u64) -> GpuResult<f32> {
        self.bind();
        let mut ms = 0f32;
        // SAFETY: live events, valid out-pointer.
        ck(unsafe {
            cu::cuEventElapsedTime_v2(&mut ms, start as cu::CUevent, end as cu::CUevent)
        })?;
        Ok(ms)
    }

    fn write_device_u32(&self, dptr: u64, value: u32, s: usize) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        // SAFETY: live stream; the session checked that dptr..dptr+4 is the client's.
        ck(unsafe { cu::cuStreamWriteValue32_v2(st, dptr, value, 0) })
    }

    fn array_create(&self, shape: &crate::gpu::ArrayShape) -> GpuResult<(u64, u64)> {
        self.bind();
        crate::gpu::cuda::arrays::array_create(shape)
    }

    fn mipmap_create(&self, shape: &crate::gpu::ArrayShape, levels: u32) -> GpuResult<(u64, u64)> {
        self.bind();
        crate::gpu::cuda::arrays::mipmap_create(shape, levels)
    }

    fn mipmap_level(&self, mip: u64, level: u32) -> GpuResult<u64> {
        self.bind();
        crate::gpu::cuda::arrays::mipmap_level(mip, level)
    }

    fn array_destroy(&self, array: u64) -> GpuResult<()> {
        self.bind();
        crate::gpu::cuda::arrays::array_destroy(array)
    }

    fn mipmap_destroy(&self, mip: u64) -> GpuResult<()> {
        self.bind();
        crate::gpu::cuda::arrays::mipmap_destroy(mip)
    }

    fn array_copy(
        &self,
        src: &crate::gpu::CopyPlace,
        dst: &crate::gpu::CopyPlace,
        extent: [u64; 3],
        s: usize,
    ) -> GpuResult<()> {
        self.bind();
        let st = self.stream(s)?;
        crate::gpu::cuda::arrays::array_copy(src, dst, extent, st as usize)
    }

    fn tex_create(
        &self,
        res: &crate::gpu::Resource,
        tex: &[u32; 26],
        view: Option<&[u32; 28]>,
    ) -> GpuResult<u64> {
        self.bind();
        crate::gpu::cuda::arrays::tex_create(res, tex, view)
    }

    fn tex_destroy(&self, tex: u64) -> GpuResult<()> {
        self.bind();
        crate::gpu::cuda::arrays::tex_destroy(tex)
    }

    fn surf_create(&self, array: u64) -> GpuResult<u64> {
        self.bind();
        crate::gpu::cuda::arrays::surf_create(array)
    }

    fn surf_destroy(&self, surf: u64) -> GpuResult<()> {
        self.bind();
        crate::gpu::cuda::arrays::surf_destroy(surf)
    }

    fn flush_printf(&self) -> GpuResult<()> {
        self.bind();
        let st = self.printf_stream.load(Ordering::Acquire);
        // SAFETY: a live stream of this context with no work, so this returns at once
        // (measured 20-90 us on an H100, also with other streams busy).
        ck(unsafe { cu::cuStreamSynchronize(st) })
    }

    fn stream_query(&self, s: usize) -> GpuResult<bool> {
        self.bind();
        let st = self.stream(s)?;
        // SAFETY: live stream.
        match unsafe { cu::cuStreamQuery(st) } {
            cu::CUresult::CUDA_SUCCESS => Ok(true),
            cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(CuError(e as i32)),
        }
    }
}

impl CudaGpu {
    /// Pinned device memory of this GPU, not exportable (clients share it through the
    /// server's tokens, ipc.rs), compressible if asked: what omps' clients may create.
    fn vmm_prop(&self, compressible: bool) -> cu::CUmemAllocationProp {
        cu::CUmemAllocationProp {
            type_: cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: cu::CUmemLocation {
                type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.dev,
            },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: cu::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: u8::from(compressible),
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }
}

/// Export table 1734dc26 (cluster support): [4] allocates and fills the current context's
/// TPC-to-vGPC and TPC-in-GPC byte maps, [13] frees them. cuBLASLt reads them to pick
/// kernels, so a client must get the driver's bytes. The driver does not say how long the
/// maps are; they come from its malloc heap, so the usable size of each allocation bounds
/// what may be read.
fn read_tpc_maps(s: &mut DeviceSnapshot) {
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

/// CUDA_MEMCPY3D as the driver writes it: cudarc's has Rust enums for the memory types,
/// which have no zero and cannot hold a value a newer driver might write, so neither a
/// zeroed one nor one the driver filled is safe to have (zeroing it panics).
#[repr(C)]
#[derive(Default)]
#[allow(non_snake_case)]
struct Memcpy3dRaw {
    srcXInBytes: usize,
    srcY: usize,
    srcZ: usize,
    srcLOD: usize,
    srcMemoryType: u32,
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
    dstMemoryType: u32,
    dstHost: usize,
    dstDevice: u64,
    dstArray: usize,
    reserved1: usize,
    dstPitch: usize,
    dstHeight: usize,
    WidthInBytes: usize,
    Height: usize,
    Depth: usize,
}

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<Memcpy3dRaw>() == size_of::<cu::CUDA_MEMCPY3D>());
    assert!(align_of::<Memcpy3dRaw>() == align_of::<cu::CUDA_MEMCPY3D>());
    assert!(offset_of!(Memcpy3dRaw, srcHost) == offset_of!(cu::CUDA_MEMCPY3D, srcHost));
    assert!(offset_of!(Memcpy3dRaw, dstMemoryType) == offset_of!(cu::CUDA_MEMCPY3D, dstMemoryType));
    assert!(offset_of!(Memcpy3dRaw, Depth) == offset_of!(cu::CUDA_MEMCPY3D, Depth));
};
