//! What a host GPU is made of: its memory, modules, streams' recorded work and the
//! switches tests turn, kept apart from its methods (device.rs, replay.rs, queues.rs) that
//! all read it.

use super::ops::HostOp;
use super::profile::HostProfile;
use crate::gpu::{ArrayShape, FunctionInfo, Resource};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// (name, address, size) of a module global.
pub(super) type Global = (String, u64, u64);

#[derive(Default)]
pub(super) struct State {
    pub(super) mem: BTreeMap<u64, Vec<u8>>,
    /// Bytes freed with `mem_free_async` and still held, as the driver's memory pool holds
    /// them until the next synchronization ([`Gpu::settle_frees`]).
    pub(super) held_by_frees: u64,
    pub(super) next_addr: u64,
    pub(super) modules: BTreeMap<u64, (Vec<FunctionInfo>, Vec<Global>)>,
    pub(super) next_handle: u64,
    /// Host ranges registered with the driver, shared by the GPUs of one group: a
    /// registration is portable (every context reaches it), as the server makes them.
    pub(super) registered: Arc<Mutex<Vec<(usize, usize)>>>,
    pub(super) sticky: Option<i32>,
    pub(super) events: BTreeMap<u64, ()>,
    pub(super) printf_buffer: Vec<u8>,
    /// Messages of failed asserts, written to the err descriptor.
    pub(super) assert_buffer: Vec<u8>,
    /// Context limits that were set (CUlimit 0..=6 exist; each defaults to 1024).
    pub(super) limits: BTreeMap<i64, i64>,
    /// A module whose code calls `malloc` or `free` was loaded: the driver allocated the
    /// heap then, and its size (CU_LIMIT_MALLOC_HEAP_SIZE) no longer changes.
    pub(super) heap_fixed: bool,
    /// cuCtxResetPersistingL2Cache calls.
    pub(super) l2_resets: usize,
    /// VMM, shared by the GPUs of one machine (crate::gpu::host::machine_vmm).
    pub(super) vmm: Arc<Mutex<crate::gpu::host::machine_vmm::VmmSpace>>,
    /// This GPU's ordinal: which access of a mapping is its own.
    pub(super) ordinal: usize,
    /// Confinement slot -> the SM set its streams are held to.
    pub(super) confined: BTreeMap<usize, crate::sched::confine::SmSet>,
    /// Streams being captured: capture id, whether invalidated, the work recorded.
    pub(super) capturing: BTreeMap<usize, (u64, bool, Vec<HostOp>)>,
    /// Streams a capture forked into (they waited on an event it recorded) -> its origin.
    pub(super) joined: BTreeMap<usize, usize>,
    /// Events last recorded in a capture -> that capture's origin stream.
    pub(super) event_capture: BTreeMap<u64, usize>,
    /// Graphs and executable graphs: the work they replay.
    pub(super) graphs: BTreeMap<u64, Vec<HostOp>>,
    pub(super) execs: BTreeMap<u64, Vec<HostOp>>,
    /// CUDA arrays: shape and contents (rows of width x channels x format bytes).
    pub(super) arrays: BTreeMap<u64, (ArrayShape, Vec<u8>)>,
    /// Mipmapped arrays: their levels' arrays.
    pub(super) mipmaps: BTreeMap<u64, Vec<u64>>,
    /// Texture and surface objects: what each is over.
    pub(super) textures: BTreeMap<u64, Resource>,
    pub(super) surfaces: BTreeMap<u64, u64>,
    /// Conditional handles: default value, flags, value now.
    pub(super) conds: BTreeMap<u64, (u32, u32, u32)>,
    /// Streams capturing into a given graph -> that graph.
    pub(super) capture_into: BTreeMap<usize, u64>,
    /// Conditional handles an executable graph holds.
    pub(super) cond_bound: std::collections::BTreeSet<u64>,
}

pub struct HostGpu {
    pub(super) ordinal: usize,
    pub(super) total: u64,
    pub(super) profile: HostProfile,
    pub(super) printf_fd: std::sync::atomic::AtomicI32,
    pub(super) assert_fd: std::sync::atomic::AtomicI32,
    pub(super) flushes: std::sync::atomic::AtomicU64,
    /// While set, frees and unloads wait, as the driver's do behind a long kernel.
    pub(super) stuck: std::sync::Mutex<bool>,
    /// While set, module unloads alone wait: a kernel that never ends runs on some stream,
    /// and cuModuleUnload waits for every running kernel, whatever its module, while other
    /// streams' work still completes (`hold_unloads`).
    pub(super) unloads_held: std::sync::Mutex<bool>,
    pub(super) unloads_go: std::sync::Condvar,
    pub(super) unstuck: std::sync::Condvar,
    pub(super) completions: std::sync::atomic::AtomicUsize,
    /// How long after it is recorded an event passes (microseconds; 0: at once), as a
    /// fence a real GPU has not reached yet; and when each was recorded.
    pub(super) fence_lag_us: std::sync::atomic::AtomicU64,
    pub(super) recorded: Mutex<BTreeMap<u64, std::time::Instant>>,
    /// While set, context resets fail (CUDA_ERROR_NOT_PERMITTED), as the H100's did after
    /// a fault.
    pub(super) resets_fail: std::sync::atomic::AtomicBool,
    /// Plays a driver without cuGraphNodeGetParams (CUDA 13.0): a conditional node's
    /// bodies are not read with its graph's memory ranges.
    pub(super) cond_bodies_hidden: std::sync::atomic::AtomicBool,
    /// Makes reading a graph's memory ranges fail (a node the driver will not describe).
    pub(super) graph_reads_fail: std::sync::atomic::AtomicBool,
    /// Module loads asked of it.
    pub(super) loads: std::sync::atomic::AtomicUsize,
    /// How long a load, JIT compile or link of an image holding [`super::setup::SLOW_LOAD`] takes.
    pub(super) slow_load: Mutex<std::time::Duration>,
    /// Launches asked of it.
    pub(super) launches: std::sync::atomic::AtomicUsize,
    /// Whether it takes launch runs (`take_runs`; off: each launch goes alone), and the
    /// runs it took.
    pub(super) takes_runs: std::sync::atomic::AtomicBool,
    pub(super) runs: std::sync::atomic::AtomicUsize,
    /// The work stream of the last launch (where confined work ran).
    pub(super) last_launch_stream: std::sync::atomic::AtomicUsize,
    /// The GPUs of its machine it can reach directly (`link_peers`).
    pub(super) peers: Mutex<Vec<(usize, std::sync::Weak<HostGpu>)>>,
    /// Those a client has had access enabled to.
    pub(super) peers_enabled: Mutex<Vec<usize>>,
    pub(super) state: Mutex<State>,
    /// Hardware queues and the driver's depth bound, when a test plays them (queues.rs).
    pub(super) model: Mutex<super::queue_model::Model>,
}
