//! The small GPU interface the server core is written against.
//!
//! [`crate::gpu::cuda::CudaGpu`] implements it with the CUDA driver; [`crate::gpu::host::HostGpu`]
//! implements it with host memory so the core (sessions, validation, bookkeeping, client
//! death) is tested on machines without a GPU. Streams are indices into a fixed set laid
//! out by [`crate::sched::placement::Layout`]: work streams in priority classes, on the whole
//! device and in SM confinements.
//! No method blocks on the GPU.

pub mod cuda;
pub mod features;
pub mod host;
pub mod nvml;
pub mod work_times;

use omps_ring::segment::DeviceSnapshot;

/// A CUresult other than CUDA_SUCCESS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CuError(pub i32);

pub type GpuResult<T> = Result<T, CuError>;

/// CUresult values the server produces itself.
pub mod code {
    pub const SUCCESS: i32 = 0;
    pub const INVALID_VALUE: i32 = 1;
    pub const OUT_OF_MEMORY: i32 = 2;
    pub const NOT_INITIALIZED: i32 = 3;
    pub const NO_DEVICE: i32 = 100;
    pub const INVALID_IMAGE: i32 = 200;
    pub const INVALID_DEVICE: i32 = 101;
    pub const INVALID_HANDLE: i32 = 400;
    pub const NOT_FOUND: i32 = 500;
    pub const NOT_READY: i32 = 600;
    pub const ILLEGAL_ADDRESS: i32 = 700;
    pub const ASSERT: i32 = 710;
    pub const NOT_PERMITTED: i32 = 800;
    pub const LAUNCH_FAILED: i32 = 719;
    pub const NOT_SUPPORTED: i32 = 801;
    pub const PEER_ACCESS_UNSUPPORTED: i32 = 217;
    pub const MPS_CONNECTION_FAILED: i32 = 805;
    pub const MPS_RPC_FAILURE: i32 = 806;
    pub const MPS_SERVER_NOT_READY: i32 = 807;
    pub const MPS_MAX_CLIENTS_REACHED: i32 = 808;
    pub const MPS_CLIENT_TERMINATED: i32 = 810;
    pub const ILLEGAL_STATE: i32 = 401;
    pub const STREAM_CAPTURE_UNSUPPORTED: i32 = 900;
    pub const STREAM_CAPTURE_INVALIDATED: i32 = 901;
    pub const STREAM_CAPTURE_UNMATCHED: i32 = 903;
    pub const UNKNOWN: i32 = 999;
}

/// Errors that poison a context: after one, nothing more runs in it until it is reset.
/// ECC (214), illegal address (700), launch timeout (702), device assert (710), and the
/// kernel exceptions 714..=719 (stack, instruction, alignment, address space, pc, launch).
pub fn is_sticky(e: i32) -> bool {
    matches!(e, 214 | 700 | 702 | 710 | 714..=719)
}

/// CUfunction_attribute values the server asks for at module load.
pub mod func_attr {
    pub const MAX_THREADS_PER_BLOCK: i32 = 0;
    pub const SHARED_SIZE_BYTES: i32 = 1;
    pub const MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;
}

/// A graph's profiling twin (docs/design.md 12b, design G): a copy of the graph with an
/// event-record node before and after each kernel node, instantiated.
#[derive(Debug)]
pub struct ProfileTwin {
    pub exec: u64,
    /// The instrumented copy the twin was made from, destroyed with it.
    pub graph: u64,
    /// The event every record node names until a launch points it at the client's own.
    pub placeholder: u64,
    /// Per kernel node, in the graph's node order.
    pub nodes: Vec<TimedNode>,
}

/// A kernel node of a twin: its two event-record nodes and its launch shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedNode {
    pub start: u64,
    pub end: u64,
    pub work: TimedWork,
}

