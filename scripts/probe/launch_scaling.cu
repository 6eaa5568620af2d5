// Launch rate of one process from T threads, each launching empty kernels on its own
// stream: every stream in the primary context, or each thread's stream in a green context
// of its own that spans every SM. Does the one-context launch cap (about 680k/s) lift when
// the streams belong to different green contexts?
//   nvcc -O2 -arch=sm_90 -o launch_scaling scripts/probe/launch_scaling.cu -lcuda -lpthread
//   ./launch_scaling            prints "MODE threads launches/s" lines
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

static const char *PTX = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry empty() { ret; }
)";

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_ = 0; \
    cuGetErrorName(r_, &n_); fprintf(stderr, "%s: %s\n", #x, n_ ? n_ : "?"); exit(1); } } while (0)

static double rate(std::vector<CUcontext> ctx, CUfunction f, std::vector<CUstream> &streams, double secs) {
    int t = (int)streams.size();
    std::vector<long long> n(t, 0);
    std::vector<std::thread> th;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < t; i++) {
        th.emplace_back([&, i] {
            cuCtxSetCurrent(ctx[i]);
            auto start = std::chrono::steady_clock::now();
            while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < secs) {
                for (int k = 0; k < 1000; k++)
                    if (cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, streams[i], nullptr, nullptr) != CUDA_SUCCESS) return;
                n[i] += 1000;
                cuStreamSynchronize(streams[i]);
            }
        });
    }
    for (auto &x : th) x.join();
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    long long total = 0;
    for (auto v : n) total += v;
    return total / el;
}

int main() {
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext prim;
    CK(cuDevicePrimaryCtxRetain(&prim, dev));
    CK(cuCtxSetCurrent(prim));
    CUmodule mod;
    CK(cuModuleLoadData(&mod, PTX));
    CUfunction f;
    CK(cuModuleGetFunction(&f, mod, "empty"));
    CUdevResource sms;
    CK(cuDeviceGetDevResource(dev, &sms, CU_DEV_RESOURCE_TYPE_SM));
    for (int t : {1, 2, 4, 8, 12}) {
        std::vector<CUstream> ss(t);
        for (auto &s : ss) CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        printf("primary %d %.0f\n", t, rate(std::vector<CUcontext>(t, prim), f, ss, 1.5));
        fflush(stdout);
        for (auto s : ss) cuStreamDestroy(s);
        // One green context per thread, each over every SM.
        std::vector<CUgreenCtx> g(t);
        std::vector<CUstream> gs(t);
        bool ok = true;
        for (int i = 0; i < t && ok; i++) {
            CUdevResourceDesc desc;
            ok = cuDevResourceGenerateDesc(&desc, &sms, 1) == CUDA_SUCCESS &&
                 cuGreenCtxCreate(&g[i], desc, dev, CU_GREEN_CTX_DEFAULT_STREAM) == CUDA_SUCCESS &&
                 cuGreenCtxStreamCreate(&gs[i], g[i], CU_STREAM_NON_BLOCKING, 0) == CUDA_SUCCESS;
        }
        if (!ok) { printf("green %d failed to create\n", t); continue; }
        std::vector<CUcontext> gc(t);
        for (int i = 0; i < t; i++) CK(cuCtxFromGreenCtx(&gc[i], g[i]));
        printf("green %d %.0f\n", t, rate(gc, f, gs, 1.5));
        fflush(stdout);
        for (int i = 0; i < t; i++) { cuStreamDestroy(gs[i]); cuGreenCtxDestroy(g[i]); }
    }
    return 0;
}
