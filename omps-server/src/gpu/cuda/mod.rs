//! [`Gpu`] on the real CUDA driver, loaded at run time through cudarc's `sys` layer.

pub mod arrays;
mod batch;
mod context;
mod cupti;
mod device;
mod graph_profile;
mod graphs;
pub mod green;
mod launch;
mod memory;
mod modules;
mod run_graphs;
mod streams;
mod verify;
mod vmm;

pub use device::{driver_present, init, CudaGpu};
pub use verify::{verify_jit, verify_link, verify_load};

use crate::gpu::{Gpu, GpuResult, LoadedModule};
use omps_ring::segment::DeviceSnapshot;

impl Gpu for CudaGpu {
    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn snapshot(&self) -> DeviceSnapshot {
        context::snapshot(self)
    }

    fn layout(&self) -> crate::sched::placement::Layout {
        self.layout
    }

    fn quiet(&self) -> bool {
        context::quiet(self)
    }

    fn sm_chunks(&self) -> crate::sched::confine::SmChunks {
        self.green.chunks
    }

    fn confine(&self, slot: usize, set: &crate::sched::confine::SmSet) -> GpuResult<u32> {
        context::confine(self, slot, set)
    }

    fn reset(&self) -> GpuResult<()> {
        context::reset(self)
    }

    fn reaches(&self, peer: usize) -> bool {
        context::reaches(self, peer)
    }

    fn peer_attributes(&self, peer: usize) -> [i32; omps_ring::segment::P2P_ATTRIBUTES] {
        context::peer_attributes(self, peer)
    }

    fn enable_peer(&self, peer: usize) -> GpuResult<()> {
        context::enable_peer(self, peer)
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
        memory::settle_frees(self)
    }