/// What a timed node of a twin does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimedWork {
    Kernel {
        func: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
    },
    Memset {
        value: u32,
        bytes: u64,
    },
    /// The two sides' CUmemorytype (1 host, 2 device, 3 array, 4 unified).
    Memcpy {
        src: u8,
        dst: u8,
        bytes: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionInfo {
    pub handle: u64,
    pub name: String,
    pub max_threads_per_block: i32,
    pub static_shared: i32,
    pub max_dynamic_shared: i32,
    /// (offset, size) of each parameter, in order.
    pub params: Vec<(u32, u32)>,
}

impl FunctionInfo {
    /// Bytes of the packed parameter buffer a launch must carry.
    pub fn args_size(&self) -> usize {
        self.params
            .iter()
            .map(|&(o, s)| o as usize + s as usize)
            .max()
            .unwrap_or(0)
    }
}

#[derive(Clone, Debug)]
pub struct LoadedModule {
    pub handle: u64,
    pub functions: Vec<FunctionInfo>,
}

/// Run lengths [`Gpu::launch_run`] takes: a session cuts a run into these, longest first,
/// and launches what is left under the shortest one by one.
pub const RUN_LENGTHS: [usize; 4] = [32, 16, 8, 4];

/// One kernel launch without attributes, as a run of them reaches [`Gpu::launch_run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlainLaunch<'a> {
    pub func: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared: u32,
    pub args: &'a [u8],
}

