"""The CUDA programs of the GPU harness (tests/gpu), in the order they are built and run,
and how nvcc builds each. It exists so that a new test program is its source file plus one
line here: the tests parametrize over these lists and the build reads them; nothing else
changes. (Until issue 24 these lists were variables at the top of scripts/gpu-e2e.sh.)
"""

# ---------------------------------------------------------------- driver API: tests/cuda

COMPARE = "compare"  # run natively and under omps, outputs diffed (test_driver_programs.py)
TOOL = "tool"        # built for a measure only (spin_concurrency, hold_memory)

# tests/cuda/NAME.cpp, built with `nvcc -cudart none -O2 -std=c++17 -Xcompiler -Wall -lcuda`,
# in build order; the COMPARE ones run in this order too.
DRIVER_PROGRAMS = [
    ("vector_add", COMPARE),
    ("kernel_args", COMPARE),
    ("memcpy_roundtrip", COMPARE),
    ("streams_events", COMPARE),
    ("module_globals", COMPARE),
    ("dyn_shared", COMPARE),
    ("spin_concurrency", TOOL),
    ("hold_memory", TOOL),
    ("tensor_maps", COMPARE),
    ("vmm_and_pools", COMPARE),
]

# Kernel images the driver programs load at run time: tests/cuda/SOURCE.cu -> IMAGE. The
# image's suffix picks nvcc's flags (e2e_build.IMAGE_FLAGS).
KERNEL_IMAGES = [
    ("vector_add_kernel", "vector_add.fatbin"),
    ("dyn_shared_kernel", "dyn_shared.fatbin"),
    ("kernel_args_kernel", "kernel_args.cubin"),
    ("streams_events_kernel", "streams_events.cubin"),
    ("spin_kernel", "spin.cubin"),
    ("module_globals_kernel", "module_globals.ptx"),
]


def driver_compared():
    return [name for name, kind in DRIVER_PROGRAMS if kind == COMPARE]


# ---------------------------------------------------------------- runtime API: tests/cuda/rt

# tests/cuda/rt/NAME.cu, built with nvcc's default flags (static cudart) plus -arch, run
# natively and under omps both ways in (test_runtime_programs.py), in this order.
RT_PROGRAMS = """
    device_props error_names vector_add memset memcpy2d3d memcpy_default pointer_attrs
    streams events async_copy pinned mapped host_register atomics dyn_shared symbols
    coop_grid_sync callbacks templates threads no_free stream_priority per_thread_stream
    legacy_stream device_sync device_printf func_attrs occupancy launch_ex invalid_launch
    host_func_order graph_capture graph_manual graph_mem_nodes user_objects managed
    texture_surface vmm_ipc dyn_parallel graph_queries conditional_nodes conditional_capture
    capture_modes graph_captured_child multi_gpu
    ipc_memory
""".split()

# Run after every other runtime-API program (test_faults_last.py): each ends the omps
# server's context, and after each omps run the server must be ACTIVE again by itself.
RT_FAULT_PROGRAMS = ["kernel_fault", "device_assert"]

# Built beside them for the measures (test_overhead.py, test_printf_beside.py).
RT_TOOLS = ["bench_overhead"]

# Flags beyond -arch, and libraries, for the programs that need them.
RT_FLAGS = {
    "per_thread_stream": ["--default-stream", "per-thread"],
    "dyn_parallel": ["-rdc=true"],
}
RT_LIBS = {
    "dyn_parallel": ["-lcudadevrt"],
}


def rt_all():
    """Every runtime-API program in table (and run) order: the faults last."""
    return RT_PROGRAMS + RT_FAULT_PROGRAMS
