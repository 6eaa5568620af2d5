// Probe: what each driver call on omps-server's allocation and free path costs, to see
// where a cudaMalloc + cudaFree pair under omps goes (docs/benchmarks.md).
//
//   nvcc -arch=sm_90 -o free_costs free_costs.cu -lcuda && ./free_costs
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <vector>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s: %d\n", #x, r_); return 1; } } while (0)

using clk = std::chrono::steady_clock;
static double us_since(clk::time_point t) {
    return std::chrono::duration<double, std::micro>(clk::now() - t).count();
}

__global__ void spin(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}

int main(int argc, char **argv) {
    // With an argument the runtime goes first: does cudart set the context up differently?
    if (argc > 1) {
        cudaFree(0);
        void *q;
        for (int i = 0; i < 100; i++) { cudaMalloc(&q, 1 << 20); cudaFree(q); }
        auto t0 = clk::now();
        for (int i = 0; i < 2000; i++) { cudaMalloc(&q, 1 << 20); cudaFree(q); }
        printf("cudaMalloc+cudaFree 1 MiB, pair (runtime):   %8.2f us\n", us_since(t0) / 2000);
        unsigned flags = 0; int active = 0;
        cuDevicePrimaryCtxGetState(0, &flags, &active);
        printf("primary context flags after the runtime:     0x%x (active %d)\n", flags, active);
    }
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUstream a, m;
    CK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&m, CU_STREAM_NON_BLOCKING));
    const int N = 2000;
    const size_t MiB = 1 << 20;
    CUdeviceptr p;
    for (int i = 0; i < 100; i++) { CK(cuMemAlloc(&p, MiB)); CK(cuMemFree(p)); }

    auto t = clk::now();
    for (int i = 0; i < N; i++) { CK(cuMemAlloc(&p, MiB)); CK(cuMemFree(p)); }
    printf("cuMemAlloc+cuMemFree 1 MiB, pair:            %8.2f us\n", us_since(t) / N);
    t = clk::now();
    for (int i = 0; i < N; i++) { CK(cuMemAlloc(&p, 4096)); CK(cuMemFree(p)); }
    printf("cuMemAlloc+cuMemFree 4 KiB, pair:            %8.2f us\n", us_since(t) / N);
    t = clk::now();
    for (int i = 0; i < N; i++) { CK(cuMemAllocAsync(&p, MiB, a)); CK(cuMemFreeAsync(p, a)); }
    CK(cuStreamSynchronize(a));
    printf("cuMemAllocAsync+cuMemFreeAsync 1 MiB, pair:  %8.2f us\n", us_since(t) / N);

    std::vector<CUdeviceptr> ps(N);
    t = clk::now();
    for (int i = 0; i < N; i++) CK(cuMemAlloc(&ps[i], MiB));
    printf("cuMemAlloc 1 MiB, none freed between:        %8.2f us\n", us_since(t) / N);
    t = clk::now();
    for (int i = 0; i < N; i++) CK(cuMemFree(ps[i]));
    printf("cuMemFree 1 MiB, one after another:          %8.2f us\n", us_since(t) / N);

    std::vector<CUevent> evs(N);
    t = clk::now();
    for (int i = 0; i < N; i++) CK(cuEventCreate(&evs[i], CU_EVENT_DISABLE_TIMING));
    printf("cuEventCreate (disable timing):              %8.2f us\n", us_since(t) / N);
    t = clk::now();
    for (int i = 0; i < N; i++) CK(cuEventRecord(evs[i], a));
    printf("cuEventRecord:                               %8.2f us\n", us_since(t) / N);
    t = clk::now();
    for (int i = 0; i < N; i++) CK(cuStreamWaitEvent(m, evs[i], 0));
    printf("cuStreamWaitEvent:                           %8.2f us\n", us_since(t) / N);
    CK(cuStreamSynchronize(m));
    t = clk::now();
    for (int i = 0; i < N; i++) CK(cuEventQuery(evs[i]));
    printf("cuEventQuery (complete):                     %8.2f us\n", us_since(t) / N);
    t = clk::now();
    for (int i = 0; i < N; i++) CK(cuEventDestroy(evs[i]));
    printf("cuEventDestroy:                              %8.2f us\n", us_since(t) / N);

    // A free while another stream runs a long kernel: does it wait for the GPU?
    CK(cuMemAlloc(&p, MiB));
    spin<<<1, 32, 0, a>>>(200000000ll);
    t = clk::now();
    CK(cuMemFree(p));
    printf("cuMemFree with a 200 ms kernel running:      %8.2f us\n", us_since(t));
    CK(cuStreamSynchronize(a));
    printf("PASS\n");
    return 0;
}