pub trait Gpu: Send + Sync + 'static {
    fn ordinal(&self) -> usize;
    fn snapshot(&self) -> DeviceSnapshot;
    /// How its streams are laid out.
    fn layout(&self) -> crate::sched::placement::Layout;
    /// Recreates the context after a fault (no client is left): every handle is gone.
    fn reset(&self) -> GpuResult<()>;
    /// What cuDeviceGetP2PAttribute says of this GPU and GPU `peer` (attribute `a` at
    /// `a - 1`): all zero where this GPU cannot reach the other directly.
    fn peer_attributes(&self, _peer: usize) -> [i32; omps_ring::segment::P2P_ATTRIBUTES] {
        [0; omps_ring::segment::P2P_ATTRIBUTES]
    }
    /// Enables direct access from this GPU's context to GPU `peer`'s memory (done once:
    /// later calls answer at once). Every allocation in a context with peer access is
    /// mapped on the peer too, which makes cuMemAlloc dearer, so it is enabled only when a
    /// client asks.
    fn enable_peer(&self, _peer: usize) -> GpuResult<()> {
        Err(CuError(code::PEER_ACCESS_UNSUPPORTED))
    }
    /// Whether `enable_peer` gave this GPU's context direct access to GPU `peer`.
    fn reaches(&self, _peer: usize) -> bool {
        false
    }
    /// All streams: work, marker and high-priority work streams.
    fn stream_count(&self) -> usize {
        self.layout().total()
    }
    /// How its SMs divide into chunks ([`crate::sched::confine`]).
    fn sm_chunks(&self) -> crate::sched::confine::SmChunks;
    /// Holds the streams of confinement `slot` (made at first use) to the SMs of `set`
    /// from now on; the SMs it got. Waits for all running work (a green context's
    /// creation does): call it before clients run, or accept the wait.
    fn confine(&self, slot: usize, set: &crate::sched::confine::SmSet) -> GpuResult<u32>;

    fn mem_alloc(&self, size: u64) -> GpuResult<u64>;
    /// Only called once the memory is idle (after a fence).
    fn mem_free(&self, ptr: u64) -> GpuResult<()>;
    /// As `mem_free`, without waiting for the GPU or holding up other threads' work (the
    /// driver's cuMemFree does both).
    fn mem_free_async(&self, ptr: u64) -> GpuResult<()> {
        self.mem_free(ptr)
    }
    /// Waits until the frees `mem_free_async` queued so far have given their memory back
    /// (they wait for nothing else).
    fn settle_frees(&self) -> GpuResult<()> {
        Ok(())
    }
    fn mem_info(&self) -> GpuResult<(u64, u64)>;

    /// Virtual memory (cuMemAddressReserve and friends), on this GPU only, read-write.
    fn vmm_reserve(&self, size: u64, align: u64, hint: u64) -> GpuResult<u64>;
    fn vmm_address_free(&self, ptr: u64, size: u64) -> GpuResult<()>;
    /// New physical memory, compressible if asked and the GPU grants it: the handle and
    /// whether it is compressible (what cuMemGetAllocationPropertiesFromHandle reports).
    fn vmm_create(&self, size: u64, compressible: bool) -> GpuResult<(u64, bool)>;
    fn vmm_release(&self, handle: u64) -> GpuResult<()>;
    fn vmm_map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> GpuResult<()>;
    fn vmm_unmap(&self, ptr: u64, size: u64) -> GpuResult<()>;
    /// Read-write access to the mapped range for each of the server's GPUs `gpus`.
    fn vmm_set_access(&self, ptr: u64, size: u64, gpus: &[usize]) -> GpuResult<()>;
    fn vmm_granularity(&self, recommended: bool, compressible: bool) -> GpuResult<u64>;

    /// JIT-links `inputs` (CUjitInputType, name, bytes) with value `options`; the image,
    /// or the error, and the info and error logs.
    fn link(
        &self,
        options: &[(u32, u64)],
        inputs: &[(u32, &str, &[u8])],
    ) -> (GpuResult<Vec<u8>>, String, String);

    /// Loads NUL-terminated `ptx` compiled with value `options`, as cuModuleLoadDataEx
    /// does (a whole program, where a link compiles relocatable code, which old PTX
    /// cannot be); the module, or the error, and the info and error logs.
    fn module_load_jit(
        &self,
        ptx: &[u8],
        options: &[(u32, u64)],
    ) -> (GpuResult<LoadedModule>, String, String);

    /// A TMA descriptor, encoded by the driver (`old` is the one ReplaceAddress edits).
    fn tensor_map(
        &self,
        t: &omps_ring::wire::TensorMap,
        old: Option<&[u8; 128]>,
    ) -> GpuResult<[u8; 128]>;

    /// # Safety
    /// `src..src+len` is readable host memory registered with [`Gpu::register_host`] that
    /// stays so until the copy is known complete.
    unsafe fn copy_htod(&self, dst: u64, src: *const u8, len: usize, s: usize) -> GpuResult<()>;
    /// # Safety
    /// As [`Gpu::copy_htod`], for writable memory.
    unsafe fn copy_dtoh(&self, dst: *mut u8, src: u64, len: usize, s: usize) -> GpuResult<()>;
    fn copy_dtod(&self, dst: u64, src: u64, len: usize, s: usize) -> GpuResult<()>;
    fn memset(&self, dst: u64, value: u32, elem_size: u32, count: usize, s: usize)
        -> GpuResult<()>;
    /// Stores `value` into the host word at `addr` once the stream reaches this point.
    ///
    /// # Safety
    /// `addr` lies in registered host memory that stays registered until it is written.
    unsafe fn write_u32(&self, addr: *mut u32, value: u32, s: usize) -> GpuResult<()>;
    /// Makes stream `s` wait until the host word at `addr` reaches `value` (a wrapping
    /// greater-or-equal).
    ///
    /// # Safety
    /// `addr` lies in registered host memory that stays registered while the wait may run.
    unsafe fn wait_u32(&self, addr: *mut u32, value: u32, s: usize) -> GpuResult<()>;
    /// As `wait_u32`, until the word equals `value` (a graph's host node, whose words go
    /// back and forth rather than grow).
    ///
    /// # Safety
    /// As `wait_u32`.
    unsafe fn wait_u32_eq(&self, addr: *mut u32, value: u32, s: usize) -> GpuResult<()>;
    /// Stores `value` into device memory at `dptr` (4-byte aligned) in stream order.
    fn write_device_u32(&self, dptr: u64, value: u32, s: usize) -> GpuResult<()>;

    /// Pins and maps host memory for DMA and for stream writes.
    ///
    /// # Safety
    /// The range stays mapped until [`Gpu::unregister_host`].
    unsafe fn register_host(&self, ptr: *mut u8, len: usize) -> GpuResult<()>;
    /// # Safety
    /// No transfer to or from the range is still in flight.
    unsafe fn unregister_host(&self, ptr: *mut u8) -> GpuResult<()>;
    /// Whether no stream has work queued or running (an unregistration would wait for
    /// nothing); may be called from any thread.
    fn quiet(&self) -> bool;

    fn module_load(&self, image: &[u8]) -> GpuResult<LoadedModule>;
    /// Device memory a module loaded from `image` takes for its variables (`__device__`,
    /// `__constant__`, `__managed__`), read from the image before it is loaded: it counts
    /// against the loading client's memory limit.
    fn image_data_bytes(&self, image: &[u8]) -> u64;
    fn module_unload(&self, module: u64) -> GpuResult<()>;
    fn module_global(&self, module: u64, name: &str) -> GpuResult<(u64, u64)>;
    fn func_attribute(&self, func: u64, attr: i32) -> GpuResult<i32>;
    fn func_set_attribute(&self, func: u64, attr: i32, value: i32) -> GpuResult<()>;
    /// A wire::query question; `func` is the function handle (0 when none), `attrs`
    /// launch attributes for the cluster questions.
    fn query(&self, kind: u32, func: u64, args: [i64; 7], attrs: &[u8]) -> GpuResult<i64>;
    /// `attrs` holds CUlaunchAttribute records (wire::LAUNCH_ATTR_BYTES each), already
    /// checked to be forwardable.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        func: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        s: usize,
        attrs: &[u8],
        args: &[u8],
    ) -> GpuResult<()>;

    /// Whether launches on work stream `s` should be gathered into runs for
    /// [`Gpu::launch_run`] at all (off: each launch goes to the driver as it is read).
    fn takes_runs(&self, _s: usize) -> bool {
        false
    }

    /// Queues `run`, launches without attributes in order, on work stream `s` as one
    /// submission where the GPU can (gpu/cuda/batch.rs). Err: nothing of it was queued,
    /// and the caller launches them one by one.
    fn launch_run(&self, _s: usize, _run: &[PlainLaunch<'_>]) -> GpuResult<()> {
        Err(CuError(code::NOT_SUPPORTED))
    }

    fn event_create(&self, flags: u32) -> GpuResult<u64>;
    fn event_destroy(&self, ev: u64) -> GpuResult<()>;
    fn event_record(&self, ev: u64, s: usize) -> GpuResult<()>;
    fn stream_wait_event(&self, s: usize, ev: u64) -> GpuResult<()>;
    /// With CU_EVENT_RECORD_EXTERNAL / CU_EVENT_WAIT_EXTERNAL: inside a capture, a node
    /// of the graph rather than an edge; elsewhere as the plain forms.
    fn event_record_external(&self, ev: u64, s: usize) -> GpuResult<()> {
        self.event_record(ev, s)
    }
    fn stream_wait_event_external(&self, s: usize, ev: u64) -> GpuResult<()> {
        self.stream_wait_event(s, ev)
    }
    /// Ok(true) when complete, Ok(false) when not yet.
    fn event_query(&self, ev: u64) -> GpuResult<bool>;
    fn event_elapsed(&self, start: u64, end: u64) -> GpuResult<f32>;
    /// Ok(true) when idle, Ok(false) when work is pending; an error is sticky.
    fn stream_query(&self, s: usize) -> GpuResult<bool>;

    /// Begins capturing stream `s` (in the driver's relaxed mode: the server's other
    /// threads are never restricted; the client's mode is the shim's to enforce).
    fn capture_begin(&self, s: usize) -> GpuResult<()>;
    /// Ends the capture of stream `s`: the graph.
    fn capture_end(&self, s: usize) -> GpuResult<u64>;
    /// Stream `s`'s capture status (wire::graph) and capture id.
    fn capture_status(&self, s: usize) -> GpuResult<(u32, u64)>;
    /// The graph stream `s`'s active capture goes into.
    fn capture_graph(&self, s: usize) -> GpuResult<u64>;
    /// Invalidates stream `s`'s capture, as an operation illegal during capture does.
    fn capture_invalidate(&self, s: usize);
    fn graph_instantiate(&self, graph: u64, flags: u64) -> GpuResult<u64>;
    fn graph_launch(&self, exec: u64, s: usize) -> GpuResult<()>;
    fn graph_upload(&self, exec: u64, s: usize) -> GpuResult<()>;
    fn graph_destroy(&self, graph: u64) -> GpuResult<()>;
    fn graph_exec_destroy(&self, exec: u64) -> GpuResult<()>;
    /// The nodes of `graph`, in the driver's order.
    fn graph_nodes(&self, graph: u64) -> GpuResult<Vec<u64>>;
    /// A node's CUgraphNodeType.
    fn graph_node_type(&self, node: u64) -> GpuResult<u32>;
    /// An empty graph.
    fn graph_create(&self) -> GpuResult<u64>;
    /// A conditional handle of `graph` with default launch value `value`.
    fn cond_handle(&self, graph: u64, value: u32, flags: u32) -> GpuResult<u64>;
    /// Adds a conditional node (handle, CUgraphConditionalNodeType, bodies) where stream
    /// `s`'s capture stands, which continues after it, if `graph_ok` accepts the
    /// capture's graph (else CUDA_ERROR_INVALID_VALUE): the node's body graphs.
    fn capture_conditional(
        &self,
        s: usize,
        handle: u64,
        kind: u32,
        size: u32,
        graph_ok: &dyn Fn(u64) -> bool,
    ) -> GpuResult<Vec<u64>>;
    /// Begins capturing stream `s` into `graph` (relaxed, as [`Gpu::capture_begin`]).
    fn capture_begin_to(&self, s: usize, graph: u64) -> GpuResult<()>;
    /// Destroys every node of `graph` (its conditional handles stay).
    fn graph_clear(&self, graph: u64) -> GpuResult<()>;
    /// A copy of `graph`.
    fn graph_clone(&self, graph: u64) -> GpuResult<u64>;
    /// Adds a child-graph node of (a copy of) `child` where stream `s`'s capture stands,
    /// which continues after it.
    fn capture_child(&self, s: usize, child: u64) -> GpuResult<()>;
    /// Executable graph `exec` takes the parameters of `graph`, of the same topology.
    fn graph_exec_update(&self, exec: u64, graph: u64) -> GpuResult<()>;
    /// The device memory `graph`'s memset and memcpy nodes write or read, child graphs' and
    /// conditional bodies' included, as (address, bytes): what a launch of its executable
    /// graph must still find the client's (issue 23, finding 9).
    fn graph_memory_ranges(&self, graph: u64) -> GpuResult<Vec<(u64, u64)>>;
    /// `graph`'s profiling twin, instantiated with `flags` (the original's): see
    /// [`ProfileTwin`]. NOT_SUPPORTED for a graph a copy cannot stand in for.
    fn graph_profile_twin(&self, graph: u64, flags: u64) -> GpuResult<ProfileTwin>;
    /// Points event-record node `node` of executable graph `exec` at `event`.
    fn graph_exec_set_event(&self, exec: u64, node: u64, event: u64) -> GpuResult<()>;
    /// Destroys a twin's executable graph, graph and placeholder event.
    fn graph_profile_twin_destroy(&self, twin: &ProfileTwin);

    /// GPU-side timing of traced clients' work (docs/design.md 12b, design S), counted:
    /// each traced session starts it once and stops it once. True when this backend times
    /// work with the GPU's own records; false leaves the session's spans to events.
    fn timer_start(&self) -> bool {
        false
    }
    fn timer_stop(&self) {}
    /// The driver work the calling thread queues until [`Gpu::timer_end`] is work of `key`.
    fn timer_begin(&self, _key: u64) {}
    fn timer_end(&self) {}
    /// The start and end (CLOCK_MONOTONIC ns) of `key`'s work, once known; asked once.
    fn timer_take(&self, _key: u64) -> Option<(u64, u64)> {
        None
    }
    /// Asks for the records of finished work the backend has not been given yet.
    fn timer_settle(&self) {}

    /// A CUDA array of `shape`: its handle and the bytes it takes.
    fn array_create(&self, shape: &ArrayShape) -> GpuResult<(u64, u64)>;
    /// A mipmapped array of `shape` with `levels` levels: its handle and its bytes.
    fn mipmap_create(&self, shape: &ArrayShape, levels: u32) -> GpuResult<(u64, u64)>;
    /// Level `level` of mipmapped array `mip` (an array the mipmapped array owns).
    fn mipmap_level(&self, mip: u64, level: u32) -> GpuResult<u64>;
    fn array_destroy(&self, array: u64) -> GpuResult<()>;
    fn mipmap_destroy(&self, mip: u64) -> GpuResult<()>;
    /// A 3D copy (`extent`: bytes per row, rows, slices) between arrays and device memory,
    /// in stream `s`'s order.
    fn array_copy(
        &self,
        src: &CopyPlace,
        dst: &CopyPlace,
        extent: [u64; 3],
        s: usize,
    ) -> GpuResult<()>;
    /// A texture object over `res` (CUDA_TEXTURE_DESC and CUDA_RESOURCE_VIEW_DESC as
    /// cuda.h lays them out, checked by the driver): the object's value.
    fn tex_create(
        &self,
        res: &Resource,
        tex: &[u32; 26],
        view: Option<&[u32; 28]>,
    ) -> GpuResult<u64>;
    fn tex_destroy(&self, tex: u64) -> GpuResult<()>;
    /// A surface object over array `array`.
    fn surf_create(&self, array: u64) -> GpuResult<u64>;
    fn surf_destroy(&self, surf: u64) -> GpuResult<()>;

    /// Makes the driver write out the context's device printf buffer (see [`crate::client::printf`])
    /// without waiting for any work; may be called from any thread.
    fn flush_printf(&self) -> GpuResult<()>;
    /// Where printf output (`out`) and assert messages (`err`) go, for a GPU that does not
    /// write to fds 1 and 2 itself.
    fn set_printf_output(&self, _out: std::os::fd::RawFd, _err: std::os::fd::RawFd) {}
}

