// Probe (issue 23, finding 6): while cuModuleUnload waits for a kernel that runs long,
// do another thread's cuMemFreeAsync + synchronize of its free-only stream (what the
// server's releaser does) and cuMemAlloc go on? The server now unloads on a thread of its
// own (omps-server/src/releaser.rs) on the premise that they do. Stream 1 runs a 2 s
// kernel; thread U unloads a second module 100 ms in (it should wait ~1.9 s); the main
// thread meanwhile frees and allocates 64 MiB ten times and prints the worst of each.
// Expected: the unload ~1900 ms, frees and allocations well under 1 ms (they wait neither
// for the kernel nor for the unload).
//
//   nvcc -arch=sm_90 -cubin -o blocking_calls_kernels.cubin blocking_calls.cu
//   nvcc -arch=sm_90 -o unload_vs_free unload_vs_free.cu -lcuda
//   ./unload_vs_free blocking_calls_kernels.cubin
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s: %d\n", #x, r_); exit(1); } } while (0)

using clk = std::chrono::steady_clock;
static double ms_since(clk::time_point t) {
    return std::chrono::duration<double, std::milli>(clk::now() - t).count();
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "blocking_calls_kernels.cubin";
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUmodule m, other;
    CUfunction spin;
    CK(cuModuleLoad(&m, path));
    CK(cuModuleGetFunction(&spin, m, "_Z4spinx"));
    CK(cuModuleLoad(&other, path));
    CUstream s1, frees;
    CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&frees, CU_STREAM_NON_BLOCKING));
    long long ns = 2000000000;
    void *a[] = {&ns};
    CK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s1, a, nullptr));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    double unload_ms = 0;
    std::thread u([&] {
        CK(cuCtxSetCurrent(ctx));
        auto t = clk::now();
        CK(cuModuleUnload(other));
        unload_ms = ms_since(t);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    double worst_free = 0, worst_alloc = 0;
    auto during = clk::now();
    for (int i = 0; i < 10; i++) {
        CUdeviceptr p;
        auto t = clk::now();
        CK(cuMemAlloc(&p, 64 << 20));
        double at = ms_since(t);
        t = clk::now();
        CK(cuMemFreeAsync(p, frees));
        CK(cuStreamSynchronize(frees));
        double ft = ms_since(t);
        if (at > worst_alloc) worst_alloc = at;
        if (ft > worst_free) worst_free = ft;
    }
    double loop_ms = ms_since(during);
    u.join();
    CK(cuStreamSynchronize(s1));
    printf("unload waited %.1f ms; meanwhile 10 x (alloc, free+sync) took %.1f ms: "
           "worst alloc %.3f ms, worst free+sync %.3f ms\n",
           unload_ms, loop_ms, worst_alloc, worst_free);
    printf("%s\n", loop_ms < 100 && unload_ms > 1000 ? "PASS: frees go on beside a waiting unload"
                                                     : "FAIL: see the figures");
    return 0;
}
