//! Prints the CUPTI numbers the shim writes (record sizes, field offsets, result codes,
//! kinds), one per line in the form `scripts/probe/cupti_layout.c` prints them from
//! CUDA's own headers, so that the GPU machine can diff the two
//! (`scripts/probe/cupti_layout.sh`).
use omps_shim::cupti::abi::{kind, off, record_size, result, sync_type};
use omps_shim::state::profile::{
    copy_kind, memory_kind, CBID_GRAPH_LAUNCH, CBID_LAUNCH_COOPERATIVE_KERNEL, CBID_LAUNCH_KERNEL,
    CBID_LAUNCH_KERNEL_EX,
};

fn main() {
    let size = |k| record_size(k).unwrap();
    let lines: Vec<(&str, usize)> = vec![
        (
            "sizeof CUpti_ActivityKernel10",
            size(kind::CONCURRENT_KERNEL),
        ),
        ("sizeof CUpti_ActivityMemcpy6", size(kind::MEMCPY)),
        ("sizeof CUpti_ActivityMemset4", size(kind::MEMSET)),
        ("sizeof CUpti_ActivityAPI", size(kind::DRIVER)),
        (
            "sizeof CUpti_ActivitySynchronization2",
            size(kind::SYNCHRONIZATION),
        ),
        (
            "sizeof CUpti_ActivityExternalCorrelation",
            size(kind::EXTERNAL_CORRELATION),
        ),
        (
            "kernel.registersPerThread",
            off::kernel::REGISTERS_PER_THREAD,
        ),
        ("kernel.start", off::kernel::START),
        ("kernel.end", off::kernel::END),
        ("kernel.completed", off::kernel::COMPLETED),
        ("kernel.deviceId", off::kernel::DEVICE_ID),
        ("kernel.contextId", off::kernel::CONTEXT_ID),
        ("kernel.streamId", off::kernel::STREAM_ID),
        ("kernel.gridX", off::kernel::GRID),
        ("kernel.blockX", off::kernel::BLOCK),
        ("kernel.staticSharedMemory", off::kernel::STATIC_SHARED),
        ("kernel.dynamicSharedMemory", off::kernel::DYNAMIC_SHARED),
        ("kernel.correlationId", off::kernel::CORRELATION_ID),
        ("kernel.gridId", off::kernel::GRID_ID),
        ("kernel.name", off::kernel::NAME),
        ("memcpy.copyKind", off::memcpy::COPY_KIND),
        ("memcpy.srcKind", off::memcpy::SRC_KIND),
        ("memcpy.dstKind", off::memcpy::DST_KIND),
        ("memcpy.bytes", off::memcpy::BYTES),
        ("memcpy.start", off::memcpy::START),
        ("memcpy.end", off::memcpy::END),
        ("memcpy.deviceId", off::memcpy::DEVICE_ID),
        ("memcpy.contextId", off::memcpy::CONTEXT_ID),
        ("memcpy.streamId", off::memcpy::STREAM_ID),
        ("memcpy.correlationId", off::memcpy::CORRELATION_ID),
        ("memset.value", off::memset::VALUE),
        ("memset.bytes", off::memset::BYTES),
        ("memset.start", off::memset::START),
        ("memset.end", off::memset::END),
        ("memset.deviceId", off::memset::DEVICE_ID),
        ("memset.contextId", off::memset::CONTEXT_ID),
        ("memset.streamId", off::memset::STREAM_ID),
        ("memset.correlationId", off::memset::CORRELATION_ID),
        ("memset.memoryKind", off::memset::MEMORY_KIND),
        ("api.cbid", off::api::CBID),
        ("api.start", off::api::START),
        ("api.end", off::api::END),
        ("api.processId", off::api::PROCESS_ID),
        ("api.threadId", off::api::THREAD_ID),
        ("api.correlationId", off::api::CORRELATION_ID),
        ("api.returnValue", off::api::RETURN_VALUE),
        ("sync.type", off::sync::TYPE),
        ("sync.start", off::sync::START),
        ("sync.end", off::sync::END),
        ("sync.correlationId", off::sync::CORRELATION_ID),
        ("sync.contextId", off::sync::CONTEXT_ID),
        ("sync.streamId", off::sync::STREAM_ID),
        ("sync.cudaEventId", off::sync::EVENT_ID),
        ("sync.returnValue", off::sync::RETURN_VALUE),
        ("external.externalKind", off::external::EXTERNAL_KIND),
        ("external.externalId", off::external::EXTERNAL_ID),
        ("external.correlationId", off::external::CORRELATION_ID),
        (
            "CUPTI_ERROR_INVALID_PARAMETER",
            result::INVALID_PARAMETER as usize,
        ),
        (
            "CUPTI_ERROR_MAX_LIMIT_REACHED",
            result::MAX_LIMIT_REACHED as usize,
        ),
        (
            "CUPTI_ERROR_NOT_INITIALIZED",
            result::NOT_INITIALIZED as usize,
        ),
        ("CUPTI_ERROR_INVALID_KIND", result::INVALID_KIND as usize),
        ("CUPTI_ERROR_NOT_SUPPORTED", result::NOT_SUPPORTED as usize),
        (
            "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
            result::MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED as usize,
        ),
        ("CUPTI_ACTIVITY_KIND_MEMCPY", kind::MEMCPY as usize),
        ("CUPTI_ACTIVITY_KIND_MEMSET", kind::MEMSET as usize),
        ("CUPTI_ACTIVITY_KIND_KERNEL", kind::KERNEL as usize),
        ("CUPTI_ACTIVITY_KIND_DRIVER", kind::DRIVER as usize),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", kind::RUNTIME as usize),
        (
            "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL",
            kind::CONCURRENT_KERNEL as usize,
        ),
        ("CUPTI_ACTIVITY_KIND_OVERHEAD", kind::OVERHEAD as usize),
        (
            "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
            kind::SYNCHRONIZATION as usize,
        ),
        (
            "CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION",
            kind::EXTERNAL_CORRELATION as usize,
        ),
        ("CUPTI_ACTIVITY_MEMCPY_KIND_HTOD", copy_kind::HTOD as usize),
        ("CUPTI_ACTIVITY_MEMCPY_KIND_DTOH", copy_kind::DTOH as usize),
        ("CUPTI_ACTIVITY_MEMCPY_KIND_DTOD", copy_kind::DTOD as usize),
        ("CUPTI_ACTIVITY_MEMCPY_KIND_PTOP", copy_kind::PTOP as usize),
        (
            "CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE",
            memory_kind::PAGEABLE as usize,
        ),
        (
            "CUPTI_ACTIVITY_MEMORY_KIND_PINNED",
            memory_kind::PINNED as usize,
        ),
        (
            "CUPTI_ACTIVITY_MEMORY_KIND_DEVICE",
            memory_kind::DEVICE as usize,
        ),
        (
            "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE",
            sync_type::EVENT_SYNCHRONIZE as usize,
        ),
        (
            "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT",
            sync_type::STREAM_WAIT_EVENT as usize,
        ),
        (
            "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE",
            sync_type::STREAM_SYNCHRONIZE as usize,
        ),
        (
            "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE",
            sync_type::CONTEXT_SYNCHRONIZE as usize,
        ),
        (
            "CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel",
            CBID_LAUNCH_KERNEL as usize,
        ),
        (
            "CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx",
            CBID_LAUNCH_KERNEL_EX as usize,
        ),
        (
            "CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel",
            CBID_LAUNCH_COOPERATIVE_KERNEL as usize,
        ),
        (
            "CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch",
            CBID_GRAPH_LAUNCH as usize,
        ),
    ];
    for (name, v) in lines {
        println!("{name} {v}");
    }
}
