// Several host threads of one process using the GPU at once (std::thread):
// each has its own non-blocking stream, pinned buffers and device memory and
// runs copy -> kernel -> copy rounds; all write slices of one shared buffer;
// allocations and frees race between threads.
#include "rt_common.h"
#include <string>
#include <thread>
#include <vector>

#define TCHECK(call)                                                                        \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) return std::string(#call) + " returned " + cudaGetErrorName(e_); \
    } while (0)

__global__ void add_k(int *p, int n, int k) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] += k;
}

static const int NT = 8, N = 1 << 16, ROUNDS = 40;

static std::string worker(int t, int *shared) {
    TCHECK(cudaSetDevice(0));
    cudaStream_t s;
    TCHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *h, *d;
    TCHECK(cudaMallocHost(&h, N * sizeof(int)));
    TCHECK(cudaMalloc(&d, N * sizeof(int)));
    for (int i = 0; i < N; i++) h[i] = t * 100000 + i;
    for (int r = 0; r < ROUNDS; r++) {
        TCHECK(cudaMemcpyAsync(d, h, N * sizeof(int), cudaMemcpyHostToDevice, s));
        add_k<<<32, 256, 0, s>>>(d, N, t + 1);
        TCHECK(cudaGetLastError());
        TCHECK(cudaMemcpyAsync(h, d, N * sizeof(int), cudaMemcpyDeviceToHost, s));
        TCHECK(cudaStreamSynchronize(s));
        void *tmp;  // churn the allocator from every thread
        TCHECK(cudaMalloc(&tmp, (size_t)(r + 1) * 4096));
        TCHECK(cudaFree(tmp));
    }
    for (int i = 0; i < N; i++)
        if (h[i] != t * 100000 + i + ROUNDS * (t + 1)) return "thread " + std::to_string(t) + " element " + std::to_string(i);
    TCHECK(cudaMemcpyAsync(shared + t * N, d, N * sizeof(int), cudaMemcpyDeviceToDevice, s));
    TCHECK(cudaStreamSynchronize(s));
    TCHECK(cudaFreeHost(h));
    TCHECK(cudaFree(d));
    TCHECK(cudaStreamDestroy(s));
    return "";
}

int main() {
    int *shared;
    CHECK(cudaMalloc(&shared, (size_t)NT * N * sizeof(int)));
    std::vector<std::string> errs(NT);
    std::vector<std::thread> ts;
    for (int t = 0; t < NT; t++) ts.emplace_back([t, shared, &errs] { errs[t] = worker(t, shared); });
    for (auto &th : ts) th.join();
    for (int t = 0; t < NT; t++) EXPECT(errs[t].empty(), "thread %d: %s", t, errs[t].c_str());
    printf("%d threads x %d rounds: ok\n", NT, ROUNDS);

    int *h = (int *)malloc((size_t)NT * N * sizeof(int));
    EXPECT(h, "malloc");
    CHECK(cudaMemcpy(h, shared, (size_t)NT * N * sizeof(int), cudaMemcpyDeviceToHost));
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < N; i++)
            EXPECT(h[t * N + i] == t * 100000 + i + ROUNDS * (t + 1), "shared slice %d element %d", t, i);
    printf("shared buffer slices: ok, checksum %08x\n", fnv1a(h, (size_t)NT * N * sizeof(int)));

    // a buffer made in one thread, filled in a second, read in a third
    int *x = NULL;
    std::thread([&] { CHECK(cudaMalloc(&x, 4096)); }).join();
    std::thread([&] { CHECK(cudaMemset(x, 0x3c, 4096)); CHECK(cudaDeviceSynchronize()); }).join();
    unsigned char b[4096];
    std::thread([&] { CHECK(cudaMemcpy(b, x, 4096, cudaMemcpyDeviceToHost)); CHECK(cudaFree(x)); }).join();
    EXPECT(b[0] == 0x3c && b[4095] == 0x3c, "cross-thread buffer");
    printf("buffer passed between threads: ok\n");
    CHECK(cudaFree(shared));
    free(h);
    pass();
}
