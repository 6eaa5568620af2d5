//! A [`Gpu`] made of host memory, for tests on machines without a GPU.
//!
//! Every stream operation runs at once, in the caller's thread, so "stream order" is
//! trivially kept. Device memory is a map of byte vectors at made-up addresses. A module
//! image is text: `omps-host-module` on the first line, then `fn NAME OFF:SIZE ...` or
//! `global NAME SIZE` lines, and `extern NAME` for a function the code calls (`vprintf`;
//! `malloc` or `free` fix the heap's size, as the driver's first load of such code does).
//! Known kernels: `fill_u32(ptr u64, value u32, count u32)`, `trap()`, which makes the
//! context's error sticky as a device fault would, and `print(ptr u64, len u32)`, which
//! puts `len` bytes of device memory into the printf buffer, as device printf would, and
//! `assert_fail(ptr u64, len u32)`, which puts them into the assert messages and fails as
//! a device assert does; [`Gpu::flush_printf`] writes both to the descriptors of
//! `set_printf_output`; `set_cond(handle u64, value u32)` sets a conditional handle, as
//! `cudaGraphSetConditional` in a kernel does.
//!
//! It plays one GPU generation ([`HostProfile`]): the attributes its driver reports, and
//! the features it lacks refused as that driver refuses them.

use super::profile::HostProfile;
use crate::gpu::{
    code, ArrayShape, CopyPlace, CuError, FunctionInfo, Gpu, GpuResult, LoadedModule, Resource,
};
use omps_ring::segment::DeviceSnapshot;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::ops::{cond_handles, HostOp};
use super::state::{HostGpu, State};

/// An image holding these bytes kills the process that loads it on the host GPU, as an
/// image made to crash the driver's parser would (tests of crate::image::verifier).
pub const PARSER_CRASH: &[u8] = b"omps-host-parser-crash";

/// An image or link input holding these bytes takes the host GPU [`HostGpu::slow_loads`]
/// to load, compile or link, as PTX made to compile slowly takes the driver (tests of
/// crate::image::compile: a slow load costs only the client that asked).
pub const SLOW_LOAD: &[u8] = b"omps-host-slow-load";

/// Bytes per row of an array of `s`: unknown formats count 4 bytes a channel.
fn row_bytes(s: &ArrayShape) -> u64 {
    s.width
        .saturating_mul(s.channels as u64 * crate::gpu::format_bytes(s.format).unwrap_or(4))
}

