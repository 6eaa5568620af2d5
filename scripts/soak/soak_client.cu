// A client for the kill soak (scripts/soak/soak.sh). As a victim (--victim) it loops for
// ever over what a client does, each step a different place to be killed: a module
// loaded from PTX (JIT) and unloaded, device allocations, copies both ways, launches,
// synchronizations, frees. As a survivor (--survivor N) it runs N rounds of the same and
// checks every result, then prints a line that depends only on N, and PASS.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                     \
    do {                                                                          \
        CUresult r_ = (x);                                                        \
        if (r_ != CUDA_SUCCESS) {                                                 \
            const char *s_ = "?";                                                 \
            cuGetErrorName(r_, &s_);                                              \
            printf("FAIL: %s returned %s at line %d\n", #x, s_, __LINE__);        \
            return 1;                                                             \
        }                                                                         \
    } while (0)

static const char *PTX = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry scale(.param .u64 p, .param .u32 n, .param .u32 k) {
  .reg .u64 %rd<4>; .reg .u32 %r<8>; .reg .pred %p;
  ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [n]; ld.param.u32 %r2, [k];
  mov.u32 %r3, %ctaid.x; mov.u32 %r4, %ntid.x; mov.u32 %r5, %tid.x;
  mad.lo.u32 %r6, %r3, %r4, %r5;
  setp.ge.u32 %p, %r6, %r1; @%p bra DONE;
  cvta.to.global.u64 %rd2, %rd1; mul.wide.u32 %rd3, %r6, 4; add.u64 %rd2, %rd2, %rd3;
  ld.global.u32 %r7, [%rd2]; mul.lo.u32 %r7, %r7, %r2; add.u32 %r7, %r7, 1; st.global.u32 [%rd2], %r7;
DONE: ret;
}
)";

static int round_(CUfunction f, CUstream s, unsigned n, unsigned k, unsigned long long *sum) {
    std::vector<unsigned> h(n), back(n);
    for (unsigned i = 0; i < n; i++) h[i] = i;
    CUdeviceptr d;
    CK(cuMemAlloc(&d, n * 4));
    CK(cuMemcpyHtoDAsync(d, h.data(), n * 4, s));
    void *args[] = {&d, &n, &k};
    CK(cuLaunchKernel(f, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, args, nullptr));
    CK(cuMemcpyDtoHAsync(back.data(), d, n * 4, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemFree(d));
    for (unsigned i = 0; i < n; i++) {
        if (back[i] != i * k + 1) {
            printf("FAIL: element %u is %u, want %u\n", i, back[i], i * k + 1);
            return 1;
        }
        *sum += back[i];
    }
    return 0;
}

int main(int argc, char **argv) {
    bool victim = argc > 1 && !strcmp(argv[1], "--victim");
    long rounds = argc > 2 ? atol(argv[2]) : 100;
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    unsigned long long sum = 0;
    for (long r = 0; victim || r < rounds; r++) {
        CUmodule m;
        CK(cuModuleLoadData(&m, PTX));
        CUfunction f;
        CK(cuModuleGetFunction(&f, m, "scale"));
        unsigned n = 1024 + (unsigned)(r % 7) * 4096;
        if (round_(f, s, n, 3 + (unsigned)(r % 5), &sum)) return 1;
        CK(cuModuleUnload(m));
    }
    printf("survivor: %ld rounds, checksum %llu\n", rounds, sum);
    printf("PASS\n");
    return 0;
}
