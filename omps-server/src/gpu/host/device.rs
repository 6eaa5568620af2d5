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

use super::setup::VMM_GRANULE;
use super::state::HostGpu;
use super::{arrays, context, graphs, launch, memory, modules, streams, vmm};
use crate::gpu::{code, ArrayShape, CopyPlace, CuError, Gpu, GpuResult, LoadedModule, Resource};
use omps_ring::segment::DeviceSnapshot;
use std::sync::atomic::Ordering;

impl Gpu for HostGpu {
    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn snapshot(&self) -> DeviceSnapshot {
        context::snapshot(self)
    }

    fn peer_attributes(&self, peer: usize) -> [i32; omps_ring::segment::P2P_ATTRIBUTES] {
        context::peer_attributes(self, peer)
    }

    fn enable_peer(&self, peer: usize) -> GpuResult<()> {
        context::enable_peer(self, peer)
    }

    fn reaches(&self, peer: usize) -> bool {
        self.peers_enabled.lock().unwrap().contains(&peer)
    }

    fn reset(&self) -> GpuResult<()> {
        context::reset(self)
    }

    fn layout(&self) -> crate::sched::placement::Layout {
        context::layout()
    }

    fn quiet(&self) -> bool {
        // The stuck switch plays a kernel that runs long.
        !*self.stuck.lock().unwrap()
    }

    fn sm_chunks(&self) -> crate::sched::confine::SmChunks {
        context::sm_chunks(self)
    }

    fn confine(&self, slot: usize, set: &crate::sched::confine::SmSet) -> GpuResult<u32> {
        context::confine(self, slot, set)
    }

    fn mem_alloc(&self, size: u64) -> GpuResult<u64> {
        memory::mem_alloc(self, size)
    }

    fn mem_free(&self, ptr: u64) -> GpuResult<()> {
        memory::mem_free(self, ptr)
    }

    fn mem_free_async(&self, ptr: u64) -> GpuResult<()> {
        memory::mem_free_async(self, ptr)
    }

    fn settle_frees(&self) -> GpuResult<()> {
        self.state.lock().unwrap().held_by_frees = 0;
        Ok(())
    }

    fn vmm_reserve(&self, size: u64, align: u64, _hint: u64) -> GpuResult<u64> {
        vmm::vmm_reserve(self, size, align, _hint)
    }

    fn vmm_address_free(&self, ptr: u64, size: u64) -> GpuResult<()> {
        vmm::vmm_address_free(self, ptr, size)
    }

    fn vmm_create(&self, size: u64, compressible: bool) -> GpuResult<(u64, bool)> {
        vmm::vmm_create(self, size, compressible)
    }

    fn vmm_release(&self, handle: u64) -> GpuResult<()> {
        vmm::vmm_release(self, handle)
    }

    fn vmm_map(&self, ptr: u64, size: u64, offset: u64, handle: u64) -> GpuResult<()> {
        vmm::vmm_map(self, ptr, size, offset, handle)
    }

    fn vmm_unmap(&self, ptr: u64, _size: u64) -> GpuResult<()> {
        vmm::vmm_unmap(self, ptr, _size)
    }

    fn vmm_set_access(&self, ptr: u64, size: u64, gpus: &[usize]) -> GpuResult<()> {
        vmm::vmm_set_access(self, ptr, size, gpus)
    }

    fn vmm_granularity(&self, _recommended: bool, _compressible: bool) -> GpuResult<u64> {
        self.vmm_here()?;
        Ok(VMM_GRANULE)
    }

    fn link(
        &self,
        options: &[(u32, u64)],
        inputs: &[(u32, &str, &[u8])],
    ) -> (GpuResult<Vec<u8>>, String, String) {
        modules::link(self, options, inputs)
    }

    fn module_load_jit(
        &self,
        ptx: &[u8],
        options: &[(u32, u64)],
    ) -> (GpuResult<LoadedModule>, String, String) {
        modules::module_load_jit(self, ptx, options)
    }

    fn tensor_map(
        &self,
        t: &omps_ring::wire::TensorMap,
        old: Option<&[u8; 128]>,
    ) -> GpuResult<[u8; 128]> {
        launch::tensor_map(self, t, old)
    }

