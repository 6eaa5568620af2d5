// Pipelined async copies: 64 MiB of pinned memory in 16 chunks over 4
// non-blocking streams, H2D -> kernel -> D2H per chunk; then the same from
// pageable memory; then D2D async copies ordered after a kernel.
#include "rt_common.h"

__global__ void transform(uint32_t *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = p[i] * 3u + 1u;
}

static void pipeline(uint32_t *src, uint32_t *dst, uint32_t *d, size_t n, cudaStream_t *ss, int nstreams, int chunks) {
    size_t per = n / chunks;
    for (int c = 0; c < chunks; c++) {
        cudaStream_t s = ss[c % nstreams];
        size_t off = (size_t)c * per, cnt = c == chunks - 1 ? n - off : per;
        CHECK(cudaMemcpyAsync(d + off, src + off, cnt * 4, cudaMemcpyHostToDevice, s));
        transform<<<128, 256, 0, s>>>(d + off, cnt);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(dst + off, d + off, cnt * 4, cudaMemcpyDeviceToHost, s));
    }
    for (int i = 0; i < nstreams; i++) CHECK(cudaStreamSynchronize(ss[i]));
}

static void verify(const uint32_t *dst, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        uint32_t want = mix32(i, 11) * 3u + 1u;
        EXPECT(dst[i] == want, "%s: element %zu = %08x, want %08x", what, i, dst[i], want);
    }
    printf("%s: ok, checksum %08x\n", what, fnv1a(dst, n * 4));
}

int main() {
    const size_t n = (64u << 20) / 4 + 5;
    const int NS = 4;
    cudaStream_t ss[NS];
    for (int i = 0; i < NS; i++) CHECK(cudaStreamCreateWithFlags(&ss[i], cudaStreamNonBlocking));
    uint32_t *src, *dst, *d;
    CHECK(cudaMallocHost(&src, n * 4));
    CHECK(cudaMallocHost(&dst, n * 4));
    CHECK(cudaMalloc(&d, n * 4));
    for (size_t i = 0; i < n; i++) src[i] = mix32(i, 11);
    memset(dst, 0, n * 4);
    pipeline(src, dst, d, n, ss, NS, 16);
    verify(dst, n, "pinned pipeline, 16 chunks on 4 streams");

    uint32_t *psrc = (uint32_t *)malloc(n * 4), *pdst = (uint32_t *)calloc(n, 4);
    EXPECT(psrc && pdst, "malloc");
    memcpy(psrc, src, n * 4);
    CHECK(cudaMemset(d, 0, n * 4));
    pipeline(psrc, pdst, d, n, ss, NS, 7);
    verify(pdst, n, "pageable pipeline, 7 chunks on 4 streams");

    // D2D async after a kernel on the same stream, then D2H on another stream after an event
    uint32_t *d2;
    CHECK(cudaMalloc(&d2, n * 4));
    CHECK(cudaMemcpyAsync(d, src, n * 4, cudaMemcpyHostToDevice, ss[0]));
    transform<<<256, 256, 0, ss[0]>>>(d, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(d2, d, n * 4, cudaMemcpyDeviceToDevice, ss[0]));
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CHECK(cudaEventRecord(ev, ss[0]));
    CHECK(cudaStreamWaitEvent(ss[1], ev, 0));
    memset(dst, 0, n * 4);
    CHECK(cudaMemcpyAsync(dst, d2, n * 4, cudaMemcpyDeviceToHost, ss[1]));
    CHECK(cudaStreamSynchronize(ss[1]));
    verify(dst, n, "H2D, kernel, D2D on one stream, D2H on another after an event");

    CHECK(cudaEventDestroy(ev));
    for (int i = 0; i < NS; i++) CHECK(cudaStreamDestroy(ss[i]));
    CHECK(cudaFree(d));
    CHECK(cudaFree(d2));
    CHECK(cudaFreeHost(src));
    CHECK(cudaFreeHost(dst));
    free(psrc);
    free(pdst);
    pass();
}
