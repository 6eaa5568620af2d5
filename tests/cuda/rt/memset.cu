// cudaMemset / cudaMemsetAsync at odd sizes and offsets, cudaMemset2D(Async);
// bytes around each range must stay untouched.
#include "rt_common.h"

static void expect_bytes(const unsigned char *h, size_t from, size_t to, unsigned char v, const char *what) {
    for (size_t i = from; i < to; i++)
        EXPECT(h[i] == v, "%s: byte %zu is 0x%02x, want 0x%02x", what, i, h[i], v);
}

int main() {
    const size_t n = (1 << 20) + 3;
    unsigned char *d, *h = (unsigned char *)malloc(n);
    EXPECT(h, "malloc");
    CHECK(cudaMalloc(&d, n));
    CHECK(cudaMemset(d, 0xAB, n));
    CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    expect_bytes(h, 0, n, 0xAB, "cudaMemset whole");
    printf("cudaMemset %zu bytes: ok\n", n);

    CHECK(cudaMemset(d + 7, 0x00, 1));
    CHECK(cudaMemset(d + 1001, 0x11, 65536 + 5));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemsetAsync(d + 300000, 0x22, 123457, s));
    CHECK(cudaMemsetAsync(d + n - 3, 0x33, 3, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    expect_bytes(h, 0, 7, 0xAB, "before 7");
    expect_bytes(h, 7, 8, 0x00, "byte 7");
    expect_bytes(h, 8, 1001, 0xAB, "8..1001");
    expect_bytes(h, 1001, 1001 + 65541, 0x11, "1001 range");
    expect_bytes(h, 1001 + 65541, 300000, 0xAB, "gap");
    expect_bytes(h, 300000, 300000 + 123457, 0x22, "async range");
    expect_bytes(h, 300000 + 123457, n - 3, 0xAB, "after async range");
    expect_bytes(h, n - 3, n, 0x33, "last 3");
    printf("offset memsets: ok, checksum %08x\n", fnv1a(h, n));

    // 2D: a 300 x 77 byte box inside a pitched 1000 x 100 allocation
    size_t pitch = 0;
    unsigned char *d2;
    CHECK(cudaMallocPitch(&d2, &pitch, 1000, 100));
    EXPECT(pitch >= 1000, "pitch %zu < width", pitch);
    CHECK(cudaMemset2D(d2, pitch, 0x44, 1000, 100));
    CHECK(cudaMemset2DAsync(d2 + 5 * pitch + 13, pitch, 0x55, 300, 77, s));
    CHECK(cudaStreamSynchronize(s));
    unsigned char *h2 = (unsigned char *)malloc(1000 * 100);
    EXPECT(h2, "malloc");
    CHECK(cudaMemcpy2D(h2, 1000, d2, pitch, 1000, 100, cudaMemcpyDeviceToHost));
    for (int y = 0; y < 100; y++)
        for (int x = 0; x < 1000; x++) {
            bool in = y >= 5 && y < 82 && x >= 13 && x < 313;
            EXPECT(h2[y * 1000 + x] == (in ? 0x55 : 0x44), "2D (%d,%d) = 0x%02x", x, y, h2[y * 1000 + x]);
        }
    printf("cudaMemset2D box: ok, checksum %08x\n", fnv1a(h2, 1000 * 100));

    // cudaMemset on int data: the value is a byte
    int *di, hi[4];
    CHECK(cudaMalloc(&di, sizeof hi));
    CHECK(cudaMemset(di, 0x1ff, sizeof hi));
    CHECK(cudaMemcpy(hi, di, sizeof hi, cudaMemcpyDeviceToHost));
    printf("cudaMemset(0x1ff) on ints: %08x %08x %08x %08x\n", hi[0], hi[1], hi[2], hi[3]);

    CHECK(cudaFree(d));
    CHECK(cudaFree(d2));
    CHECK(cudaFree(di));
    CHECK(cudaStreamDestroy(s));
    free(h);
    free(h2);
    pass();
}
