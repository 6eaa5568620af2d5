// Stream priorities: cudaDeviceGetStreamPriorityRange, cudaStreamCreateWithPriority
// (in range, out of range: clamped), cudaStreamGetPriority / GetFlags, and work
// on every priority completing.
#include "rt_common.h"

__global__ void scale(int *p, int n, int k) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = p[i] * k + 1;
}

int main() {
    int least = 99, greatest = 99;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    printf("priority range: least %d, greatest %d\n", least, greatest);
    EXPECT(greatest <= least, "greatest %d > least %d", greatest, least);

    const int asked[] = {least, greatest, (least + greatest) / 2, greatest - 10, least + 10};
    const char *what[] = {"least", "greatest", "middle", "above greatest", "below least"};
    const int NS = 5, N = 1 << 18;
    cudaStream_t s[NS];
    int *d[NS];
    for (int i = 0; i < NS; i++) {
        unsigned flags = i % 2 ? cudaStreamNonBlocking : cudaStreamDefault;
        CHECK(cudaStreamCreateWithPriority(&s[i], flags, asked[i]));
        int got = 99;
        unsigned gflags = 99;
        CHECK(cudaStreamGetPriority(s[i], &got));
        CHECK(cudaStreamGetFlags(s[i], &gflags));
        printf("%s (asked %d): priority %d, flags %u\n", what[i], asked[i], got, gflags);
        int clamped = asked[i] < greatest ? greatest : asked[i] > least ? least : asked[i];
        EXPECT(got == clamped, "%s: priority %d, want %d", what[i], got, clamped);
        CHECK(cudaMalloc(&d[i], N * sizeof(int)));
        CHECK(cudaMemsetAsync(d[i], 0, N * sizeof(int), s[i]));
    }
    cudaStream_t plain;
    CHECK(cudaStreamCreate(&plain));
    int pp = 99;
    CHECK(cudaStreamGetPriority(plain, &pp));
    printf("cudaStreamCreate priority: %d\n", pp);
    cudaError_t e = cudaStreamGetPriority(0, &pp);
    if (e == cudaSuccess) printf("legacy default stream priority: %d\n", pp);
    else report_err("cudaStreamGetPriority(legacy default stream)", e);

    for (int r = 0; r < 10; r++)
        for (int i = 0; i < NS; i++) {
            scale<<<64, 256, 0, s[i]>>>(d[i], N, i + 2);
            CHECK_LAUNCH();
        }
    int *h = (int *)malloc(N * sizeof(int));
    EXPECT(h, "malloc");
    for (int i = 0; i < NS; i++) {
        CHECK(cudaStreamSynchronize(s[i]));
        CHECK(cudaMemcpy(h, d[i], N * sizeof(int), cudaMemcpyDeviceToHost));
        int want = 0;
        for (int r = 0; r < 10; r++) want = want * (i + 2) + 1;
        for (int j = 0; j < N; j++) EXPECT(h[j] == want, "stream %d element %d = %d, want %d", i, j, h[j], want);
        printf("%s: work done, value %d\n", what[i], want);
        CHECK(cudaStreamDestroy(s[i]));
        CHECK(cudaFree(d[i]));
    }
    CHECK(cudaStreamDestroy(plain));
    free(h);
    pass();
}