fn array_bytes(s: &ArrayShape) -> u64 {
    crate::gpu::shape_bytes(s, 0)
}

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

    fn wait_unless_stuck(&self) {
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
    fn read_reachable(&self, addr: u64, len: usize) -> GpuResult<Vec<u8>> {
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

    fn write_reachable(&self, addr: u64, bytes: &[u8]) -> GpuResult<()> {
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

    fn linked(&self) -> Vec<Arc<HostGpu>> {
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
    fn maybe_slow(&self, bytes: &[u8]) {
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
    fn vmm_here(&self) -> GpuResult<()> {
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
    fn check(&self) -> GpuResult<()> {
        self.sticky.map_or(Ok(()), |e| Err(CuError(e)))
    }

    /// The byte range `[addr, addr+len)` inside one allocation or reservation, or inside
    /// registered host memory (page-locked and managed memory, which the GPU reaches at
    /// its host address).
    fn range(&mut self, addr: u64, len: usize) -> GpuResult<&mut [u8]> {
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

    fn is_registered(&self, p: usize, len: usize) -> bool {
        self.registered
            .lock()
            .unwrap()
            .iter()
            .any(|&(s, l)| p >= s && p.checked_add(len).is_some_and(|e| e <= s + l))
    }

    fn alloc(&mut self, size: u64) -> u64 {
        let a = self.next_addr;
        self.next_addr += size.max(1).next_multiple_of(256) + 256;
        self.mem.insert(a, vec![0; size as usize]);
        a
    }
}

/// (name, parameter layout) of a kernel.
type Kernel = (String, Vec<(u32, u32)>);

/// A parsed module: its kernels and its globals' (name, size).
type ParsedModule = (Vec<Kernel>, Vec<(String, u64)>);

fn parse_module(text: &str) -> Option<ParsedModule> {
    let mut lines = text.lines();
    if lines.next()? != "omps-host-module" {
        return None;
    }
    let (mut fns, mut globals) = (Vec::new(), Vec::new());
    for line in lines {
        let mut w = line.split_whitespace();
        match w.next() {
            Some("fn") => {
                let name = w.next()?.to_string();
                let params = w
                    .map(|p| {
                        let (o, s) = p.split_once(':')?;
                        Some((o.parse().ok()?, s.parse().ok()?))
                    })
                    .collect::<Option<Vec<_>>>()?;
                fns.push((name, params));
            }
            Some("global") => globals.push((w.next()?.to_string(), w.next()?.parse().ok()?)),
            Some("extern") => {}
            None => {}
            _ => return None,
        }
    }
    Some((fns, globals))
}

impl Gpu for HostGpu {
    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn snapshot(&self) -> DeviceSnapshot {
        let mut s: DeviceSnapshot = bytemuck::Zeroable::zeroed();
        let name = format!("omps host test device {}", self.ordinal);
        s.name[..name.len()].copy_from_slice(name.as_bytes());
        s.uuid = [0x10 + self.ordinal as u8; 16];
        let bus = format!("0000:{:02x}:00.0", 0x10 + self.ordinal);
        s.pci_bus_id[..bus.len()].copy_from_slice(bus.as_bytes());
        s.total_mem = self.total;
        // The profile's attributes, and generic compression (vmm_create grants it) where
        // the GPU has VMM.
        let compression = self.profile.vmm().then_some((107, 1));
        for (a, v) in self.profile.attributes().into_iter().chain(compression) {
            s.attributes[a] = v;
            s.attr_valid[a] = 1;
        }
        s
    }

    fn peer_attributes(&self, peer: usize) -> [i32; omps_ring::segment::P2P_ATTRIBUTES] {
        let mut out = [0; omps_ring::segment::P2P_ATTRIBUTES];
        if self.peers.lock().unwrap().iter().any(|&(o, _)| o == peer) {
            // Rank 0, access, native atomics; no array access.
            out[1] = 1;
            out[2] = 1;
        }
        out
    }

    fn enable_peer(&self, peer: usize) -> GpuResult<()> {
        if !self.peers.lock().unwrap().iter().any(|&(o, _)| o == peer) {
            return Err(CuError(code::PEER_ACCESS_UNSUPPORTED));
        }
        let mut on = self.peers_enabled.lock().unwrap();
        if !on.contains(&peer) {
            on.push(peer);
        }
        Ok(())
    }

    fn reaches(&self, peer: usize) -> bool {
        self.peers_enabled.lock().unwrap().contains(&peer)
    }

    fn reset(&self) -> GpuResult<()> {
        if self.resets_fail.load(Ordering::Relaxed) {
            return Err(CuError(code::NOT_PERMITTED));
        }
        let mut st = self.state.lock().unwrap();
        st.sticky = None;
        st.events.clear();
        st.modules.clear();
        st.mem.clear();
        st.held_by_frees = 0;
        st.capturing.clear();
        st.joined.clear();
        st.event_capture.clear();
        st.arrays.clear();
        st.mipmaps.clear();
        st.textures.clear();
        st.surfaces.clear();
        Ok(())
    }

    fn layout(&self) -> crate::sched::placement::Layout {
        crate::sched::placement::Layout {
            classes: [4, 8, 4, 4],
            connections: 4,
            confined: 8,
            confined_per_class: 4,
        }
    }

    fn quiet(&self) -> bool {
        // The stuck switch plays a kernel that runs long.
        !*self.stuck.lock().unwrap()
    }

    fn sm_chunks(&self) -> crate::sched::confine::SmChunks {
        // sm90: its 4 SMs, one per chunk. Without green contexts the split fails, and
        // gpu_green leaves no chunks, as here.
        crate::sched::confine::SmChunks {
            total: self.profile.sms(),
            chunk: 1,
            chunks: if self.profile.green_contexts() { 4 } else { 0 },
        }
    }

    fn confine(&self, slot: usize, set: &crate::sched::confine::SmSet) -> GpuResult<u32> {
        if !self.profile.green_contexts() {
            // What gpu_green's create answers where the device split failed.
            return Err(CuError(code::NOT_SUPPORTED));
        }
        if slot >= self.layout().confined || set.chunks.iter().any(|&c| c >= 4) {
            return Err(CuError(code::INVALID_VALUE));
        }
        self.state
            .lock()
            .unwrap()
            .confined
            .insert(slot, set.clone());
        Ok(self.sm_chunks().sms(set))
    }

    fn mem_alloc(&self, size: u64) -> GpuResult<u64> {
        let mut st = self.state.lock().unwrap();
        let used: u64 = st.mem.values().map(|v| v.len() as u64).sum::<u64>() + st.held_by_frees;
        if used.checked_add(size).is_none_or(|t| t > self.total) {
            return Err(CuError(code::OUT_OF_MEMORY));
        }
        Ok(st.alloc(size))
    }

    fn mem_free(&self, ptr: u64) -> GpuResult<()> {
        self.wait_unless_stuck();
        let mut st = self.state.lock().unwrap();
        st.mem
            .remove(&ptr)
            .map(drop)
            .ok_or(CuError(code::INVALID_VALUE))
    }

    fn mem_free_async(&self, ptr: u64) -> GpuResult<()> {
        // cuMemFreeAsync is the stream-ordered allocator's: refused where it has no pools.
        if !self.profile.memory_pools() {
            return Err(CuError(code::NOT_SUPPORTED));
        }
        let mut st = self.state.lock().unwrap();
        let v = st.mem.remove(&ptr).ok_or(CuError(code::INVALID_VALUE))?;
        st.held_by_frees += v.len() as u64;
        Ok(())
    }

    fn settle_frees(&self) -> GpuResult<()> {
        self.state.lock().unwrap().held_by_frees = 0;
        Ok(())
    }

    fn vmm_reserve(&self, size: u64, align: u64, _hint: u64) -> GpuResult<u64> {
        self.vmm_here()?;
        let g = VMM_GRANULE;
        if size == 0 || !size.is_multiple_of(g) || (align != 0 && !align.is_power_of_two()) {
            return Err(CuError(code::INVALID_VALUE));
        }
        // One larger than the GPU is refused here (the driver would give address space;
        // nothing could be mapped), so a test's reservation stays small.
        if size > self.total || align > self.total {
            return Err(CuError(code::OUT_OF_MEMORY));
        }
        let mut st = self.state.lock().unwrap();
        let a = st.next_addr.next_multiple_of(align.max(g));
        st.vmm.lock().unwrap().reserve(a, size)?;
        st.next_addr = a + size + g;
        Ok(a)
    }

    fn vmm_address_free(&self, ptr: u64, size: u64) -> GpuResult<()> {
        self.vmm_here()?;
        let st = self.state.lock().unwrap();
        let r = st.vmm.lock().unwrap().address_free(ptr, size);
        r
    }

    /// Grants compression whenever asked, as a GPU with compressible memory to spare.
    fn vmm_create(&self, size: u64, compressible: bool) -> GpuResult<(u64, bool)> {
        self.vmm_here()?;
        if size == 0 || !size.is_multiple_of(VMM_GRANULE) || size > self.total {
            return Err(CuError(code::INVALID_VALUE));
        }
        let st = self.state.lock().unwrap();
        let h = st.vmm.lock().unwrap().create(size, self.ordinal)?;
        Ok((h, compressible))
    }

    fn vmm_release(&self, handle: u64) -> GpuResult<()> {
        self.vmm_here()?;
        let st = self.state.lock().unwrap();
        let r = st.vmm.lock().unwrap().release(handle);
        r
    }

    fn vmm_map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> GpuResult<()> {
        self.vmm_here()?;
        let st = self.state.lock().unwrap();
        let r = st
            .vmm
            .lock()
            .unwrap()
            .map(ptr, size, offset, handle, self.ordinal);
        r
    }

    fn vmm_unmap(&self, ptr: u64, _size: u64) -> GpuResult<()> {
        self.vmm_here()?;
        let st = self.state.lock().unwrap();
        let r = st.vmm.lock().unwrap().unmap(ptr);
        r
    }

    /// Access for another GPU needs the memory's GPU and that one linked (`link_peers`).
    fn vmm_set_access(&self, ptr: u64, size: u64, gpus: &[usize]) -> GpuResult<()> {
        self.vmm_here()?;
        let mut linked: Vec<usize> = self.peers.lock().unwrap().iter().map(|p| p.0).collect();
        linked.push(self.ordinal);
        let reaches = |a: usize, b: usize| a == b || (linked.contains(&a) && linked.contains(&b));
        let st = self.state.lock().unwrap();
        let r = st.vmm.lock().unwrap().set_access(ptr, size, gpus, reaches);
        r
    }

    fn vmm_granularity(&self, _recommended: bool, _compressible: bool) -> GpuResult<u64> {
        self.vmm_here()?;
        Ok(VMM_GRANULE)
    }

    /// Concatenates the inputs after a header; an input named "bad" fails the link.
    fn link(
        &self,
        options: &[(u32, u64)],
        inputs: &[(u32, &str, &[u8])],
    ) -> (GpuResult<Vec<u8>>, String, String) {
        let info = format!("{} options, {} inputs", options.len(), inputs.len());
        if inputs
            .iter()
            .any(|i| i.2.windows(PARSER_CRASH.len()).any(|w| w == PARSER_CRASH))
        {
            // A linker that dies on an input, as the parser above (crate::image::verifier).
            std::process::abort();
        }
        for i in inputs {
            self.maybe_slow(i.2);
        }
        if inputs.is_empty() || inputs.iter().any(|i| i.1 == "bad") {
            return (Err(CuError(218)), info, "link failed".into());
        }
        let mut out = b"omps-host-linked\n".to_vec();
        for (_, _, data) in inputs {
            out.extend_from_slice(data);
        }
        (Ok(out), info, String::new())
    }

    /// Compiles as a load does; the info log names the options, so tests see which
    /// reached the compile, and text that is no module fails as bad PTX would.
    fn module_load_jit(
        &self,
        ptx: &[u8],
        options: &[(u32, u64)],
    ) -> (GpuResult<LoadedModule>, String, String) {
        let info: Vec<String> = options
            .iter()
            .map(|(o, v)| format!("option {o} = {v}"))
            .collect();
        match self.module_load(ptx) {
            Ok(m) => (Ok(m), info.join("\n"), String::new()),
            Err(_) => (Err(CuError(218)), info.join("\n"), "not a module".into()),
        }
    }

    /// Not the driver's encoding: the fields laid out in order, enough for tests to see
    /// that a descriptor comes back and that ReplaceAddress edits only the address.
    fn tensor_map(
        &self,
        t: &omps_ring::wire::TensorMap,
        old: Option<&[u8; 128]>,
    ) -> GpuResult<[u8; 128]> {
        use omps_ring::wire::tensor_map as k;
        // Tensor maps are for compute capability 9.0 and newer (the driver API's words).
        if !self.profile.tensor_maps() {
            return Err(CuError(code::NOT_SUPPORTED));
        }
        if !(1..=5).contains(&t.rank) || !t.global_address.is_multiple_of(16) {
            return Err(CuError(code::INVALID_VALUE));
        }
        let mut d = old.copied().unwrap_or([0; 128]);
        if t.kind != k::REPLACE_ADDRESS {
            let fields = bytemuck::bytes_of(t);
            d[8..].copy_from_slice(&fields[fields.len() - 120..]);
        }
        d[..8].copy_from_slice(&t.global_address.to_le_bytes());
        Ok(d)
    }

    fn mem_info(&self) -> GpuResult<(u64, u64)> {
        Ok((self.total - self.bytes_allocated(), self.total))
    }

    unsafe fn copy_htod(&self, dst: u64, src: *const u8, len: usize, s: usize) -> GpuResult<()> {
        self.queued(s);
        let mut st = self.state.lock().unwrap();
        st.check()?;
        if !st.is_registered(src as usize, len) {
            return Err(CuError(code::INVALID_VALUE));
        }
        st.range(dst, len)?;
        let op = HostOp::Htod {
            dst,
            src: src as usize,
            len,
        };
        if st.captured(s, op) {
            return Ok(());
        }
        let d = st.range(dst, len)?;
        // SAFETY: the caller guarantees src..src+len is readable; d is a distinct Vec.
        unsafe { std::ptr::copy_nonoverlapping(src, d.as_mut_ptr(), len) };
        Ok(())
    }

    unsafe fn copy_dtoh(&self, dst: *mut u8, src: u64, len: usize, s: usize) -> GpuResult<()> {
        self.queued(s);
        let mut st = self.state.lock().unwrap();
        st.check()?;
        if !st.is_registered(dst as usize, len) {
            return Err(CuError(code::INVALID_VALUE));
        }
        st.range(src, len)?;
        let op = HostOp::Dtoh {
            dst: dst as usize,
            src,
            len,
        };
        if st.captured(s, op) {
            return Ok(());
        }
        let from = st.range(src, len)?;
        // SAFETY: the caller guarantees dst..dst+len is writable; from is a distinct Vec.
        unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), dst, len) };
        Ok(())
    }

    fn copy_dtod(&self, dst: u64, src: u64, len: usize, s: usize) -> GpuResult<()> {
        self.queued(s);
        let mut st = self.state.lock().unwrap();
        st.check()?;
        if st.captured(s, HostOp::Dtod { dst, src, len }) {
            return Ok(());
        }
        if let (Ok(tmp), true) = (
            st.range(src, len).map(|r| r.to_vec()),
            st.range(dst, len).is_ok(),
        ) {
            st.range(dst, len)?.copy_from_slice(&tmp);
            return Ok(());
        }
        // An end on a linked peer's memory.
        drop(st);
        let tmp = self.read_reachable(src, len)?;
        self.write_reachable(dst, &tmp)
    }

    fn memset(
        &self,
        dst: u64,
        value: u32,
        elem_size: u32,
        count: usize,
        s: usize,
    ) -> GpuResult<()> {
        self.queued(s);
        let mut st = self.state.lock().unwrap();
        st.check()?;
        let op = HostOp::Memset {
            dst,
            value,
            elem: elem_size,
            count,
        };
        if st.captured(s, op) {
            return Ok(());
        }
        let n = elem_size as usize;
        let bytes = &value.to_le_bytes()[..n];
        let d = st.range(dst, count * n)?;
        for c in d.chunks_exact_mut(n) {
            c.copy_from_slice(bytes);
        }
        Ok(())
    }

    unsafe fn wait_u32(&self, addr: *mut u32, value: u32, s: usize) -> GpuResult<()> {
        // Work on the host GPU runs as it is queued: there is no later to wait until.
        // Tests of host functions see the callback run and the caller not block, not the
        // stream order, which only a GPU keeps (unless a test plays the queues).
        self.state.lock().unwrap().check()?;
        self.queued(s);
        self.hold_wait(addr as usize, value, false, s);
        Ok(())
    }

    unsafe fn wait_u32_eq(&self, addr: *mut u32, value: u32, s: usize) -> GpuResult<()> {
        {
            let mut st = self.state.lock().unwrap();
            let op = HostOp::WaitEq {
                addr: addr as usize,
                value,
            };
            if st.captured(s, op) {
                return Ok(());
            }
        }
        self.state.lock().unwrap().check()?;
        self.queued(s);
        self.hold_wait(addr as usize, value, true, s);
        Ok(())
    }

    unsafe fn write_u32(&self, addr: *mut u32, value: u32, s: usize) -> GpuResult<()> {
        let mut st = self.state.lock().unwrap();
        st.check()?;
        if !st.is_registered(addr as usize, 4) {
            return Err(CuError(code::INVALID_VALUE));
        }
        let word = HostOp::Word {
            addr: addr as usize,
            value,
        };
        if st.captured(s, word) {
            return Ok(());
        }
        drop(st);
        self.queued(s);
        self.completions.fetch_add(1, Ordering::Relaxed);
        if self.hold_write(addr as usize, value, s) {
            return Ok(());
        }
        // SAFETY: registered memory is mapped and the address is 4-aligned (a segment word).
        unsafe { (*(addr as *const AtomicU32)).store(value, Ordering::Release) };
        Ok(())
    }

    unsafe fn register_host(&self, ptr: *mut u8, len: usize) -> GpuResult<()> {
        let st = self.state.lock().unwrap();
        let (a, b) = (ptr as usize, ptr as usize + len);
        let mut registered = st.registered.lock().unwrap();
        // As the driver: a range overlapping one still registered is refused.
        if registered.iter().any(|&(s, n)| a < s + n && s < b) {
            const HOST_MEMORY_ALREADY_REGISTERED: i32 = 712;
            return Err(CuError(HOST_MEMORY_ALREADY_REGISTERED));
        }
        registered.push((a, len));
        Ok(())
    }

    unsafe fn unregister_host(&self, ptr: *mut u8) -> GpuResult<()> {
        let st = self.state.lock().unwrap();
        let mut registered = st.registered.lock().unwrap();
        let before = registered.len();
        registered.retain(|&(s, _)| s != ptr as usize);
        if registered.len() == before {
            return Err(CuError(code::INVALID_VALUE));
        }
        Ok(())
    }

    fn module_load(&self, image: &[u8]) -> GpuResult<LoadedModule> {
        if image.windows(PARSER_CRASH.len()).any(|w| w == PARSER_CRASH) {
            // Plays a driver whose parser dies on an image (issue 23, finding 1): only the
            // image verifier's child process (crate::image::verifier) is to meet it.
            std::process::abort();
        }
        self.maybe_slow(image);
        self.loads.fetch_add(1, Ordering::Relaxed);
        if image.starts_with(&omps_ring::image::ELF_MAGIC) {
            // A cubin: code this device cannot run, loaded as a module of no functions
            // (tests of module sharing).
            let mut st = self.state.lock().unwrap();
            let handle = st.next_handle;
            st.next_handle += 1;
            st.modules.insert(handle, (Vec::new(), Vec::new()));
            return Ok(LoadedModule {
                handle,
                functions: Vec::new(),
            });
        }
        let text = std::str::from_utf8(image).map_err(|_| CuError(code::INVALID_IMAGE))?;
        let (fns, globals) =
            parse_module(text.trim_end_matches('\0')).ok_or(CuError(code::INVALID_IMAGE))?;
        let mut st = self.state.lock().unwrap();
        st.heap_fixed |= text
            .lines()
            .any(|l| matches!(l.trim(), "extern malloc" | "extern free"));
        let handle = st.next_handle;
        st.next_handle += 1;
        let functions: Vec<FunctionInfo> = fns
            .into_iter()
            .enumerate()
            .map(|(i, (name, params))| FunctionInfo {
                handle: handle << 16 | i as u64,
                name,
                max_threads_per_block: 1024,
                static_shared: 0,
                max_dynamic_shared: 49152,
                params,
            })
            .collect();
        let globals = globals
            .into_iter()
            .map(|(n, size)| {
                let a = st.alloc(size);
                (n, a, size)
            })
            .collect();
        st.modules.insert(handle, (functions.clone(), globals));
        Ok(LoadedModule { handle, functions })
    }

    fn image_data_bytes(&self, image: &[u8]) -> u64 {
        // Real images (ELF, PTX, fatbins) are read as the real GPU reads them, so that the
        // host tests reach the same parser a hostile image does.
        if !image.starts_with(b"omps-host-module") {
            return crate::image::module_cache::data_bytes(image, 90);
        }
        std::str::from_utf8(image)
            .ok()
            .and_then(|t| parse_module(t.trim_end_matches('\0')))
            .map_or(0, |(_, globals)| {
                globals.iter().map(|g| g.1).fold(0, u64::saturating_add)
            })
    }

    fn module_unload(&self, module: u64) -> GpuResult<()> {
        self.wait_unless_stuck();
        let held = self.unloads_held.lock().unwrap();
        drop(self.unloads_go.wait_while(held, |held| *held).unwrap());
        let mut st = self.state.lock().unwrap();
        let (_, globals) = st
            .modules
            .remove(&module)
            .ok_or(CuError(code::INVALID_HANDLE))?;
        for (_, a, _) in globals {
            st.mem.remove(&a);
        }
        Ok(())
    }

    fn module_global(&self, module: u64, name: &str) -> GpuResult<(u64, u64)> {
        let st = self.state.lock().unwrap();
        let (_, globals) = st
            .modules
            .get(&module)
            .ok_or(CuError(code::INVALID_HANDLE))?;
        globals
            .iter()
            .find(|g| g.0 == name)
            .map(|g| (g.1, g.2))
            .ok_or(CuError(code::NOT_FOUND))
    }

    fn func_attribute(&self, _func: u64, attr: i32) -> GpuResult<i32> {
        match attr {
            0 => Ok(1024),
            1 => Ok(0),
            4 => Ok(32), // registers
            _ => Err(CuError(code::INVALID_VALUE)),
        }
    }

    fn func_set_attribute(&self, _func: u64, attr: i32, value: i32) -> GpuResult<()> {
        match attr {
            8 if (0..=self.profile.shared_optin()).contains(&value) => Ok(()),
            _ => Err(CuError(code::INVALID_VALUE)),
        }
    }

    fn query(&self, kind: u32, _func: u64, args: [i64; 7], _attrs: &[u8]) -> GpuResult<i64> {
        use omps_ring::wire::query;
        match kind {
            query::OCC_MAX_BLOCKS => Ok(if args[0] > 0 { 2048 / args[0] } else { 0 }),
            query::CTX_GET_LIMIT | query::CTX_SET_LIMIT if !(0..=6).contains(&args[0]) => {
                Err(CuError(code::INVALID_VALUE))
            }
            query::CTX_GET_LIMIT => {
                let st = self.state.lock().unwrap();
                Ok(st.limits.get(&args[0]).copied().unwrap_or(1024))
            }
            query::CTX_SET_LIMIT => {
                const MALLOC_HEAP_SIZE: i64 = 2;
                let mut st = self.state.lock().unwrap();
                let now = st.limits.get(&args[0]).copied().unwrap_or(1024);
                if args[0] == MALLOC_HEAP_SIZE && st.heap_fixed && args[1] != now {
                    return Err(CuError(code::INVALID_VALUE));
                }
                st.limits.insert(args[0], args[1]);
                Ok(0)
            }
            query::CTX_RESET_PERSISTING_L2 => {
                self.state.lock().unwrap().l2_resets += 1;
                Ok(0)
            }
            query::FUNC_CACHE_CONFIG => Ok(0),
            _ => Err(CuError(code::NOT_SUPPORTED)),
        }
    }

    fn launch(
        &self,
        func: u64,
        _grid: [u32; 3],
        _block: [u32; 3],
        _shared: u32,
        s: usize,
        attrs: &[u8],
        args: &[u8],
    ) -> GpuResult<()> {
        self.queued(s);
        let clustered = attrs
            .chunks_exact(omps_ring::wire::LAUNCH_ATTR_BYTES)
            .any(|a| {
                crate::gpu::host::profile::is_cluster_launch_attr(u32::from_le_bytes([
                    a[0], a[1], a[2], a[3],
                ]))
            });
        if clustered && !self.profile.clusters() {
            return Err(CuError(code::NOT_SUPPORTED));
        }
        let mut st = self.state.lock().unwrap();
        st.check()?;
        let op = HostOp::Launch {
            func,
            args: args.to_vec(),
        };
        if st.captured(s, op) {
            return Ok(());
        }
        self.launches.fetch_add(1, Ordering::Relaxed);
        self.last_launch_stream.store(s, Ordering::Relaxed);
        let name = st
            .modules
            .get(&(func >> 16))
            .and_then(|(f, _)| f.get((func & 0xffff) as usize))
            .map(|f| f.name.clone())
            .ok_or(CuError(code::INVALID_HANDLE))?;
        match name.as_str() {
            "fill_u32" if args.len() >= 16 => {
                let ptr = u64::from_le_bytes(args[0..8].try_into().unwrap());
                let value = u32::from_le_bytes(args[8..12].try_into().unwrap());
                let n = u32::from_le_bytes(args[12..16].try_into().unwrap()) as usize;
                let bytes = value.to_le_bytes().repeat(n);
                if let Ok(d) = st.range(ptr, n * 4) {
                    d.copy_from_slice(&bytes);
                    return Ok(());
                }
                // A peer's plain memory, once access to that peer is enabled (VMM memory
                // is reached only where its own access was set for this GPU).
                let vmm = st.vmm.lock().unwrap().reserved(ptr);
                drop(st);
                let on_peer = !vmm
                    && self.linked().iter().any(|p| {
                        self.reaches(p.ordinal)
                            && p.state
                                .lock()
                                .unwrap()
                                .range(ptr, n * 4)
                                .map(|d| d.copy_from_slice(&bytes))
                                .is_ok()
                    });
                if !on_peer {
                    self.state.lock().unwrap().sticky = Some(code::ILLEGAL_ADDRESS);
                }
            }
            "trap" => st.sticky = Some(code::LAUNCH_FAILED),
            "set_cond" if args.len() >= 12 => {
                let h = u64::from_le_bytes(args[0..8].try_into().unwrap());
                let value = u32::from_le_bytes(args[8..12].try_into().unwrap());
                match st.conds.get_mut(&h) {
                    Some(c) => c.2 = value,
                    None => st.sticky = Some(code::ILLEGAL_ADDRESS),
                }
            }
            "print" | "assert_fail" if args.len() >= 12 => {
                let ptr = u64::from_le_bytes(args[0..8].try_into().unwrap());
                let n = u32::from_le_bytes(args[8..12].try_into().unwrap()) as usize;
                match st.range(ptr, n) {
                    Ok(d) => {
                        let text = d.to_vec();
                        if name == "assert_fail" {
                            st.assert_buffer.extend_from_slice(&text);
                            st.sticky = Some(code::ASSERT);
                        } else {
                            st.printf_buffer.extend_from_slice(&text);
                        }
                    }
                    Err(_) => st.sticky = Some(code::ILLEGAL_ADDRESS),
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn event_create(&self, _flags: u32) -> GpuResult<u64> {
        let mut st = self.state.lock().unwrap();
        let h = st.next_handle;
        st.next_handle += 1;
        st.events.insert(h, ());
        Ok(h)
    }

    fn event_destroy(&self, ev: u64) -> GpuResult<()> {
        self.recorded.lock().unwrap().remove(&ev);
        let mut st = self.state.lock().unwrap();
        st.events.remove(&ev).ok_or(CuError(code::INVALID_HANDLE))
    }

    fn event_record(&self, ev: u64, s: usize) -> GpuResult<()> {
        self.queued(s);
        self.recorded
            .lock()
            .unwrap()
            .insert(ev, std::time::Instant::now());
        let mut st = self.state.lock().unwrap();
        st.check()?;
        st.events.get(&ev).ok_or(CuError(code::INVALID_HANDLE))?;
        // Recorded in a capture, the event forks it into whichever stream waits on it.
        let origin = st.origin(s);
        if st.capturing.contains_key(&origin) {
            st.event_capture.insert(ev, origin);
        } else {
            st.event_capture.remove(&ev);
        }
        Ok(())
    }

    fn stream_wait_event(&self, s: usize, ev: u64) -> GpuResult<()> {
        self.queued(s);
        let mut st = self.state.lock().unwrap();
        st.check()?;
        st.events.get(&ev).ok_or(CuError(code::INVALID_HANDLE))?;
        if let Some(&o) = st.event_capture.get(&ev) {
            if o != s && st.capturing.contains_key(&o) && !st.capturing.contains_key(&s) {
                st.joined.insert(s, o);
            }
        }
        Ok(())
    }

    fn event_query(&self, ev: u64) -> GpuResult<bool> {
        self.run_queues();
        {
            let st = self.state.lock().unwrap();
            st.check()?;
            st.events.get(&ev).ok_or(CuError(code::INVALID_HANDLE))?;
        }
        let lag = self.fence_lag_us.load(Ordering::Relaxed);
        if lag > 0 {
            let recorded = self.recorded.lock().unwrap().get(&ev).copied();
            if recorded.is_some_and(|t| (t.elapsed().as_micros() as u64) < lag) {
                return Ok(false);
            }
        }
        // The stuck switch plays a kernel that runs long: nothing recorded completes.
        Ok(!*self.stuck.lock().unwrap())
    }

    fn capture_begin(&self, s: usize) -> GpuResult<()> {
        let mut st = self.state.lock().unwrap();
        st.check()?;
        if st.capturing.contains_key(&s) {
            return Err(CuError(code::ILLEGAL_STATE));
        }
        let id = st.next_handle;
        st.next_handle += 1;
        st.capturing.insert(s, (id, false, Vec::new()));
        Ok(())
    }

    fn capture_end(&self, s: usize) -> GpuResult<u64> {
        let mut st = self.state.lock().unwrap();
        if let Some(&origin) = st.joined.get(&s) {
            // As the driver: ending the capture from a stream it forked into is refused
            // and invalidates the whole capture.
            if let Some(c) = st.capturing.get_mut(&origin) {
                c.1 = true;
            }
            return Err(CuError(code::STREAM_CAPTURE_UNMATCHED));
        }
        let (id, invalid, ops) = st
            .capturing
            .remove(&s)
            .ok_or(CuError(code::ILLEGAL_STATE))?;
        // The streams it forked into end with it.
        st.joined.retain(|_, o| *o != s);
        let into = st.capture_into.remove(&s);
        if invalid {
            // What it captured goes, conditional bodies made in it included.
            st.drop_bodies(&ops);
            return Err(CuError(code::STREAM_CAPTURE_INVALIDATED));
        }
        if let Some(g) = into {
            st.graphs.entry(g).or_default().extend(ops);
            return Ok(g);
        }
        // The graph is named by the capture's id (capture_graph gave it out).
        st.graphs.insert(id, ops);
        Ok(id)
    }

    fn capture_status(&self, s: usize) -> GpuResult<(u32, u64)> {
        use omps_ring::wire::graph;
        let st = self.state.lock().unwrap();
        Ok(match st.capturing.get(&st.origin(s)) {
            None => (graph::STATUS_NONE, 0),
            Some(&(_, true, _)) => (graph::STATUS_INVALIDATED, 0),
            Some(&(id, false, _)) => (graph::STATUS_ACTIVE, id),
        })
    }

    fn capture_graph(&self, s: usize) -> GpuResult<u64> {
        let st = self.state.lock().unwrap();
        let origin = st.origin(s);
        match st.capturing.get(&origin) {
            // A plain capture's graph is named by its capture id, which it ends in.
            Some(&(id, false, _)) => Ok(st.capture_into.get(&origin).copied().unwrap_or(id)),
            _ => Err(CuError(code::ILLEGAL_STATE)),
        }
    }

    fn capture_invalidate(&self, s: usize) {
        let mut st = self.state.lock().unwrap();
        let o = st.origin(s);
        if let Some(c) = st.capturing.get_mut(&o) {
            c.1 = true;
        }
    }

    fn graph_instantiate(&self, graph: u64, _flags: u64) -> GpuResult<u64> {
        let mut st = self.state.lock().unwrap();
        let ops = st.graphs.get(&graph).ok_or(CuError(code::INVALID_HANDLE))?;
        let ops = st.resolve(ops)?;
        // As the driver: conditional handles go into one executable graph only.
        let handles = cond_handles(&ops);
        if handles.iter().any(|h| st.cond_bound.contains(h)) {
            return Err(CuError(code::NOT_SUPPORTED));
        }
        st.cond_bound.extend(handles);
        let e = st.next_handle;
        st.next_handle += 1;
        st.execs.insert(e, ops);
        Ok(e)
    }

    fn graph_launch(&self, exec: u64, s: usize) -> GpuResult<()> {
        let ops = {
            let mut st = self.state.lock().unwrap();
            let ops = st.execs.get(&exec).cloned();
            // A handle made to take its default value takes it at every launch.
            for (default, flags, now) in st.conds.values_mut() {
                if *flags & 1 != 0 {
                    *now = *default;
                }
            }
            ops.ok_or(CuError(code::INVALID_HANDLE))?
        };
        self.run_ops(&ops, s)
    }

    fn graph_upload(&self, exec: u64, _s: usize) -> GpuResult<()> {
        let st = self.state.lock().unwrap();
        st.execs
            .get(&exec)
            .map(drop)
            .ok_or(CuError(code::INVALID_HANDLE))
    }

    fn graph_destroy(&self, graph: u64) -> GpuResult<()> {
        let mut st = self.state.lock().unwrap();
        let ops = st
            .graphs
            .remove(&graph)
            .ok_or(CuError(code::INVALID_HANDLE))?;
        st.drop_bodies(&ops);
        Ok(())
    }

    fn graph_memory_ranges(&self, graph: u64) -> GpuResult<Vec<(u64, u64)>> {
        fn collect(ops: &[HostOp], out: &mut Vec<(u64, u64)>, bodies: bool) {
            for op in ops {
                match op {
                    HostOp::Memset {
                        dst, elem, count, ..
                    } => out.push((*dst, *elem as u64 * *count as u64)),
                    HostOp::Dtod { dst, src, len } => {
                        out.push((*dst, *len as u64));
                        out.push((*src, *len as u64));
                    }
                    HostOp::Htod { dst, src, len } => {
                        out.push((*dst, *len as u64));
                        out.push((*src as u64, *len as u64));
                    }
                    HostOp::Dtoh { dst, src, len } => {
                        out.push((*src, *len as u64));
                        out.push((*dst as u64, *len as u64));
                    }
                    HostOp::Cond { run, .. } if bodies => {
                        run.iter().for_each(|r| collect(r, out, bodies))
                    }
                    _ => {}
                }
            }
        }
        if self.graph_reads_fail.load(Ordering::Relaxed) {
            return Err(CuError(code::NOT_SUPPORTED));
        }
        let st = self.state.lock().unwrap();
        let ops = st.graphs.get(&graph).ok_or(CuError(code::INVALID_HANDLE))?;
        let ops = st.resolve(ops)?;
        let mut out = Vec::new();
        collect(
            &ops,
            &mut out,
            !self.cond_bodies_hidden.load(Ordering::Relaxed),
        );
        Ok(out)
    }

    fn graph_nodes(&self, graph: u64) -> GpuResult<Vec<u64>> {
        let st = self.state.lock().unwrap();
        let ops = st.graphs.get(&graph).ok_or(CuError(code::INVALID_HANDLE))?;
        // A node names its graph and its place in it.
        Ok((0..ops.len() as u64).map(|i| graph << 16 | i).collect())
    }

    fn graph_node_type(&self, node: u64) -> GpuResult<u32> {
        let st = self.state.lock().unwrap();
        let op = st
            .graphs
            .get(&(node >> 16))
            .and_then(|ops| ops.get((node & 0xffff) as usize))
            .ok_or(CuError(code::INVALID_HANDLE))?;
        // CUgraphNodeType: kernel 0, memcpy 1, memset 2, batch memory operation 12.
        Ok(match op {
            HostOp::Launch { .. } => 0,
            HostOp::Dtod { .. } | HostOp::Htod { .. } | HostOp::Dtoh { .. } => 1,
            HostOp::Memset { .. } => 2,
            HostOp::Word { .. } | HostOp::WaitEq { .. } => 12,
            HostOp::Cond { .. } => 13,
        })
    }

    fn graph_create(&self) -> GpuResult<u64> {
        let mut st = self.state.lock().unwrap();
        let g = st.next_handle;
        st.next_handle += 1;
        st.graphs.insert(g, Vec::new());
        Ok(g)
    }

    fn cond_handle(&self, graph: u64, value: u32, flags: u32) -> GpuResult<u64> {
        let mut st = self.state.lock().unwrap();
        let capturing = st.capturing.values().any(|c| c.0 == graph);
        if !(st.graphs.contains_key(&graph) || capturing) || flags > 1 {
            return Err(CuError(code::INVALID_VALUE));
        }
        let h = st.next_handle;
        st.next_handle += 1;
        st.conds.insert(h, (value, flags, value));
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
        let mut st = self.state.lock().unwrap();
        let origin = st.origin(s);
        let capture = st.capturing.get(&origin).map_or(0, |c| c.0);
        if !graph_ok(st.capture_into.get(&origin).copied().unwrap_or(capture)) {
            return Err(CuError(code::INVALID_VALUE));
        }
        let valid = match kind {
            0 => matches!(size, 1 | 2),
            1 => size == 1,
            2 => size >= 1,
            _ => false,
        };
        if !valid || !st.conds.contains_key(&handle) {
            return Err(CuError(code::INVALID_VALUE));
        }
        if !matches!(st.capturing.get(&origin), Some((_, false, _))) {
            return Err(CuError(code::ILLEGAL_STATE));
        }
        let bodies: Vec<u64> = (0..size)
            .map(|_| {
                let g = st.next_handle;
                st.next_handle += 1;
                st.graphs.insert(g, Vec::new());
                g
            })
            .collect();
        let op = HostOp::Cond {
            handle,
            kind,
            bodies: bodies.clone(),
            run: Vec::new(),
        };
        st.captured(s, op);
        Ok(bodies)
    }

    fn capture_begin_to(&self, s: usize, graph: u64) -> GpuResult<()> {
        if !self.state.lock().unwrap().graphs.contains_key(&graph) {
            return Err(CuError(code::INVALID_VALUE));
        }
        self.capture_begin(s)?;
        self.state.lock().unwrap().capture_into.insert(s, graph);
        Ok(())
    }

    fn graph_clone(&self, graph: u64) -> GpuResult<u64> {
        let mut st = self.state.lock().unwrap();
        let ops = st
            .graphs
            .get(&graph)
            .cloned()
            .ok_or(CuError(code::INVALID_HANDLE))?;
        // Conditional bodies are copied too: the copy's own, outliving the original's.
        let ops = st.copy_ops(&ops)?;
        let g = st.next_handle;
        st.next_handle += 1;
        st.graphs.insert(g, ops);
        Ok(g)
    }

    fn capture_child(&self, s: usize, child: u64) -> GpuResult<()> {
        let mut st = self.state.lock().unwrap();
        let ops = st
            .graphs
            .get(&child)
            .cloned()
            .ok_or(CuError(code::INVALID_HANDLE))?;
        let origin = st.origin(s);
        if !st.capturing.contains_key(&origin) {
            return Err(CuError(code::ILLEGAL_STATE));
        }
        // A child's work runs in its place: copied in, as the driver copies the graph
        // (conditional bodies included).
        let ops = st.copy_ops(&ops)?;
        let ops = st.resolve(&ops)?;
        let c = st
            .capturing
            .get_mut(&origin)
            .ok_or(CuError(code::ILLEGAL_STATE))?;
        c.2.extend(ops);
        Ok(())
    }

    fn graph_exec_update(&self, exec: u64, graph: u64) -> GpuResult<()> {
        let mut st = self.state.lock().unwrap();
        let ops = st.graphs.get(&graph).ok_or(CuError(code::INVALID_HANDLE))?;
        let ops = st.resolve(ops)?;
        let e = st
            .execs
            .get_mut(&exec)
            .ok_or(CuError(code::INVALID_HANDLE))?;
        if e.len() != ops.len() {
            // CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE.
            return Err(CuError(910));
        }
        *e = ops;
        Ok(())
    }

    fn graph_clear(&self, graph: u64) -> GpuResult<()> {
        let mut st = self.state.lock().unwrap();
        let ops = st
            .graphs
            .get_mut(&graph)
            .ok_or(CuError(code::INVALID_HANDLE))?;
        let gone: Vec<u64> = std::mem::take(ops)
            .into_iter()
            .flat_map(|op| match op {
                HostOp::Cond { bodies, .. } => bodies,
                _ => Vec::new(),
            })
            .collect();
        // Bodies go with their nodes (nested ones are not tracked here: tests nest none).
        for b in gone {
            st.graphs.remove(&b);
        }
        Ok(())
    }

    fn graph_exec_destroy(&self, exec: u64) -> GpuResult<()> {
        let mut st = self.state.lock().unwrap();
        st.execs
            .remove(&exec)
            .map(drop)
            .ok_or(CuError(code::INVALID_HANDLE))
    }

    fn event_elapsed(&self, start: u64, end: u64) -> GpuResult<f32> {
        self.event_record(start, 0)?;
        self.event_record(end, 0)?;
        Ok(0.0)
    }

    fn stream_query(&self, _s: usize) -> GpuResult<bool> {
        self.run_queues();
        self.state.lock().unwrap().check().map(|_| true)
    }

    fn write_device_u32(&self, dptr: u64, value: u32, s: usize) -> GpuResult<()> {
        self.queued(s);
        let mut st = self.state.lock().unwrap();
        st.check()?;
        st.range(dptr, 4)?.copy_from_slice(&value.to_le_bytes());
        Ok(())
    }

    fn array_create(&self, shape: &ArrayShape) -> GpuResult<(u64, u64)> {
        // The driver's checks the model needs: a known format, 1, 2 or 4 channels.
        if crate::gpu::format_bytes(shape.format).is_none()
            || !matches!(shape.channels, 1 | 2 | 4)
            || shape.width == 0
            || array_bytes(shape) > 1 << 32
        {
            return Err(CuError(code::INVALID_VALUE));
        }
        let mut st = self.state.lock().unwrap();
        let h = st.next_handle;
        st.next_handle += 1;
        let n = array_bytes(shape);
        st.arrays.insert(h, (*shape, vec![0; n as usize]));
        Ok((h, n))
    }

    fn mipmap_create(&self, shape: &ArrayShape, levels: u32) -> GpuResult<(u64, u64)> {
        if levels == 0 || levels > 16 {
            return Err(CuError(code::INVALID_VALUE));
        }
        let mut arrays = Vec::new();
        let mut total = 0;
        for l in 0..levels {
            let half = |v: u64| if v == 0 { 0 } else { (v >> l).max(1) };
            let s = ArrayShape {
                width: half(shape.width),
                height: half(shape.height),
                depth: half(shape.depth),
                ..*shape
            };
            let (a, n) = self.array_create(&s)?;
            arrays.push(a);
            total += n;
        }
        let mut st = self.state.lock().unwrap();
        let h = st.next_handle;
        st.next_handle += 1;
        st.mipmaps.insert(h, arrays);
        Ok((h, total))
    }

    fn mipmap_level(&self, mip: u64, level: u32) -> GpuResult<u64> {
        let st = self.state.lock().unwrap();
        st.mipmaps
            .get(&mip)
            .and_then(|v| v.get(level as usize).copied())
            .ok_or(CuError(code::INVALID_VALUE))
    }

    fn array_destroy(&self, array: u64) -> GpuResult<()> {
        let mut st = self.state.lock().unwrap();
        st.arrays
            .remove(&array)
            .map(drop)
            .ok_or(CuError(code::INVALID_HANDLE))
    }

    fn mipmap_destroy(&self, mip: u64) -> GpuResult<()> {
        let mut st = self.state.lock().unwrap();
        let levels = st
            .mipmaps
            .remove(&mip)
            .ok_or(CuError(code::INVALID_HANDLE))?;
        for a in levels {
            st.arrays.remove(&a);
        }
        Ok(())
    }

    fn array_copy(
        &self,
        src: &CopyPlace,
        dst: &CopyPlace,
        extent: [u64; 3],
        _s: usize,
    ) -> GpuResult<()> {
        let mut st = self.state.lock().unwrap();
        st.check()?;
        let [w, h, d] = [extent[0], extent[1].max(1), extent[2].max(1)];
        // Where row (y, z) of a side starts, checked to hold `w` bytes.
        let start = |st: &State, p: &CopyPlace, y: u64, z: u64| -> GpuResult<(Option<u64>, u64)> {
            match p.array {
                Some(a) => {
                    let (s, buf) = st.arrays.get(&a).ok_or(CuError(code::INVALID_HANDLE))?;
                    let rb = row_bytes(s);
                    let (yy, zz) = (p.y.saturating_add(y), p.z.saturating_add(z));
                    if p.x.saturating_add(w) > rb || yy >= s.height.max(1) || zz >= s.depth.max(1) {
                        return Err(CuError(code::INVALID_VALUE));
                    }
                    let off = p.x + (yy + zz * s.height.max(1)) * rb;
                    debug_assert!(off + w <= buf.len() as u64);
                    Ok((Some(a), off))
                }
                None => Ok((
                    None,
                    // The session checked the device side lies in the client's memory.
                    p.dev + p.x + (p.y + y + (p.z + z) * p.height) * p.pitch,
                )),
            }
        };
        for z in 0..d {
            for y in 0..h {
                let (sa, so) = start(&st, src, y, z)?;
                let (da, doff) = start(&st, dst, y, z)?;
                let row = match sa {
                    Some(a) => st.arrays[&a].1[so as usize..(so + w) as usize].to_vec(),
                    None => st.range(so, w as usize)?.to_vec(),
                };
                match da {
                    Some(a) => st.arrays.get_mut(&a).expect("checked").1
                        [doff as usize..(doff + w) as usize]
                        .copy_from_slice(&row),
                    None => st.range(doff, w as usize)?.copy_from_slice(&row),
                }
            }
        }
        Ok(())
    }

    fn tex_create(
        &self,
        res: &Resource,
        _tex: &[u32; 26],
        _view: Option<&[u32; 28]>,
    ) -> GpuResult<u64> {
        let mut st = self.state.lock().unwrap();
        let known = match *res {
            Resource::Array(a) => st.arrays.contains_key(&a),
            Resource::Mipmapped(m) => st.mipmaps.contains_key(&m),
            Resource::Linear { dev, size, .. } => st.range(dev, size as usize).is_ok(),
            Resource::Pitch2D {
                dev, pitch, height, ..
            } => st.range(dev, pitch.saturating_mul(height) as usize).is_ok(),
        };
        if !known {
            return Err(CuError(code::INVALID_VALUE));
        }
        let h = st.next_handle;
        st.next_handle += 1;
        st.textures.insert(h, *res);
        Ok(h)
    }

    fn tex_destroy(&self, tex: u64) -> GpuResult<()> {
        let mut st = self.state.lock().unwrap();
        st.textures
            .remove(&tex)
            .map(drop)
            .ok_or(CuError(code::INVALID_VALUE))
    }

    fn surf_create(&self, array: u64) -> GpuResult<u64> {
        let mut st = self.state.lock().unwrap();
        if !st.arrays.contains_key(&array) {
            return Err(CuError(code::INVALID_VALUE));
        }
        let h = st.next_handle;
        st.next_handle += 1;
        st.surfaces.insert(h, array);
        Ok(h)
    }

    fn surf_destroy(&self, surf: u64) -> GpuResult<()> {
        let mut st = self.state.lock().unwrap();
        st.surfaces
            .remove(&surf)
            .map(drop)
            .ok_or(CuError(code::INVALID_VALUE))
    }

    fn flush_printf(&self) -> GpuResult<()> {
        // The driver writes the printf buffer out once the running kernels are done.
        self.wait_unless_stuck();
        self.flushes.fetch_add(1, Ordering::Relaxed);
        let (out, err) = {
            let mut st = self.state.lock().unwrap();
            (
                std::mem::take(&mut st.printf_buffer),
                std::mem::take(&mut st.assert_buffer),
            )
        };
        for (fd, text) in [(&self.printf_fd, out), (&self.assert_fd, err)] {
            let fd = fd.load(Ordering::Relaxed);
            if fd < 0 || text.is_empty() {
                continue;
            }
            // SAFETY: the router's pipe, open for the life of the server; ManuallyDrop
            // leaves it open.
            let mut f = std::mem::ManuallyDrop::new(unsafe {
                <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
            });
            std::io::Write::write_all(&mut *f, &text).map_err(|_| CuError(code::UNKNOWN))?;
        }
        Ok(())
    }

    fn set_printf_output(&self, out: std::os::fd::RawFd, err: std::os::fd::RawFd) {
        self.printf_fd.store(out, Ordering::Relaxed);
        self.assert_fd.store(err, Ordering::Relaxed);
    }
}
