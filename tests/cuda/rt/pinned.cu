// Pinned host memory: cudaMallocHost, cudaHostAlloc with default, portable and
// write-combined flags, cudaHostGetFlags, round trips through each, cudaFreeHost.
#include "rt_common.h"

static void roundtrip(const char *what, unsigned char *h, unsigned char *back, unsigned char *d, size_t n, cudaStream_t s) {
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)mix32(i, (uint32_t)n);
    uint32_t want = fnv1a(h, n);
    CHECK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s));
    CHECK(cudaStreamSynchronize(s));
    memset(h, 0, n);
    CHECK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    memcpy(back, h, n);
    EXPECT(fnv1a(back, n) == want, "%s: round trip mismatch", what);
    unsigned flags = 0;
    CHECK(cudaHostGetFlags(&flags, h));
    printf("%s: round trip ok, cudaHostGetFlags %u\n", what, flags);
}

int main() {
    const size_t n = (16 << 20) + 1;
    unsigned char *d, *back = (unsigned char *)malloc(n);
    EXPECT(back, "malloc");
    CHECK(cudaMalloc(&d, n));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));

    unsigned char *a, *b, *c, *w;
    CHECK(cudaMallocHost(&a, n));
    CHECK(cudaHostAlloc(&b, n, cudaHostAllocDefault));
    CHECK(cudaHostAlloc(&c, n, cudaHostAllocPortable));
    CHECK(cudaHostAlloc(&w, n, cudaHostAllocWriteCombined));
    roundtrip("cudaMallocHost", a, back, d, n, s);
    roundtrip("cudaHostAlloc default", b, back, d, n, s);
    roundtrip("cudaHostAlloc portable", c, back, d, n, s);
    roundtrip("cudaHostAlloc write-combined", w, back, d, n, s);

    // many small pinned allocations, all alive at once
    unsigned char *many[64];
    for (int i = 0; i < 64; i++) {
        CHECK(cudaMallocHost(&many[i], 4096 + i));
        memset(many[i], i, 4096 + i);
    }
    for (int i = 0; i < 64; i++) CHECK(cudaMemcpy(d + i * 8192, many[i], 4096 + i, cudaMemcpyHostToDevice));
    for (int i = 0; i < 64; i++) {
        CHECK(cudaMemcpy(back, d + i * 8192, 4096 + i, cudaMemcpyDeviceToHost));
        for (int j = 0; j < 4096 + i; j++) EXPECT(back[j] == (unsigned char)i, "small pinned %d byte %d", i, j);
        CHECK(cudaFreeHost(many[i]));
    }
    printf("64 small pinned allocations: ok\n");

    CHECK(cudaFreeHost(a));
    CHECK(cudaFreeHost(b));
    CHECK(cudaFreeHost(c));
    CHECK(cudaFreeHost(w));
    CHECK(cudaFreeHost(NULL));
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
    free(back);
    pass();
}