    fn mem_info(&self) -> GpuResult<(u64, u64)> {
        Ok((self.total - self.bytes_allocated(), self.total))
    }

    unsafe fn copy_htod(&self, dst: u64, src: *const u8, len: usize, s: usize) -> GpuResult<()> {
        // SAFETY: the caller keeps the trait method's contract, which is the family
        // function's too.
        unsafe { memory::copy_htod(self, dst, src, len, s) }
    }

    unsafe fn copy_dtoh(&self, dst: *mut u8, src: u64, len: usize, s: usize) -> GpuResult<()> {
        // SAFETY: the caller keeps the trait method's contract, which is the family
        // function's too.
        unsafe { memory::copy_dtoh(self, dst, src, len, s) }
    }

    fn copy_dtod(&self, dst: u64, src: u64, len: usize, s: usize) -> GpuResult<()> {
        memory::copy_dtod(self, dst, src, len, s)
    }

    fn memset(
        &self,
        dst: u64,
        value: u32,
        elem_size: u32,
        count: usize,
        s: usize,
    ) -> GpuResult<()> {
        memory::memset(self, dst, value, elem_size, count, s)
    }

    unsafe fn wait_u32(&self, addr: *mut u32, value: u32, s: usize) -> GpuResult<()> {
        // SAFETY: the caller keeps the trait method's contract, which is the family
        // function's too.
        unsafe { memory::wait_u32(self, addr, value, s) }
    }

    unsafe fn wait_u32_eq(&self, addr: *mut u32, value: u32, s: usize) -> GpuResult<()> {
        // SAFETY: the caller keeps the trait method's contract, which is the family
        // function's too.
        unsafe { memory::wait_u32_eq(self, addr, value, s) }
    }

    unsafe fn write_u32(&self, addr: *mut u32, value: u32, s: usize) -> GpuResult<()> {
        // SAFETY: the caller keeps the trait method's contract, which is the family
        // function's too.
        unsafe { memory::write_u32(self, addr, value, s) }
    }

    unsafe fn register_host(&self, ptr: *mut u8, len: usize) -> GpuResult<()> {
        // SAFETY: the caller keeps the trait method's contract, which is the family
        // function's too.
        unsafe { memory::register_host(self, ptr, len) }
    }

    unsafe fn unregister_host(&self, ptr: *mut u8) -> GpuResult<()> {
        // SAFETY: the caller keeps the trait method's contract, which is the family
        // function's too.
        unsafe { memory::unregister_host(self, ptr) }
    }

    fn module_load(&self, image: &[u8]) -> GpuResult<LoadedModule> {
        modules::module_load(self, image)
    }

    fn image_data_bytes(&self, image: &[u8]) -> u64 {
        modules::image_data_bytes(image)
    }

    fn module_unload(&self, module: u64) -> GpuResult<()> {
        modules::module_unload(self, module)
    }

    fn module_global(&self, module: u64, name: &str) -> GpuResult<(u64, u64)> {
        modules::module_global(self, module, name)
    }

    fn func_attribute(&self, _func: u64, attr: i32) -> GpuResult<i32> {
        modules::func_attribute(_func, attr)
    }

    fn func_set_attribute(&self, _func: u64, attr: i32, value: i32) -> GpuResult<()> {
        modules::func_set_attribute(self, _func, attr, value)
    }

    fn query(&self, kind: u32, _func: u64, args: [i64; 7], _attrs: &[u8]) -> GpuResult<i64> {
        launch::query(self, kind, _func, args, _attrs)
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
        launch::launch(self, func, _grid, _block, _shared, s, attrs, args)
    }

    fn takes_runs(&self, _s: usize) -> bool {
        self.takes_runs.load(Ordering::Relaxed)
    }

