// memcpy_roundtrip: no kernels. cuMemsetD8/D16/D32 (+Async) and cuMemcpyHtoD/
// DtoH/DtoD (+Async, on a created stream) round trips for 1 B, 7 B, 4 KiB,
// 1 MiB+3, 64 MiB and 256 MiB with patterned data, every byte checked; then
// cuMemAllocPitch, cuMemGetInfo and memsets at offsets inside an allocation.
//
// usage: memcpy_roundtrip [--max-bytes N]   (skip sizes above N; for quick runs)
#include "common.h"

static void fill_pattern(std::vector<unsigned char> &v, size_t n, uint32_t seed) {
    v.resize(n);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32_t w = mix32(i / 4, seed);
        memcpy(&v[i], &w, 4);
    }
    uint32_t w = mix32(i / 4, seed);
    for (; i < n; i++) v[i] = (unsigned char)(w >> (8 * (i & 3)));
}

static void compare(const char *what, size_t size, const unsigned char *got,
                    const unsigned char *want, size_t n) {
    if (memcmp(got, want, n) == 0) return;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail("size %zu %s: byte %zu is 0x%02x, expected 0x%02x", size, what, i, got[i],
                 want[i]);
}

// Expected bytes after D8 fill of [0,size) with f8, then D16 of the first
// size/2 elements with v16, then D32 of the first size/4 elements with v32.
static void check_memsets(const char *what, size_t size, const std::vector<unsigned char> &got,
                          uint8_t f8, uint16_t v16, uint32_t v32) {
    size_t n16 = size / 2, n32 = size / 4;
    for (size_t i = 0; i < size; i++) {
        unsigned char want;
        if (i < n32 * 4)
            want = (unsigned char)(v32 >> (8 * (i & 3)));
        else if (i < n16 * 2)
            want = (unsigned char)(v16 >> (8 * (i & 1)));
        else
            want = f8;
        if (got[i] != want)
            fail("size %zu %s: byte %zu is 0x%02x, expected 0x%02x", size, what, i, got[i], want);
    }
}

static void roundtrip(size_t size, CUstream stream) {
    std::vector<unsigned char> src, dst(size);
    CUdeviceptr d1, d2;
    CHECK(cuMemAlloc(&d1, size));
    CHECK(cuMemAlloc(&d2, size));

    // Synchronous copies.
    fill_pattern(src, size, (uint32_t)size * 3u + 1u);
    memset(dst.data(), 0, size);
    CHECK(cuMemsetD8(d2, 0, size));
    CHECK(cuMemcpyHtoD(d1, src.data(), size));
    CHECK(cuMemcpyDtoD(d2, d1, size));
    CHECK(cuMemcpyDtoH(dst.data(), d2, size));
    compare("sync HtoD/DtoD/DtoH", size, dst.data(), src.data(), size);
    // d1 must still hold the source too.
    memset(dst.data(), 0, size);
    CHECK(cuMemcpyDtoH(dst.data(), d1, size));
    compare("sync DtoH of source", size, dst.data(), src.data(), size);

    // Asynchronous copies on a created stream (pageable host memory).
    fill_pattern(src, size, (uint32_t)size * 5u + 2u);
    memset(dst.data(), 0, size);
    CHECK(cuMemsetD8Async(d2, 0x77, size, stream));
    CHECK(cuMemcpyHtoDAsync(d1, src.data(), size, stream));
    CHECK(cuMemcpyDtoDAsync(d2, d1, size, stream));
    CHECK(cuMemcpyDtoHAsync(dst.data(), d2, size, stream));
    CHECK(cuStreamSynchronize(stream));
    compare("async HtoD/DtoD/DtoH", size, dst.data(), src.data(), size);

    // Synchronous memsets.
    const uint8_t f8 = 0xA5;
    const uint16_t v16 = 0xBEEF;
    const uint32_t v32 = 0xDEADC0DEu;
    CHECK(cuMemsetD8(d1, f8, size));
    if (size / 2) CHECK(cuMemsetD16(d1, v16, size / 2));
    if (size / 4) CHECK(cuMemsetD32(d1, v32, size / 4));
    CHECK(cuMemcpyDtoH(dst.data(), d1, size));
    check_memsets("memset D8/D16/D32", size, dst, f8, v16, v32);

    // Asynchronous memsets with other values.
    CHECK(cuMemsetD8Async(d2, 0x3C, size, stream));
    if (size / 2) CHECK(cuMemsetD16Async(d2, 0x1357, size / 2, stream));
    if (size / 4) CHECK(cuMemsetD32Async(d2, 0x2468ACE0u, size / 4, stream));
    CHECK(cuMemcpyDtoHAsync(dst.data(), d2, size, stream));
    CHECK(cuStreamSynchronize(stream));
    check_memsets("memset D8/D16/D32 async", size, dst, 0x3C, 0x1357, 0x2468ACE0u);

    CHECK(cuMemFree(d1));
    CHECK(cuMemFree(d2));
    printf("size %zu: sync copies, async copies, memsets, async memsets ok\n", size);
}