    fn vmm_reserve(&self, size: u64, align: u64, hint: u64) -> GpuResult<u64> {
        vmm::vmm_reserve(self, size, align, hint)
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

    fn vmm_unmap(&self, ptr: u64, size: u64) -> GpuResult<()> {
        vmm::vmm_unmap(self, ptr, size)
    }

    fn vmm_set_access(&self, ptr: u64, size: u64, gpus: &[usize]) -> GpuResult<()> {
        vmm::vmm_set_access(self, ptr, size, gpus)
    }

    fn vmm_granularity(&self, recommended: bool, compressible: bool) -> GpuResult<u64> {
        vmm::vmm_granularity(self, recommended, compressible)
    }

    fn link(
        &self,
        options: &[(u32, u64)],
        inputs: &[(u32, &str, &[u8])],
    ) -> (GpuResult<Vec<u8>>, String, String) {
        modules::link(self, options, inputs)
    }

    fn tensor_map(
        &self,
        t: &omps_ring::wire::TensorMap,
        old: Option<&[u8; 128]>,
    ) -> GpuResult<[u8; 128]> {
        launch::tensor_map(self, t, old)
    }

    fn mem_info(&self) -> GpuResult<(u64, u64)> {
        memory::mem_info(self)
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

    unsafe fn write_u32(&self, addr: *mut u32, value: u32, s: usize) -> GpuResult<()> {
        // SAFETY: the caller keeps the trait method's contract, which is the family
        // function's too.
        unsafe { memory::write_u32(self, addr, value, s) }
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

    fn module_load_jit(
        &self,
        ptx: &[u8],
        options: &[(u32, u64)],
    ) -> (GpuResult<LoadedModule>, String, String) {
        modules::module_load_jit(self, ptx, options)
    }

    fn image_data_bytes(&self, image: &[u8]) -> u64 {
        modules::image_data_bytes(self, image)
    }

    fn module_unload(&self, module: u64) -> GpuResult<()> {
        modules::module_unload(self, module)
    }

    fn module_global(&self, module: u64, name: &str) -> GpuResult<(u64, u64)> {
        modules::module_global(self, module, name)
    }

    fn func_attribute(&self, func: u64, attr: i32) -> GpuResult<i32> {
        modules::func_attribute(self, func, attr)
    }

    fn func_set_attribute(&self, func: u64, attr: i32, value: i32) -> GpuResult<()> {
        modules::func_set_attribute(self, func, attr, value)
    }

    fn query(&self, kind: u32, func: u64, a: [i64; 7], attrs: &[u8]) -> GpuResult<i64> {
        launch::query(self, kind, func, a, attrs)
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
        launch::launch(self, func, grid, block, shared, s, attrs, args)
    }

    fn takes_runs(&self, s: usize) -> bool {
        batch::takes_runs(self, s)
    }

    fn launch_run(&self, s: usize, run: &[crate::gpu::PlainLaunch<'_>]) -> GpuResult<()> {
        batch::launch_run(self, s, run)
    }

    fn event_create(&self, flags: u32) -> GpuResult<u64> {
        streams::event_create(self, flags)
    }

    fn event_destroy(&self, ev: u64) -> GpuResult<()> {
        streams::event_destroy(self, ev)
    }

    fn event_record(&self, ev: u64, s: usize) -> GpuResult<()> {
        streams::event_record(self, ev, s)
    }

    fn stream_wait_event(&self, s: usize, ev: u64) -> GpuResult<()> {
        streams::stream_wait_event(self, s, ev)
    }

    fn event_record_external(&self, ev: u64, s: usize) -> GpuResult<()> {
        streams::event_record_external(self, ev, s)
    }

    fn stream_wait_event_external(&self, s: usize, ev: u64) -> GpuResult<()> {
        streams::stream_wait_event_external(self, s, ev)
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

    fn graph_instantiate(&self, graph: u64, flags: u64) -> GpuResult<u64> {
        graphs::graph_instantiate(self, graph, flags)
    }

    fn graph_launch(&self, exec: u64, s: usize) -> GpuResult<()> {
        graphs::graph_launch(self, exec, s)
    }

    fn graph_upload(&self, exec: u64, s: usize) -> GpuResult<()> {
        graphs::graph_upload(self, exec, s)
    }

    fn graph_destroy(&self, graph: u64) -> GpuResult<()> {
        graphs::graph_destroy(self, graph)
    }

    fn graph_nodes(&self, graph: u64) -> GpuResult<Vec<u64>> {
        graphs::graph_nodes(self, graph)
    }

    fn graph_memory_ranges(&self, graph: u64) -> GpuResult<Vec<(u64, u64)>> {
        graphs::graph_memory_ranges(self, graph)
    }

    fn graph_profile_twin(&self, graph: u64, flags: u64) -> GpuResult<crate::gpu::ProfileTwin> {
        graph_profile::graph_profile_twin(self, graph, flags)
    }

    fn graph_exec_set_event(&self, exec: u64, node: u64, event: u64) -> GpuResult<()> {
        graph_profile::graph_exec_set_event(self, exec, node, event)
    }

    fn graph_profile_twin_destroy(&self, twin: &crate::gpu::ProfileTwin) {
        graph_profile::graph_profile_twin_destroy(self, twin)
    }

    fn timer_start(&self) -> bool {
        cupti::start()
    }

    fn timer_stop(&self) {
        cupti::stop()
    }

    fn timer_begin(&self, key: u64) {
        cupti::begin(key)
    }

    fn timer_end(&self) {
        cupti::end()
    }

    fn timer_take(&self, key: u64) -> Option<(u64, u64)> {
        cupti::take(key)
    }

    fn timer_settle(&self) {
        cupti::settle()
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

    fn event_elapsed(&self, start: u64, end: u64) -> GpuResult<f32> {
        streams::event_elapsed(self, start, end)
    }

    fn write_device_u32(&self, dptr: u64, value: u32, s: usize) -> GpuResult<()> {
        memory::write_device_u32(self, dptr, value, s)
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
        context::flush_printf(self)
    }

    fn stream_query(&self, s: usize) -> GpuResult<bool> {
        streams::stream_query(self, s)
    }
}
