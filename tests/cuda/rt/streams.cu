// Streams: create (blocking / non-blocking), flags, query busy vs idle,
// cross-stream cudaStreamWaitEvent, many streams at once, destroy with work pending.
#include "rt_common.h"

__global__ void fill(int *p, int n, int v) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v + i;
}

int main() {
    cudaStream_t a, b;
    CHECK(cudaStreamCreate(&a));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    unsigned fa = 99, fb = 99;
    CHECK(cudaStreamGetFlags(a, &fa));
    CHECK(cudaStreamGetFlags(b, &fb));
    printf("flags: blocking %u, non-blocking %u\n", fa, fb);

    int *v;
    CHECK(cudaMalloc(&v, 4 * sizeof(int)));
    CHECK(cudaMemset(v, 0, 4 * sizeof(int)));
    printf("query idle: %s\n", cudaGetErrorName(cudaStreamQuery(a)));
    sleep_then_write<<<1, 1, 0, a>>>(v, 1, 300 * 1000 * 1000ull);
    CHECK_LAUNCH();
    cudaError_t q = cudaStreamQuery(a);
    printf("query busy: %s\n", cudaGetErrorName(q));
    EXPECT(q == cudaErrorNotReady, "query of a busy stream gave %s", cudaGetErrorName(q));
    (void)cudaGetLastError();

    // b waits for a through an event: the copy must see the value a writes late
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CHECK(cudaEventRecord(ev, a));
    CHECK(cudaStreamWaitEvent(b, ev, 0));
    copy_int<<<1, 1, 0, b>>>(v + 1, v);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(b));
    printf("query after sync: %s\n", cudaGetErrorName(cudaStreamQuery(a)));
    int h[4];
    CHECK(cudaMemcpy(h, v, sizeof h, cudaMemcpyDeviceToHost));
    printf("b saw a's late write through the event: %s\n", yes_no(h[1] == 1));
    EXPECT(h[1] == 1, "cudaStreamWaitEvent did not order: got %d", h[1]);

    // 16 streams, each fills its own slice
    const int NS = 16, N = 1 << 16;
    cudaStream_t ss[NS];
    int *big;
    CHECK(cudaMalloc(&big, (size_t)NS * N * sizeof(int)));
    for (int i = 0; i < NS; i++) {
        CHECK(cudaStreamCreateWithFlags(&ss[i], i % 2 ? cudaStreamNonBlocking : cudaStreamDefault));
        fill<<<64, 256, 0, ss[i]>>>(big + (size_t)i * N, N, i * 1000000);
        CHECK_LAUNCH();
    }
    for (int i = 0; i < NS; i++) CHECK(cudaStreamSynchronize(ss[i]));
    int *hb = (int *)malloc((size_t)NS * N * sizeof(int));
    EXPECT(hb, "malloc");
    CHECK(cudaMemcpy(hb, big, (size_t)NS * N * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < NS; i++)
        for (int j = 0; j < N; j++)
            EXPECT(hb[(size_t)i * N + j] == i * 1000000 + j, "stream %d element %d", i, j);
    printf("%d streams filled their slices: ok\n", NS);
    for (int i = 0; i < NS; i++) CHECK(cudaStreamDestroy(ss[i]));

    // destroying a stream with work queued: the work still completes
    cudaStream_t c;
    CHECK(cudaStreamCreate(&c));
    sleep_then_write<<<1, 1, 0, c>>>(v + 2, 42, 50 * 1000 * 1000ull);
    CHECK_LAUNCH();
    CHECK(cudaStreamDestroy(c));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h, v, sizeof h, cudaMemcpyDeviceToHost));
    printf("work of a destroyed stream completed: %s\n", yes_no(h[2] == 42));
    EXPECT(h[2] == 42, "got %d", h[2]);

    CHECK(cudaEventDestroy(ev));
    CHECK(cudaStreamDestroy(a));
    CHECK(cudaStreamDestroy(b));
    CHECK(cudaFree(v));
    CHECK(cudaFree(big));
    free(hb);
    pass();
}
