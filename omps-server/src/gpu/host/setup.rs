//! Making host GPUs, the switches and counters tests turn and read on them, and the
//! helpers every family of the host GPU's [`Gpu`](crate::gpu::Gpu) methods shares
//! (reaching memory, linked peers, slow loads). The families (memory.rs, modules.rs,
//! launch.rs, ...) sit above this file; device.rs's `impl Gpu` forwards to them.

use super::profile::HostProfile;
use super::state::{HostGpu, State};
use crate::gpu::{code, CuError, GpuResult, Resource};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// An image holding these bytes kills the process that loads it on the host GPU, as an
/// image made to crash the driver's parser would (tests of crate::image::verifier).
pub const PARSER_CRASH: &[u8] = b"omps-host-parser-crash";

/// An image or link input holding these bytes takes the host GPU [`HostGpu::slow_loads`]
/// to load, compile or link, as PTX made to compile slowly takes the driver (tests of
/// crate::image::compile: a slow load costs only the client that asked).
pub const SLOW_LOAD: &[u8] = b"omps-host-slow-load";

/// The first device address: above every address a host mapping can have (user space ends
/// below 2^47, or 2^56 with five-level paging, 2^52 on arm64). On a GPU device and host
/// memory share one address space, the driver's reservations keeping them apart; here
/// registered host memory is reached at its host address, so a made-up device address
/// that a mapping could cover would be that mapping's bytes. It was 0x7f00_0000_0000,
/// where ASLR put a client's segment now and then: the fuzzed client's segment then was the
/// bystander's memory (a flaky `fuzz_sequences` failure).
const BASE: u64 = 1 << 56;
/// The host GPU's VMM granularity (a real GPU's is 2 MiB).
pub const VMM_GRANULE: u64 = 64 << 10;

impl HostGpu {
    /// Makes frees and module unloads wait until called again with false, as the real
    /// driver's wait for a kernel that runs long (tests of what waits for them).
    pub fn stick_releases(&self, on: bool) {
        *self.stuck.lock().unwrap() = on;
        self.unstuck.notify_all();
        if !on {
            self.unstick_model();
        }
    }

    /// Plays a driver that cannot read a conditional node's bodies while `on`.
    pub fn hide_conditional_bodies(&self, on: bool) {
        self.cond_bodies_hidden.store(on, Ordering::Relaxed);
    }

    /// Makes reading graphs' memory ranges fail while `on`.
    pub fn fail_graph_reads(&self, on: bool) {
        self.graph_reads_fail.store(on, Ordering::Relaxed);
    }

    /// Makes context resets fail while `on`.
    pub fn fail_resets(&self, on: bool) {
        self.resets_fail.store(on, Ordering::Relaxed);
    }

    /// Makes every event pass only `lag` after it is recorded.
    pub fn lag_fences(&self, lag: std::time::Duration) {
        self.fence_lag_us
            .store(lag.as_micros() as u64, Ordering::Relaxed);
    }

    /// Makes module unloads wait until called again with false, while everything else
    /// goes on: a client's kernel that never ends (cuModuleUnload waited 250 ms for another
    /// module's 300 ms kernel on an H100, `scripts/probe/blocking_calls.cu`).
    pub fn hold_unloads(&self, on: bool) {
        *self.unloads_held.lock().unwrap() = on;
        self.unloads_go.notify_all();
    }

    pub(super) fn wait_unless_stuck(&self) {
        let st = self.stuck.lock().unwrap();
        drop(self.unstuck.wait_while(st, |stuck| *stuck).unwrap());
    }

    /// How many times the printf buffer was flushed (each client request for its text).
    pub fn printf_flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Lets each of `gpus` reach the others' memory directly, as GPUs with peer access
    /// do: copies on one may have an end on another.
    pub fn link_peers(gpus: &[Arc<HostGpu>]) {
        for g in gpus {
            *g.peers.lock().unwrap() = gpus
                .iter()
                .filter(|p| !Arc::ptr_eq(p, g))
                .map(|p| (p.ordinal, Arc::downgrade(p)))
                .collect();
        }
    }

    /// `len` bytes at `addr` of this GPU's memory or a linked peer's (each read under
    /// that GPU's lock only, so two GPUs copying into each other cannot deadlock).
    pub(super) fn read_reachable(&self, addr: u64, len: usize) -> GpuResult<Vec<u8>> {
        if let Ok(r) = self.state.lock().unwrap().range(addr, len) {
            return Ok(r.to_vec());
        }
        for p in self.linked() {
            if let Ok(r) = p.state.lock().unwrap().range(addr, len) {
                return Ok(r.to_vec());
            }
        }
        Err(CuError(code::INVALID_VALUE))
    }