/// A CUDA array's shape: CUDA_ARRAY3D_DESCRIPTOR's fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArrayShape {
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
}

/// One side of an array copy: an array (the driver's handle; `x` in bytes) or device
/// memory at `dev` with its pitch and height.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyPlace {
    pub array: Option<u64>,
    pub x: u64,
    pub y: u64,
    pub z: u64,
    pub dev: u64,
    pub pitch: u64,
    pub height: u64,
}

/// What a texture object reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    Array(u64),
    Mipmapped(u64),
    Linear {
        dev: u64,
        format: u32,
        channels: u32,
        size: u64,
    },
    Pitch2D {
        dev: u64,
        format: u32,
        channels: u32,
        width: u64,
        height: u64,
        pitch: u64,
    },
}

/// The most mip levels an array can have: one per halving of a 64-bit extent.
pub const MAX_MIP_LEVELS: u32 = 64;

/// What an array of `shape` with `levels` mip levels (0: a plain array) is charged: its
/// texels, each level half the last; formats the server does not know count 4 bytes a
/// channel. Saturates rather than overflow on a hostile shape (the driver refuses it).
pub fn shape_bytes(shape: &ArrayShape, levels: u32) -> u64 {
    let per = shape.channels as u64 * format_bytes(shape.format).unwrap_or(4);
    // No shape has more levels than a 64-bit extent halves in (the session refuses more):
    // a client's 4 billion would be 4 billion turns of this loop on its worker.
    (0..levels.clamp(1, MAX_MIP_LEVELS))
        .map(|l| {
            let half = |v: u64| {
                if v == 0 {
                    1
                } else {
                    v.checked_shr(l).unwrap_or(0).max(1)
                }
            };
            half(shape.width)
                .saturating_mul(half(shape.height))
                .saturating_mul(half(shape.depth))
                .saturating_mul(per)
        })
        .fold(0u64, u64::saturating_add)
}

pub use omps_ring::wire::array::format_bytes;
