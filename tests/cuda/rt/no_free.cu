// Exits without freeing anything: device memory, pinned and mapped host
// memory, a registered range, streams and events stay allocated, and a kernel
// and a copy are still queued when main returns.
#include "rt_common.h"

__global__ void fill(int *p, int n, int v) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v ^ i;
}

int main() {
    const int n = 16 << 20;  // 64 MiB of ints
    int *d[4];
    for (int i = 0; i < 4; i++) CHECK(cudaMalloc(&d[i], n * sizeof(int)));
    int *pin, *mapped;
    CHECK(cudaMallocHost(&pin, 16 << 20));
    CHECK(cudaHostAlloc(&mapped, 1 << 20, cudaHostAllocMapped));
    void *reg = aligned_alloc(4096, 1 << 20);
    EXPECT(reg, "aligned_alloc");
    CHECK(cudaHostRegister(reg, 1 << 20, cudaHostRegisterDefault));
    cudaStream_t s[3];
    cudaEvent_t e[3];
    for (int i = 0; i < 3; i++) {
        CHECK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
        CHECK(cudaEventCreate(&e[i]));
    }
    for (int i = 0; i < 4; i++) {
        fill<<<256, 256, 0, s[i % 3]>>>(d[i], n, i * 0x1111);
        CHECK_LAUNCH();
        CHECK(cudaEventRecord(e[i % 3], s[i % 3]));
    }
    CHECK(cudaMemcpyAsync(pin, d[3], 16 << 20, cudaMemcpyDeviceToHost, s[0]));
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < (4 << 20); i++) EXPECT(pin[i] == (3 * 0x1111 ^ i), "element %d", i);
    printf("allocated 4 x 64 MiB device, 16 MiB pinned, 1 MiB mapped, 1 MiB registered, 3 streams, 3 events\n");
    printf("results: ok\n");

    // leave work in flight and leave without freeing or synchronising
    sleep_then_write<<<1, 1, 0, s[1]>>>(d[0], 1, 100 * 1000 * 1000ull);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pin, d[1], 16 << 20, cudaMemcpyDeviceToHost, s[2]));
    printf("exiting with a kernel and a copy queued, nothing freed\n");
    pass();
}
