// Dynamic parallelism (CDP2, built with -rdc=true and cudadevrt): a kernel launches child
// kernels from the device, fire-and-forget and as a tail launch; the host sees what the
// children wrote. NVIDIA's MPS refuses modules that use dynamic parallelism.
#include "rt_common.h"

__global__ void child(int *p, int base, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[base + i] = base + i;
}

__global__ void tail(int *p, int n, int *sum) {
    int s = 0;
    for (int i = 0; i < n; i++) s += p[i];
    *sum = s;
}

__global__ void parent(int *p, int n, int *sum) {
    // Each of 4 threads hands a quarter of the buffer to a child grid.
    int q = n / 4;
    child<<<(q + 127) / 128, 128, 0, cudaStreamFireAndForget>>>(p, threadIdx.x * q, q);
    if (threadIdx.x == 0) tail<<<1, 1, 0, cudaStreamTailLaunch>>>(p, n, sum);
}

int main() {
    const int n = 4096;
    int *p, *sum;
    CHECK(cudaMalloc(&p, n * sizeof(int)));
    CHECK(cudaMalloc(&sum, sizeof(int)));
    CHECK(cudaMemset(p, 0, n * sizeof(int)));
    parent<<<1, 4>>>(p, n, sum);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    int s = 0;
    CHECK(cudaMemcpy(&s, sum, sizeof s, cudaMemcpyDeviceToHost));
    printf("sum of what the children wrote: %d (expected %d)\n", s, n * (n - 1) / 2);
    if (s != n * (n - 1) / 2) fail("children's writes");
    pass();
}