    pub(super) fn write_reachable(&self, addr: u64, bytes: &[u8]) -> GpuResult<()> {
        if let Ok(r) = self.state.lock().unwrap().range(addr, bytes.len()) {
            r.copy_from_slice(bytes);
            return Ok(());
        }
        for p in self.linked() {
            if let Ok(r) = p.state.lock().unwrap().range(addr, bytes.len()) {
                r.copy_from_slice(bytes);
                return Ok(());
            }
        }
        Err(CuError(code::INVALID_VALUE))
    }

    pub(super) fn linked(&self) -> Vec<Arc<HostGpu>> {
        self.peers
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(_, w)| w.upgrade())
            .collect()
    }

    /// Another GPU of `first`'s machine: host memory registered with either is reached by
    /// both, as portable registrations are.
    pub fn beside(first: &HostGpu, ordinal: usize, total: u64) -> Self {
        let g = HostGpu::with_profile(ordinal, total, first.profile);
        {
            let (mut st, fst) = (g.state.lock().unwrap(), first.state.lock().unwrap());
            st.registered = fst.registered.clone();
            st.vmm = fst.vmm.clone();
        }
        g
    }

    /// A GPU of the profile `OMPS_HOST_GPU_PROFILE` names (sm90 when unset).
    pub fn new(ordinal: usize, total: u64) -> Self {
        HostGpu::with_profile(ordinal, total, HostProfile::from_env())
    }

    pub fn with_profile(ordinal: usize, total: u64, profile: HostProfile) -> Self {
        HostGpu {
            ordinal,
            total,
            profile,
            printf_fd: std::sync::atomic::AtomicI32::new(-1),
            assert_fd: std::sync::atomic::AtomicI32::new(-1),
            flushes: Default::default(),
            stuck: Default::default(),
            unstuck: Default::default(),
            unloads_held: Default::default(),
            unloads_go: Default::default(),
            completions: std::sync::atomic::AtomicUsize::new(0),
            fence_lag_us: Default::default(),
            recorded: Default::default(),
            resets_fail: Default::default(),
            cond_bodies_hidden: Default::default(),
            graph_reads_fail: Default::default(),
            loads: Default::default(),
            slow_load: Default::default(),
            launches: Default::default(),
            takes_runs: Default::default(),
            runs: Default::default(),
            last_launch_stream: Default::default(),
            peers: Default::default(),
            peers_enabled: Default::default(),
            model: Default::default(),
            state: Mutex::new(State {
                // As under unified addressing, each GPU's memory has addresses of its own.
                next_addr: BASE + ((ordinal as u64) << 38),
                next_handle: 1,
                ordinal,
                ..Default::default()
            }),
        }
    }

    /// Bytes currently allocated (mapped VMM ranges included), for tests that check
    /// nothing leaked.
    /// `len` bytes of device memory at `addr`, read directly (for tests' checks).
    pub fn peek(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut st = self.state.lock().unwrap();
        st.range(addr, len).ok().map(|d| d.to_vec())
    }

    pub fn bytes_allocated(&self) -> u64 {
        let st = self.state.lock().unwrap();
        let mapped = st.vmm.lock().unwrap().mapped_via(self.ordinal);
        st.mem.values().map(|v| v.len() as u64).sum::<u64>() + mapped + st.held_by_frees
    }

    /// Completion words written in stream order so far ([`Gpu::write_u32`]).
    pub fn completions_written(&self) -> usize {
        self.completions.load(Ordering::Relaxed)
    }

    /// Launches so far.
    pub fn launches(&self) -> usize {
        self.launches.load(Ordering::Relaxed)
    }

    /// Takes launch runs as one (as the CUDA GPU's graphs do), for tests of the sessions'
    /// gathering; the launches of a run must each be valid (they run in turn).
    pub fn take_runs(&self, on: bool) {
        self.takes_runs.store(on, Ordering::Relaxed);
    }

    /// Launch runs taken as one so far.
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::Relaxed)
    }

    /// The work stream the last launch ran on.
    pub fn last_launch_stream(&self) -> usize {
        self.last_launch_stream.load(Ordering::Relaxed)
    }

    /// Streams being captured now.
    pub fn captures(&self) -> usize {
        self.state.lock().unwrap().capturing.len()
    }

    /// Graphs and executable graphs that exist now.
    pub fn graph_count(&self) -> (usize, usize) {
        let st = self.state.lock().unwrap();
        (st.graphs.len(), st.execs.len())
    }

    /// Makes loads, JIT compiles and links of images holding [`SLOW_LOAD`] take `d`.
    pub fn slow_loads(&self, d: std::time::Duration) {
        *self.slow_load.lock().unwrap() = d;
    }

    /// Sleeps for [`HostGpu::slow_loads`] if `bytes` hold [`SLOW_LOAD`].
    pub(super) fn maybe_slow(&self, bytes: &[u8]) {
        if bytes.windows(SLOW_LOAD.len()).any(|w| w == SLOW_LOAD) {
            let d = *self.slow_load.lock().unwrap();
            std::thread::sleep(d);
        }
    }

    /// Module loads so far, and modules loaded now.
    pub fn module_loads(&self) -> (usize, usize) {
        (
            self.loads.load(Ordering::Relaxed),
            self.state.lock().unwrap().modules.len(),
        )
    }

    /// The SM set of confinement `slot`, if made.
    pub fn confinement(&self, slot: usize) -> Option<crate::sched::confine::SmSet> {
        self.state.lock().unwrap().confined.get(&slot).cloned()
    }

    pub fn registered_ranges(&self) -> usize {
        self.state.lock().unwrap().registered.lock().unwrap().len()
    }

    /// Bytes of host memory registered now (what the driver would pin).
    pub fn registered_bytes(&self) -> usize {
        let st = self.state.lock().unwrap();
        let r = st.registered.lock().unwrap();
        r.iter().map(|&(_, n)| n).sum()
    }

    /// Whether a registered range starts at `addr`: unlike [`HostGpu::registered_ranges`],
    /// not moved by the segments the server registers ahead of connections meanwhile.
    pub fn registered_at(&self, addr: u64) -> bool {
        let st = self.state.lock().unwrap();
        let r = st.registered.lock().unwrap();
        r.iter().any(|&(s, _)| s == addr as usize)
    }

    pub fn modules_loaded(&self) -> usize {
        self.state.lock().unwrap().modules.len()
    }

    /// CUDA arrays and mipmapped arrays alive now.
    pub fn arrays_live(&self) -> usize {
        let st = self.state.lock().unwrap();
        st.arrays.len() + st.mipmaps.len()
    }

    /// VMM reservations, physical handles and mappings alive now (all GPUs').
    pub fn vmm_live(&self) -> (usize, usize, usize) {
        self.state.lock().unwrap().vmm.lock().unwrap().counts()
    }

    pub fn events_live(&self) -> usize {
        self.state.lock().unwrap().events.len()
    }

    pub fn profile(&self) -> HostProfile {
        self.profile
    }

    /// Ok where its GPU has VMM; else what the driver answers cuMemCreate and the other
    /// VMM calls on one without (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 0).
    pub(super) fn vmm_here(&self) -> GpuResult<()> {
        match self.profile.vmm() {
            true => Ok(()),
            false => Err(CuError(code::NOT_SUPPORTED)),
        }
    }

    /// What texture object `t` was made over, if it lives.
    pub fn texture(&self, t: u64) -> Option<Resource> {
        self.state.lock().unwrap().textures.get(&t).copied()
    }

    /// Persisting-L2 resets asked of it.
    pub fn l2_resets(&self) -> usize {
        self.state.lock().unwrap().l2_resets
    }
}

