// Zero-copy: cudaSetDeviceFlags(cudaDeviceMapHost), cudaHostAlloc(Mapped),
// cudaHostGetDevicePointer; kernels write and read host memory directly; a
// kernel and the host hand a flag back and forth while the kernel runs.
#include "rt_common.h"

__global__ void write_host(int *h, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) h[i] = i * 7 + 1;
}

__global__ void host_to_dev(const int *h, int *d, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) d[i] = h[i] * 2;
}

// mailbox[0]: kernel -> host "ready"; mailbox[1]: host -> kernel "ack"; mailbox[2]: result
__global__ void handshake(volatile int *mailbox, uint64_t timeout_ns) {
    mailbox[0] = 1;
    __threadfence_system();
    uint64_t t0 = gtimer_ns();
    int got = 0;
    while (gtimer_ns() - t0 < timeout_ns) {
        if (mailbox[1] == 1) { got = 1; break; }
        __nanosleep(500);
    }
    mailbox[2] = got ? 77 : -1;
    __threadfence_system();
}

int main() {
    CHECK(cudaSetDeviceFlags(cudaDeviceMapHost));
    unsigned flags = 0;
    CHECK(cudaGetDeviceFlags(&flags));
    printf("device flags include cudaDeviceMapHost: %s\n", yes_no(flags & cudaDeviceMapHost));
    const int n = 1 << 20;
    int *h, *hd = NULL;
    CHECK(cudaHostAlloc(&h, n * sizeof(int), cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer(&hd, h, 0));
    unsigned hf = 0;
    CHECK(cudaHostGetFlags(&hf, h));
    printf("host flags include mapped: %s\n", yes_no(hf & cudaHostAllocMapped));
    memset(h, 0, n * sizeof(int));

    write_host<<<256, 256>>>(hd, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; i++) EXPECT(h[i] == i * 7 + 1, "kernel write to host memory: h[%d] = %d", i, h[i]);
    printf("kernel wrote host memory through the device pointer: ok\n");

    memset(h, 0, n * sizeof(int));
    write_host<<<256, 256>>>(h, n);  // unified addressing: the host pointer works too
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; i++) EXPECT(h[i] == i * 7 + 1, "kernel write through host pointer: h[%d] = %d", i, h[i]);
    printf("kernel wrote host memory through the host pointer: ok\n");

    for (int i = 0; i < n; i++) h[i] = i ^ 0x5555;
    int *d, *back = (int *)malloc(n * sizeof(int));
    EXPECT(back, "malloc");
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    host_to_dev<<<256, 256>>>(hd, d, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(back, d, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) EXPECT(back[i] == (i ^ 0x5555) * 2, "kernel read host memory: %d", i);
    printf("kernel read host memory: ok\n");

    // live handshake: needs the host and the running kernel to share the pages
    volatile int *mb;
    CHECK(cudaHostAlloc((void **)&mb, 4096, cudaHostAllocMapped));
    mb[0] = mb[1] = mb[2] = 0;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    handshake<<<1, 1, 0, s>>>(mb, 10ull * 1000 * 1000 * 1000);
    CHECK_LAUNCH();
    uint64_t t0 = host_now_ns();
    while (mb[0] != 1 && host_now_ns() - t0 < 10ull * 1000 * 1000 * 1000) host_sleep_us(50);
    bool ready = mb[0] == 1;
    __sync_synchronize();
    mb[1] = 1;
    __sync_synchronize();
    CHECK(cudaStreamSynchronize(s));
    printf("host saw the running kernel's flag: %s\n", yes_no(ready));
    printf("kernel saw the host's ack: %s\n", yes_no(mb[2] == 77));
    EXPECT(ready && mb[2] == 77, "handshake failed (ready %d, result %d)", (int)ready, mb[2]);

    CHECK(cudaFreeHost(h));
    CHECK(cudaFreeHost((void *)mb));
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
    free(back);
    pass();
}