static void pitch_and_offsets(CUdevice dev) {
    // cuMemAllocPitch: 1000-byte rows, 17 rows, 4-byte elements.
    CUdeviceptr dp;
    size_t pitch = 0;
    const size_t width = 1000, height = 17;
    CHECK(cuMemAllocPitch(&dp, &pitch, width, height, 4));
    printf("pitch >= width %d, pitch %% 4 == 0 %d\n", pitch >= width ? 1 : 0,
           pitch % 4 == 0 ? 1 : 0);
    EXPECT(pitch >= width && pitch % 4 == 0, "bad pitch %zu for width %zu", pitch, width);
    size_t total_pitched = pitch * height;
    CHECK(cuMemsetD8(dp, 0x00, total_pitched));
    for (size_t r = 0; r < height; r++) CHECK(cuMemsetD8(dp + r * pitch, (unsigned char)(r + 1), width));
    std::vector<unsigned char> h(total_pitched);
    CHECK(cuMemcpyDtoH(h.data(), dp, total_pitched));
    for (size_t r = 0; r < height; r++)
        for (size_t c = 0; c < pitch; c++) {
            unsigned char want = c < width ? (unsigned char)(r + 1) : 0;
            if (h[r * pitch + c] != want)
                fail("pitched row %zu col %zu is 0x%02x, expected 0x%02x", r, c, h[r * pitch + c],
                     want);
        }
    CHECK(cuMemFree(dp));
    printf("pitched allocation rows ok\n");

    // cuMemGetInfo: only free <= total is deterministic.
    size_t freeb = 0, total = 0, devtotal = 0;
    CHECK(cuMemGetInfo(&freeb, &total));
    CHECK(cuDeviceTotalMem(&devtotal, dev));
    printf("meminfo free <= total %d, total > 0 %d\n", freeb <= total ? 1 : 0, total > 0 ? 1 : 0);
    EXPECT(freeb <= total && total > 0, "cuMemGetInfo free %zu total %zu", freeb, total);

    // Memsets at offsets inside one allocation (interior pointers).
    const size_t n = 1 << 20;
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, n));
    std::vector<unsigned char> want(n, 0);
    CHECK(cuMemsetD8(d, 0, n));
    struct { size_t off, len; uint8_t v; } ops[] = {
        {1000, 333, 0x11}, {4097, 1, 0x22}, {n - 5, 5, 0x33}, {65536, 65536, 0x44}};
    for (auto &o : ops) {
        CHECK(cuMemsetD8(d + o.off, o.v, o.len));
        memset(want.data() + o.off, o.v, o.len);
    }
    // 32-bit memset at an aligned interior offset, 16-bit at an even one.
    CHECK(cuMemsetD32(d + 8192, 0x01020304u, 100));
    for (size_t i = 0; i < 400; i++) want[8192 + i] = (unsigned char)(0x01020304u >> (8 * (i & 3)));
    CHECK(cuMemsetD16(d + 20002, 0xA1B2, 50));
    for (size_t i = 0; i < 100; i++) want[20002 + i] = (unsigned char)(0xA1B2 >> (8 * (i & 1)));
    // An interior-pointer copy, too.
    unsigned char blob[100];
    for (int i = 0; i < 100; i++) blob[i] = (unsigned char)(200 - i);
    CHECK(cuMemcpyHtoD(d + 300001, blob, sizeof(blob)));
    memcpy(want.data() + 300001, blob, sizeof(blob));
    std::vector<unsigned char> got(n);
    CHECK(cuMemcpyDtoH(got.data(), d, n));
    compare("memsets at offsets", n, got.data(), want.data(), n);
    unsigned char back[37];
    CHECK(cuMemcpyDtoH(back, d + 300011, sizeof(back)));
    compare("interior DtoH", sizeof(back), back, want.data() + 300011, sizeof(back));
    CHECK(cuMemFree(d));
    printf("memsets and copies at interior offsets ok\n");
}

int main(int argc, char **argv) {
    size_t max_bytes = (size_t)-1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--max-bytes") == 0 && i + 1 < argc)
            max_bytes = (size_t)parse_u64("--max-bytes", argv[++i]);
        else
            fail("unknown argument %s", argv[i]);
    }
    PrimaryCtx p = init_primary();
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    // 262145 and 524289: staged pieces that the shim's helper threads split into
    // page-rounded parts with a tail of a byte or two left over.
    static const size_t sizes[] = {1,         7,          4096,      262145,
                                   524289,    (1u << 20) + 3, 64u << 20, 256u << 20};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++)
        if (sizes[k] <= max_bytes) roundtrip(sizes[k], s);
    pitch_and_offsets(p.dev);

    CHECK(cuStreamQuery(s));
    CHECK(cuStreamDestroy(s));
    release_primary(p);
    pass();
}