    fn launch_run(&self, s: usize, run: &[crate::gpu::PlainLaunch<'_>]) -> GpuResult<()> {
        if !self.takes_runs.load(Ordering::Relaxed) {
            return Err(CuError(code::NOT_SUPPORTED));
        }
        // As a graph launch: all of it or none (a run of a function it does not know is
        // refused whole, and its launches then go one by one).
        if !run.iter().all(|l| launch::knows(self, l.func)) {
            return Err(CuError(code::INVALID_VALUE));
        }
        for l in run {
            launch::launch(self, l.func, l.grid, l.block, l.shared, s, &[], l.args)?;
        }
        self.runs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn event_create(&self, _flags: u32) -> GpuResult<u64> {
        streams::event_create(self, _flags)
    }

    fn event_destroy(&self, ev: u64) -> GpuResult<()> {
        self.recorded.lock().unwrap().remove(&ev);
        let mut st = self.state.lock().unwrap();
        st.events.remove(&ev).ok_or(CuError(code::INVALID_HANDLE))
    }

    fn event_record(&self, ev: u64, s: usize) -> GpuResult<()> {
        streams::event_record(self, ev, s)
    }

    fn stream_wait_event(&self, s: usize, ev: u64) -> GpuResult<()> {
        streams::stream_wait_event(self, s, ev)
    }

    fn event_query(&self, ev: u64) -> GpuResult<bool> {
        streams::event_query(self, ev)
    }

    fn capture_begin(&self, s: usize) -> GpuResult<()> {
        graphs::capture_begin(self, s)
    }

    fn capture_end(&self, s: usize) -> GpuResult<u64> {
        graphs::capture_end(self, s)
    }

    fn capture_status(&self, s: usize) -> GpuResult<(u32, u64)> {
        graphs::capture_status(self, s)
    }

    fn capture_graph(&self, s: usize) -> GpuResult<u64> {
        graphs::capture_graph(self, s)
    }

    fn capture_invalidate(&self, s: usize) {
        graphs::capture_invalidate(self, s)
    }

    fn graph_instantiate(&self, graph: u64, _flags: u64) -> GpuResult<u64> {
        graphs::graph_instantiate(self, graph, _flags)
    }

    fn graph_launch(&self, exec: u64, s: usize) -> GpuResult<()> {
        graphs::graph_launch(self, exec, s)
    }

    fn graph_upload(&self, exec: u64, _s: usize) -> GpuResult<()> {
        graphs::graph_upload(self, exec, _s)
    }

    fn graph_destroy(&self, graph: u64) -> GpuResult<()> {
        graphs::graph_destroy(self, graph)
    }

    fn graph_profile_twin(&self, graph: u64, flags: u64) -> GpuResult<crate::gpu::ProfileTwin> {
        graphs::graph_profile_twin(self, graph, flags)
    }

    fn graph_exec_set_event(&self, exec: u64, node: u64, event: u64) -> GpuResult<()> {
        graphs::graph_exec_set_event(self, exec, node, event)
    }

    fn graph_profile_twin_destroy(&self, twin: &crate::gpu::ProfileTwin) {
        graphs::graph_profile_twin_destroy(self, twin)
    }

    fn timer_start(&self) -> bool {
        true
    }

    fn timer_begin(&self, key: u64) {
        super::timer::begin(key)
    }

    fn timer_end(&self) {
        super::timer::end()
    }

    fn timer_take(&self, key: u64) -> Option<(u64, u64)> {
        super::timer::take(key)
    }

    fn graph_memory_ranges(&self, graph: u64) -> GpuResult<Vec<(u64, u64)>> {
        graphs::graph_memory_ranges(self, graph)
    }

    fn graph_nodes(&self, graph: u64) -> GpuResult<Vec<u64>> {
        graphs::graph_nodes(self, graph)
    }

    fn graph_node_type(&self, node: u64) -> GpuResult<u32> {
        graphs::graph_node_type(self, node)
    }

    fn graph_create(&self) -> GpuResult<u64> {
        graphs::graph_create(self)
    }

    fn cond_handle(&self, graph: u64, value: u32, flags: u32) -> GpuResult<u64> {
        graphs::cond_handle(self, graph, value, flags)
    }

    fn capture_conditional(
        &self,
        s: usize,
        handle: u64,
        kind: u32,
        size: u32,
        graph_ok: &dyn Fn(u64) -> bool,
    ) -> GpuResult<Vec<u64>> {
        graphs::capture_conditional(self, s, handle, kind, size, graph_ok)
    }

    fn capture_begin_to(&self, s: usize, graph: u64) -> GpuResult<()> {
        graphs::capture_begin_to(self, s, graph)
    }

    fn graph_clone(&self, graph: u64) -> GpuResult<u64> {
        graphs::graph_clone(self, graph)
    }

    fn capture_child(&self, s: usize, child: u64) -> GpuResult<()> {
        graphs::capture_child(self, s, child)
    }

    fn graph_exec_update(&self, exec: u64, graph: u64) -> GpuResult<()> {
        graphs::graph_exec_update(self, exec, graph)
    }

    fn graph_clear(&self, graph: u64) -> GpuResult<()> {
        graphs::graph_clear(self, graph)
    }

    fn graph_exec_destroy(&self, exec: u64) -> GpuResult<()> {
        graphs::graph_exec_destroy(self, exec)
    }

    /// The host time between the two records, as a GPU's timestamps would give it (a
    /// profiler's kernel times come from here); an event never recorded is refused, as
    /// the driver refuses it.
    fn event_elapsed(&self, start: u64, end: u64) -> GpuResult<f32> {
        self.run_queues();
        {
            let st = self.state.lock().unwrap();
            st.check()?;
            for e in [start, end] {
                st.events.get(&e).ok_or(CuError(code::INVALID_HANDLE))?;
            }
        }
        let rec = self.recorded.lock().unwrap();
        match (rec.get(&start), rec.get(&end)) {
            (Some(&a), Some(&b)) if b >= a => Ok((b - a).as_secs_f64() as f32 * 1e3),
            (Some(&a), Some(&b)) => Ok(-((a - b).as_secs_f64() as f32) * 1e3),
            _ => Err(CuError(code::INVALID_HANDLE)),
        }
    }

    fn stream_query(&self, _s: usize) -> GpuResult<bool> {
        self.run_queues();
        self.state.lock().unwrap().check().map(|_| true)
    }

    fn write_device_u32(&self, dptr: u64, value: u32, s: usize) -> GpuResult<()> {
        memory::write_device_u32(self, dptr, value, s)
    }

    fn array_create(&self, shape: &ArrayShape) -> GpuResult<(u64, u64)> {
        arrays::array_create(self, shape)
    }

    fn mipmap_create(&self, shape: &ArrayShape, levels: u32) -> GpuResult<(u64, u64)> {
        arrays::mipmap_create(self, shape, levels)
    }

    fn mipmap_level(&self, mip: u64, level: u32) -> GpuResult<u64> {
        arrays::mipmap_level(self, mip, level)
    }

    fn array_destroy(&self, array: u64) -> GpuResult<()> {
        arrays::array_destroy(self, array)
    }

    fn mipmap_destroy(&self, mip: u64) -> GpuResult<()> {
        arrays::mipmap_destroy(self, mip)
    }

    fn array_copy(
        &self,
        src: &CopyPlace,
        dst: &CopyPlace,
        extent: [u64; 3],
        _s: usize,
    ) -> GpuResult<()> {
        arrays::array_copy(self, src, dst, extent, _s)
    }

    fn tex_create(
        &self,
        res: &Resource,
        _tex: &[u32; 26],
        _view: Option<&[u32; 28]>,
    ) -> GpuResult<u64> {
        arrays::tex_create(self, res, _tex, _view)
    }

    fn tex_destroy(&self, tex: u64) -> GpuResult<()> {
        arrays::tex_destroy(self, tex)
    }

    fn surf_create(&self, array: u64) -> GpuResult<u64> {
        arrays::surf_create(self, array)
    }

    fn surf_destroy(&self, surf: u64) -> GpuResult<()> {
        arrays::surf_destroy(self, surf)
    }

    fn flush_printf(&self) -> GpuResult<()> {
        context::flush_printf(self)
    }

    fn set_printf_output(&self, out: std::os::fd::RawFd, err: std::os::fd::RawFd) {
        self.printf_fd.store(out, Ordering::Relaxed);
        self.assert_fd.store(err, Ordering::Relaxed);
    }
}
