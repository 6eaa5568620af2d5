// A client for scripts/faults/run.sh.
//   fault_client loop        works (launch, synchronize, check) until a call fails; then
//                            prints "error NAME after N rounds at T" (T: CLOCK_REALTIME
//                            in ns) and exits 3. Prints "ready" once it has worked once.
//   fault_client fault       launches a kernel that stores to an unmapped address and
//                            prints what the next synchronization returns.
//   fault_client once        one round, checked: prints "ok SUM" (as natively).
#include <cstdio>
#include <cstring>
#include <ctime>
#include <cstdint>
#include <cuda_runtime.h>

__global__ void fill(int *p, int v) { p[blockIdx.x * blockDim.x + threadIdx.x] = v + threadIdx.x; }
__global__ void bad(int *p) { p[threadIdx.x] = 1; }

static long long now_ns() {
    timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static cudaError_t round(int *d, int *h, int v, long long *sum) {
    fill<<<64, 256>>>(d, v);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpy(h, d, 64 * 256 * sizeof(int), cudaMemcpyDeviceToHost);
    *sum = 0;
    for (int i = 0; i < 64 * 256; i++) *sum += h[i];
    return e;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "once";
    int *d = nullptr;
    static int h[64 * 256];
    cudaError_t e = cudaMalloc(&d, sizeof h);
    if (e != cudaSuccess) {
        printf("error %s at malloc\n", cudaGetErrorName(e));
        return 2;
    }
    long long sum = 0;
    if (!strcmp(mode, "fault")) {
        bad<<<1, 32>>>((int *)(uintptr_t)0x1000);
        e = cudaDeviceSynchronize();
        printf("fault: synchronize returned %s\n", cudaGetErrorName(e));
        return e == cudaSuccess ? 1 : 0;
    }
    if (!strcmp(mode, "loop")) {
        for (long rounds = 0;; rounds++) {
            e = round(d, h, (int)rounds, &sum);
            if (e != cudaSuccess) {
                printf("error %s after %ld rounds at %lld\n", cudaGetErrorName(e), rounds, now_ns());
                fflush(stdout);
                return 3;
            }
            if (rounds == 0) {
                printf("ready\n");
                fflush(stdout);
            }
        }
    }
    e = round(d, h, 7, &sum);
    if (e != cudaSuccess) {
        printf("error %s\n", cudaGetErrorName(e));
        return 3;
    }
    printf("ok %lld\n", sum);
    return 0;
}