impl State {
    pub(super) fn check(&self) -> GpuResult<()> {
        self.sticky.map_or(Ok(()), |e| Err(CuError(e)))
    }

    /// The byte range `[addr, addr+len)` inside one allocation or reservation, or inside
    /// registered host memory (page-locked and managed memory, which the GPU reaches at
    /// its host address).
    pub(super) fn range(&mut self, addr: u64, len: usize) -> GpuResult<&mut [u8]> {
        if len > 0 && self.is_registered(addr as usize, len) {
            // SAFETY: registered ranges are mapped in this process (the client's memfd at
            // the client's address) until unregistered, which needs this state's lock.
            return Ok(unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) });
        }
        {
            let space = self.vmm.lock().unwrap();
            if space.reserved(addr) {
                let (p, n) = space.bytes(addr, len, self.ordinal)?;
                // SAFETY: mapped memory of the machine's VMM space, with access for this
                // GPU; an unmap puts anonymous pages in its place, never a hole, and a
                // reservation is freed only once nothing is mapped in it.
                return Ok(unsafe { std::slice::from_raw_parts_mut(p, n) });
            }
        }
        let (&start, buf) = self
            .mem
            .range_mut(..=addr)
            .next_back()
            .ok_or(CuError(code::INVALID_VALUE))?;
        let off = (addr - start) as usize;
        buf.get_mut(off..off.checked_add(len).ok_or(CuError(code::INVALID_VALUE))?)
            .ok_or(CuError(code::INVALID_VALUE))
    }

    pub(super) fn is_registered(&self, p: usize, len: usize) -> bool {
        self.registered
            .lock()
            .unwrap()
            .iter()
            .any(|&(s, l)| p >= s && p.checked_add(len).is_some_and(|e| e <= s + l))
    }

    pub(super) fn alloc(&mut self, size: u64) -> u64 {
        let a = self.next_addr;
        self.next_addr += size.max(1).next_multiple_of(256) + 256;
        self.mem.insert(a, vec![0; size as usize]);
        a
    }
}
