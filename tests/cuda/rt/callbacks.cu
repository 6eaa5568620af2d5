// Host callbacks in stream order: cudaLaunchHostFunc and cudaStreamAddCallback
// interleaved with kernels and copies; each callback sees the copies before it;
// work after a host function waits for it; a second stream's callback ordered
// after the first stream's through an event.
#include "rt_common.h"
#include <atomic>

static char order[64];
static std::atomic<int> norder{0};
static volatile int *pinned_val;  // written by copies, read by callbacks
static int seen_a = -1, seen_b = -1;
static cudaError_t status_b = cudaErrorUnknown;
static std::atomic<int> d_after_a{-1};

static void note(char c) { order[norder.fetch_add(1)] = c; }

static void CUDART_CB fn_a(void *) { seen_a = *pinned_val; note('A'); }
static void CUDART_CB cb_b(cudaStream_t, cudaError_t st, void *) { seen_b = *pinned_val; status_b = st; note('B'); }
static void CUDART_CB fn_c(void *) { note('C'); }
static void CUDART_CB fn_d(void *) { d_after_a = memchr(order, 'A', sizeof order) != NULL ? 1 : 0; }
static void CUDART_CB fn_slow_set(void *p) {
    host_sleep_us(50000);
    *(volatile int *)p = 1234;
}

__global__ void set_val(int *d, int v, uint64_t ns) {
    dev_sleep_ns(ns);
    *d = v;
}

int main() {
    cudaStream_t s, s2;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    int *d;
    CHECK(cudaMalloc(&d, 2 * sizeof(int)));
    int *pin;
    CHECK(cudaMallocHost(&pin, 2 * sizeof(int)));
    pin[0] = pin[1] = 0;
    pinned_val = pin;

    set_val<<<1, 1, 0, s>>>(d, 1, 30 * 1000 * 1000ull);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pin, d, sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaLaunchHostFunc(s, fn_a, NULL));
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CHECK(cudaEventRecord(ev, s));
    CHECK(cudaStreamWaitEvent(s2, ev, 0));
    CHECK(cudaLaunchHostFunc(s2, fn_d, NULL));
    set_val<<<1, 1, 0, s>>>(d, 2, 10 * 1000 * 1000ull);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pin, d, sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamAddCallback(s, cb_b, NULL, 0));
    CHECK(cudaLaunchHostFunc(s, fn_c, NULL));

    // a slow host function writes pinned memory; the copy queued after it must see the write
    CHECK(cudaLaunchHostFunc(s, fn_slow_set, pin + 1));
    CHECK(cudaMemcpyAsync(d + 1, pin + 1, sizeof(int), cudaMemcpyHostToDevice, s));
    int back = 0;
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamSynchronize(s2));
    CHECK(cudaMemcpy(&back, d + 1, sizeof(int), cudaMemcpyDeviceToHost));

    order[norder.load()] = '\0';
    printf("callback order on the stream: %s\n", order);
    printf("A saw the copy before it: %d\n", seen_a);
    printf("B saw the copy before it: %d, status %s\n", seen_b, cudaGetErrorName(status_b));
    printf("second stream's host function ran after A: %s\n", yes_no(d_after_a.load() == 1));
    printf("copy after the slow host function saw its write: %d\n", back);
    EXPECT(strcmp(order, "ABC") == 0, "order %s", order);
    EXPECT(seen_a == 1 && seen_b == 2 && status_b == cudaSuccess, "callbacks saw %d %d", seen_a, seen_b);
    EXPECT(d_after_a.load() == 1, "event-ordered host function ran before A");
    EXPECT(back == 1234, "copy after host function got %d", back);

    // 200 host functions in a row keep their order
    norder = 0;
    static int idx[200];
    static int ran[200];
    static std::atomic<int> k{0};
    for (int i = 0; i < 200; i++) {
        idx[i] = i;
        CHECK(cudaLaunchHostFunc(s2, [](void *p) { ran[k.fetch_add(1)] = *(int *)p; }, &idx[i]));
    }
    CHECK(cudaStreamSynchronize(s2));
    bool inorder = k.load() == 200;
    for (int i = 0; i < 200 && inorder; i++) inorder = ran[i] == i;
    printf("200 host functions ran in order: %s\n", yes_no(inorder));
    EXPECT(inorder, "host functions out of order");

    CHECK(cudaEventDestroy(ev));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaFree(d));
    CHECK(cudaFreeHost(pin));
    pass();
}
