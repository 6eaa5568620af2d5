// Probe (issue 8): which driver calls wait for the GPU, and do they hold up another
// thread's launches into the same context while they wait? For each call: stream 1 runs a
// 300 ms kernel; thread L launches empty kernels on stream 2 and syncs them in a loop,
// recording the longest launch and launch+sync; the main thread makes the call 50 ms in.
// Printed per call: how long the call took, and L's longest launch / launch+sync while it
// ran (a few us when the call does not hold L up; ~250 ms when it does).
//
//   nvcc -arch=sm_90 -cubin -o blocking_calls_kernels.cubin blocking_calls.cu
//   nvcc -arch=sm_90 -o blocking_calls blocking_calls.cu -lcuda
//   ./blocking_calls blocking_calls_kernels.cubin
#include <cuda.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s: %d\n", #x, r_); exit(1); } } while (0)

using clk = std::chrono::steady_clock;
static double ms_since(clk::time_point t) {
    return std::chrono::duration<double, std::milli>(clk::now() - t).count();
}

__global__ void spin(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
__global__ void empty() {}

static CUcontext ctx;
static CUfunction f_spin, f_empty;
static CUmodule self_mod;

static void run(const char *name, std::function<void()> call) {
    CUstream s1, s2;
    CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    long long ns = 300000000;
    void *a[] = {&ns};
    std::atomic<bool> stop{false};
    double worst_launch = 0, worst_pair = 0;
    std::thread l([&] {
        CK(cuCtxSetCurrent(ctx));
        while (!stop.load()) {
            auto t = clk::now();
            CK(cuLaunchKernel(f_empty, 1, 1, 1, 1, 1, 1, 0, s2, nullptr, nullptr));
            double lt = ms_since(t);
            CK(cuStreamSynchronize(s2));
            double pt = ms_since(t);
            if (lt > worst_launch) worst_launch = lt;
            if (pt > worst_pair) worst_pair = pt;
        }
    });
    CK(cuLaunchKernel(f_spin, 1, 1, 1, 1, 1, 1, 0, s1, a, nullptr));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto t = clk::now();
    call();
    double took = ms_since(t);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stop = true;
    l.join();
    CK(cuStreamSynchronize(s1));
    printf("%-34s call %8.2f ms | other thread: worst launch %8.3f ms, launch+sync %8.3f ms\n",
           name, took, worst_launch, worst_pair);
    CK(cuStreamDestroy(s1));
    CK(cuStreamDestroy(s2));
}

int main(int argc, char **argv) {
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    // The kernels come from a cubin of this file built separately (see the command below),
    // loaded with the driver API, so the program uses no runtime.
    CK(cuModuleLoad(&self_mod, argc > 1 ? argv[1] : "blocking_calls_kernels.cubin"));
    CK(cuModuleGetFunction(&f_spin, self_mod, "_Z4spinx"));
    CK(cuModuleGetFunction(&f_empty, self_mod, "_Z5emptyv"));
    // warm up
    run("nothing (baseline)", [] {});
    run("cuMemAlloc 64 MiB", [] { CUdeviceptr p; CK(cuMemAlloc(&p, 64 << 20)); });
    CUdeviceptr p;
    CK(cuMemAlloc(&p, 64 << 20));
    run("cuMemFree 64 MiB", [&] { CK(cuMemFree(p)); });
    CUdeviceptr r;
    CK(cuMemAlloc(&r, 64 << 20));
    run("cuMemFreeAsync of cuMemAlloc memory", [&] {
        CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CUresult e = cuMemFreeAsync(r, s);
        printf("  (cuMemFreeAsync of cuMemAlloc'd memory returned %d)\n", e);
        CK(cuStreamSynchronize(s)); CK(cuStreamDestroy(s)); });
    const char *path = argc > 1 ? argv[1] : "blocking_calls_kernels.cubin";
    CUlibrary lib;
    run("cuLibraryLoadFromFile", [&] { CK(cuLibraryLoadFromFile(&lib, path, nullptr, nullptr, 0, nullptr, nullptr, 0)); });
    run("first launch of a library kernel", [&] {
        CUkernel k; CK(cuLibraryGetKernel(&k, lib, "_Z5emptyv"));
        CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CK(cuLaunchKernel((CUfunction)k, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr));
        CK(cuStreamSynchronize(s)); CK(cuStreamDestroy(s)); });
    run("cuLibraryUnload", [&] { CK(cuLibraryUnload(lib)); });
    CUdeviceptr q;
    CK(cuMemAllocAsync(&q, 1 << 20, 0));
    CK(cuStreamSynchronize(0));
    run("cuMemFreeAsync 1 MiB (own stream)", [&] {
        CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CK(cuMemFreeAsync(q, s)); CK(cuStreamDestroy(s)); });
    CUmodule m2;
    run("cuModuleLoad (cubin)", [&] { CK(cuModuleLoad(&m2, argc > 1 ? argv[1] : "blocking_calls_kernels.cubin")); });
    CK(cuModuleUnload(m2));
    // Does a load wait because the code area must grow? Grow it first with many loads,
    // give them back, then load again while the GPU is busy.
    if (argc > 2) {
        int n = atoi(argv[2]);
        std::vector<CUmodule> many(n);
        for (auto &m : many) CK(cuModuleLoad(&m, argv[1]));
        for (auto m : many) CK(cuModuleUnload(m));
        printf("(loaded and unloaded %d modules first)\n", n);
    }
    run("cuModuleLoad after growth", [&] { CK(cuModuleLoad(&m2, argc > 1 ? argv[1] : "blocking_calls_kernels.cubin")); });
    run("cuModuleUnload", [&] { CK(cuModuleUnload(m2)); });
    run("cuCtxSetLimit stack 4 KiB", [] { CK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4096)); });
    run("cuCtxSetLimit malloc heap 16 MiB", [] { CK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 16 << 20)); });
    std::vector<char> host(16 << 20);
    run("cuMemHostRegister 16 MiB", [&] { CK(cuMemHostRegister(host.data(), host.size(), 0)); });
    run("cuMemHostUnregister", [&] { CK(cuMemHostUnregister(host.data())); });
    CUevent e;
    CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    run("cuEventDestroy", [&] { CK(cuEventDestroy(e)); });
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    run("cuStreamDestroy", [&] { CK(cuStreamDestroy(s)); });
    run("cuStreamCreate", [&] { CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)); });
    return 0;
}
