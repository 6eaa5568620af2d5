// Not a test: what managed memory costs (docs/benchmarks.md). A 256 MiB buffer, allocated
// managed and, for comparison, as device memory; after a prefetch to the device, a kernel
// reads it (sum) and one writes it, 20 times each; then the CPU reads it all once.
// Prints `BENCH <key> <value> <unit>` lines.
#include "rt_common.h"

__global__ void sum(const uint4 *p, size_t n, unsigned long long *out) {
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += p[i].x + p[i].w;
    atomicAdd(out, s);
}

__global__ void fill(uint4 *p, size_t n, unsigned v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = make_uint4(v, v, v, v);
}

static const size_t BYTES = 256u << 20;
static const size_t N = BYTES / sizeof(uint4);

static double seconds() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void measure(const char *kind, uint4 *p, bool managed) {
    unsigned long long *acc;
    CHECK(cudaMalloc(&acc, sizeof *acc));
    fill<<<264, 512>>>(p, N, 1);
    CHECK(cudaDeviceSynchronize());
    if (managed) {
        cudaMemLocation dev = {cudaMemLocationTypeDevice, 0};
        CHECK(cudaMemPrefetchAsync(p, BYTES, dev, 0, 0));
        CHECK(cudaDeviceSynchronize());
    }
    const int reps = 20;
    double t0 = seconds();
    for (int i = 0; i < reps; i++) sum<<<264, 512>>>(p, N, acc);
    CHECK(cudaDeviceSynchronize());
    double read = reps * (double)BYTES / (seconds() - t0) / 1e9;
    t0 = seconds();
    for (int i = 0; i < reps; i++) fill<<<264, 512>>>(p, N, i);
    CHECK(cudaDeviceSynchronize());
    double write = reps * (double)BYTES / (seconds() - t0) / 1e9;
    printf("BENCH %s_kernel_read %.1f GB/s\n", kind, read);
    printf("BENCH %s_kernel_write %.1f GB/s\n", kind, write);
    if (managed) {
        t0 = seconds();
        unsigned long long s = 0;
        const uint32_t *w = (const uint32_t *)p;
        for (size_t i = 0; i < BYTES / 4; i += 1024) s += w[i];
        double host = seconds() - t0;
        printf("BENCH managed_cpu_first_read_after_gpu %.2f ms (checksum %llu)\n", host * 1e3, s);
    }
    CHECK(cudaFree(acc));
}

int main() {
    uint4 *m, *d;
    CHECK(cudaMallocManaged(&m, BYTES));
    memset(m, 0, BYTES);
    CHECK(cudaMalloc(&d, BYTES));
    measure("device", d, false);
    measure("managed", m, true);
    CHECK(cudaFree(m));
    CHECK(cudaFree(d));
    pass();
}
