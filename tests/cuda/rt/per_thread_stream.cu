// Built with `nvcc --default-stream per-thread`: the default stream of each
// host thread is its own. Thread A's kernel on its default stream spins until
// thread B's kernel on B's default stream sets a flag: with a shared (legacy)
// default stream B's kernel would queue behind A's and A would time out.
#include "rt_common.h"
#include <atomic>
#include <thread>

#ifndef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "build with nvcc --default-stream per-thread"
#endif

__global__ void set_flag(int *flag) {
    *(volatile int *)flag = 1;
    __threadfence();
}

int main() {
    printf("built for per-thread default streams: yes\n");
    int *flag, *seen;
    CHECK(cudaMalloc(&flag, sizeof(int)));
    CHECK(cudaMalloc(&seen, sizeof(int)));
    CHECK(cudaMemset(flag, 0, sizeof(int)));
    // Load both kernels now. With lazy loading (CUDA's default) a kernel is loaded
    // at its first launch, which may synchronise the context: B's first launch
    // would then wait for A's spinning kernel (seen natively on an H200).
    set_flag<<<1, 1>>>(seen);
    CHECK_LAUNCH();
    wait_flag<<<1, 1>>>(seen, 1, seen, 0);
    CHECK_LAUNCH();
    CHECK(cudaMemset(seen, 0, sizeof(int)));
    CHECK(cudaDeviceSynchronize());

    std::atomic<int> launched{0};
    cudaError_t ea = cudaSuccess, eb = cudaSuccess;
    std::thread a([&] {
        wait_flag<<<1, 1>>>(flag, 1, seen, 5ull * 1000 * 1000 * 1000);  // default stream = A's own
        ea = cudaGetLastError();
        launched = 1;
        if (ea == cudaSuccess) ea = cudaStreamSynchronize(0);
    });
    std::thread b([&] {
        while (launched.load() == 0) host_sleep_us(100);
        host_sleep_us(20000);
        set_flag<<<1, 1>>>(flag);  // default stream = B's own
        eb = cudaGetLastError();
        if (eb == cudaSuccess) eb = cudaStreamSynchronize(cudaStreamPerThread);
    });
    a.join();
    b.join();
    EXPECT(ea == cudaSuccess && eb == cudaSuccess, "thread errors: %s, %s", cudaGetErrorName(ea), cudaGetErrorName(eb));
    int h = -1;
    CHECK(cudaMemcpy(&h, seen, sizeof h, cudaMemcpyDeviceToHost));
    printf("two threads' default streams ran concurrently: %s\n", yes_no(h == 1));
    EXPECT(h == 1, "thread A's kernel never saw thread B's flag");

    // the per-thread stream handle and stream 0 are the same stream here: ordered
    int *v;
    CHECK(cudaMalloc(&v, 2 * sizeof(int)));
    CHECK(cudaMemset(v, 0, 2 * sizeof(int)));
    sleep_then_write<<<1, 1, 0, cudaStreamPerThread>>>(v, 9, 50 * 1000 * 1000ull);
    CHECK_LAUNCH();
    copy_int<<<1, 1, 0, 0>>>(v + 1, v);
    CHECK_LAUNCH();
    int hv[2];
    CHECK(cudaMemcpyAsync(hv, v, sizeof hv, cudaMemcpyDeviceToHost, 0));
    CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    printf("stream 0 ordered after cudaStreamPerThread: %s\n", yes_no(hv[1] == 9));
    EXPECT(hv[0] == 9 && hv[1] == 9, "got %d %d", hv[0], hv[1]);

    // the explicit legacy stream still orders with the per-thread stream
    CHECK(cudaMemset(v, 0, 2 * sizeof(int)));
    sleep_then_write<<<1, 1, 0, cudaStreamPerThread>>>(v, 5, 50 * 1000 * 1000ull);
    CHECK_LAUNCH();
    copy_int<<<1, 1, 0, cudaStreamLegacy>>>(v + 1, v);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    CHECK(cudaMemcpy(hv, v, sizeof hv, cudaMemcpyDeviceToHost));
    printf("cudaStreamLegacy waited for the per-thread stream: %s\n", yes_no(hv[1] == 5));
    EXPECT(hv[1] == 5, "legacy stream did not wait: %d", hv[1]);
    CHECK(cudaFree(flag));
    CHECK(cudaFree(seen));
    CHECK(cudaFree(v));
    pass();
}
