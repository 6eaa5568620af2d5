// Host functions in stream order without blocking the caller: cudaLaunchHostFunc
// returns while the kernel before it still runs; a kernel queued after the host function
// sees what the function wrote to mapped host memory; callbacks of one stream run in
// order; cudaStreamSynchronize waits for them.
#include "rt_common.h"
#include <chrono>
#include <thread>
#include <vector>

struct Order {
    std::vector<int> seen;
};

static void CUDART_CB set_flag(void *p) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    *(volatile int *)p = 42;
}

static void CUDART_CB note(void *p) {
    auto *o = (std::pair<Order *, int> *)p;
    o->first->seen.push_back(o->second);
}

__global__ void read_flag(const volatile int *flag, int *out) { *out = *flag; }

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *h, *dh, *out;
    CHECK(cudaHostAlloc(&h, sizeof(int), cudaHostAllocMapped));
    *h = 0;
    CHECK(cudaHostGetDevicePointer((void **)&dh, h, 0));
    CHECK(cudaMalloc(&out, sizeof(int)));
    int *dummy;
    CHECK(cudaMalloc(&dummy, sizeof(int)));

    sleep_then_write<<<1, 1, 0, s>>>(dummy, 1, 300ull * 1000 * 1000);
    CHECK_LAUNCH();
    auto t0 = std::chrono::steady_clock::now();
    CHECK(cudaLaunchHostFunc(s, set_flag, h));
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    printf("cudaLaunchHostFunc returned before the stream got there: %s\n", yes_no(ms < 150.0));
    EXPECT(ms < 150.0, "it took %.1f ms", ms);
    read_flag<<<1, 1, 0, s>>>(dh, out);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));
    int got = 0;
    CHECK(cudaMemcpy(&got, out, sizeof(int), cudaMemcpyDeviceToHost));
    printf("kernel after the host function read: %d\n", got);
    EXPECT(got == 42, "the kernel ran before the host function returned (%d)", got);

    Order o;
    std::pair<Order *, int> args[8];
    for (int i = 0; i < 8; i++) {
        args[i] = {&o, i};
        CHECK(cudaLaunchHostFunc(s, note, &args[i]));
    }
    CHECK(cudaStreamSynchronize(s));
    printf("callbacks ran:");
    for (int v : o.seen) printf(" %d", v);
    printf("\n");
    EXPECT(o.seen.size() == 8, "%zu of 8 ran by the synchronize", o.seen.size());
    puts("PASS");
    return 0;
}
