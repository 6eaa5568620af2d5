// kernel_args: cubin image loaded with cuModuleLoadData. One kernel takes a
// pointer, int8, int16, int32, int64, uint64, float, double, a 48-byte struct
// with padding and another pointer, and writes them back; the host checks the
// bytes exactly. Launched once through kernelParams and once through `extra`
// (CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE, buffer laid out by hand), and the
// hand layout is checked against cuFuncGetParamInfo. Also cuFuncGetAttribute.
#include "common.h"

#include <stddef.h>

struct __attribute__((aligned(8))) Mixed {
    int8_t a;
    double d;
    int16_t s;
    int32_t i;
    float f;
    int64_t l;
    uint8_t tail[3];
};
static_assert(sizeof(Mixed) == 48, "Mixed must be 48 bytes");
static_assert(offsetof(Mixed, d) == 8 && offsetof(Mixed, s) == 16 && offsetof(Mixed, i) == 20 &&
                  offsetof(Mixed, f) == 24 && offsetof(Mixed, l) == 32 &&
                  offsetof(Mixed, tail) == 40,
              "Mixed layout");

struct Args {
    int8_t v8;
    int16_t v16;
    int32_t v32;
    int64_t v64;
    uint64_t vu64;
    float vf;
    double vd;
    Mixed m;
};

static const size_t OUT_BYTES = 96;

// The bytes the kernel must produce (padding stays 0 from the memset).
static void expected_bytes(const Args &a, unsigned char *e) {
    memset(e, 0, OUT_BYTES);
    memcpy(e + 0, &a.v8, 1);
    memcpy(e + 2, &a.v16, 2);
    memcpy(e + 4, &a.v32, 4);
    memcpy(e + 8, &a.v64, 8);
    memcpy(e + 16, &a.vu64, 8);
    memcpy(e + 24, &a.vf, 4);
    memcpy(e + 32, &a.vd, 8);
    unsigned char *ms = e + 40;
    memcpy(ms + 0, &a.m.a, 1);
    memcpy(ms + 8, &a.m.d, 8);
    memcpy(ms + 16, &a.m.s, 2);
    memcpy(ms + 20, &a.m.i, 4);
    memcpy(ms + 24, &a.m.f, 4);
    memcpy(ms + 32, &a.m.l, 8);
    memcpy(ms + 40, a.m.tail, 3);
}

static void verify(const char *how, CUdeviceptr dout, CUdeviceptr dout2, const Args &a) {
    unsigned char got[OUT_BYTES], want[OUT_BYTES];
    CHECK(cuMemcpyDtoH(got, dout, OUT_BYTES));
    expected_bytes(a, want);
    for (size_t i = 0; i < OUT_BYTES; i++)
        if (got[i] != want[i])
            fail("%s: byte %zu is 0x%02x, expected 0x%02x", how, i, got[i], want[i]);
    uint32_t o2[2];
    CHECK(cuMemcpyDtoH(o2, dout2, sizeof(o2)));
    uint32_t sum = 0;
    for (int k = 0; k < 64; k++) sum += (uint32_t)(k * a.v32);
    if (o2[0] != (0xC0FFEE00u | 64u) || o2[1] != sum)
        fail("%s: out2 = {0x%08x, %u}, expected {0x%08x, %u}", how, o2[0], o2[1], 0xC0FFEE00u | 64u,
             sum);
    printf("%s: %zu bytes + out2 verified\n", how, OUT_BYTES);
}

// Append v (size bytes, aligned to align) to a kernel parameter buffer.
static void put(std::vector<unsigned char> &buf, const void *v, size_t size, size_t align) {
    size_t off = (buf.size() + align - 1) / align * align;
    buf.resize(off + size, 0);
    memcpy(buf.data() + off, v, size);
}

int main(int argc, char **argv) {
    std::string path = image_path(argc, argv, "kernel_args.cubin");
    PrimaryCtx p = init_primary();

    std::vector<char> image = load_file(path);
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, image.data()));
    CUfunction fn;
    CHECK(cuModuleGetFunction(&fn, mod, "write_args"));

    // Function attributes (NUM_REGS is compiler-dependent: not printed).
    int maxthr = 0, shared = -1, binver = 0, ptxver = 0, regs = 0;
    CHECK(cuFuncGetAttribute(&maxthr, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn));
    CHECK(cuFuncGetAttribute(&shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn));
    CHECK(cuFuncGetAttribute(&binver, CU_FUNC_ATTRIBUTE_BINARY_VERSION, fn));
    CHECK(cuFuncGetAttribute(&ptxver, CU_FUNC_ATTRIBUTE_PTX_VERSION, fn));
    CHECK(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fn));
    printf("func max_threads_per_block_positive %d\n", maxthr > 0 ? 1 : 0);
    printf("func static_shared_bytes %d\n", shared);
    printf("func binary_version %d\n", binver);
    printf("func ptx_version %d\n", ptxver);
    printf("func num_regs_positive %d\n", regs > 0 ? 1 : 0);
    EXPECT(maxthr > 0, "MAX_THREADS_PER_BLOCK is %d", maxthr);
    EXPECT(shared >= 256, "SHARED_SIZE_BYTES is %d, expected >= 256", shared);

    // Parameter layout as the driver sees it, against the hand layout used
    // for the `extra` launch below.
    static const size_t want_off[10] = {0, 8, 10, 12, 16, 24, 32, 40, 48, 96};
    static const size_t want_size[10] = {8, 1, 2, 4, 8, 8, 4, 8, 48, 8};
    for (size_t k = 0; k < 10; k++) {
        size_t off = 0, size = 0;
        CHECK(cuFuncGetParamInfo(fn, k, &off, &size));
        printf("param %zu offset %zu size %zu\n", k, off, size);
        EXPECT(off == want_off[k] && size == want_size[k],
               "param %zu: driver says offset %zu size %zu, expected %zu/%zu", k, off, size,
               want_off[k], want_size[k]);
    }

    CUdeviceptr dout, dout2;
    CHECK(cuMemAlloc(&dout, OUT_BYTES));
    CHECK(cuMemAlloc(&dout2, 2 * sizeof(uint32_t)));

    // 1) kernelParams.
    Args a;
    memset(&a, 0, sizeof(a));
    a.v8 = -128;
    a.v16 = -32768 + 5;
    a.v32 = 0x7ffffff1;
    a.v64 = (int64_t)0x8000000000000003ull;
    a.vu64 = 0xFEDCBA9876543210ull;
    a.vf = -0.0f;
    a.vd = 3.141592653589793;
    a.m.a = 0x5a;
    a.m.d = -1.0e-300;
    a.m.s = 0x1234;
    a.m.i = -123456789;
    a.m.f = 1.0e-40f;  // subnormal: must pass through untouched
    a.m.l = 0x0123456789abcdefll;
    a.m.tail[0] = 0xde;
    a.m.tail[1] = 0xad;
    a.m.tail[2] = 0x01;
    CHECK(cuMemsetD8(dout, 0, OUT_BYTES));
    CHECK(cuMemsetD8(dout2, 0, 8));
    void *params[] = {&dout, &a.v8, &a.v16, &a.v32, &a.v64, &a.vu64, &a.vf, &a.vd, &a.m, &dout2};
    CHECK(cuLaunchKernel(fn, 1, 1, 1, 64, 1, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    verify("kernelParams", dout, dout2, a);

    // 2) extra: one buffer, each argument at its natural alignment.
    Args b;
    memset(&b, 0, sizeof(b));
    b.v8 = 127;
    b.v16 = 32767;
    b.v32 = -7;
    b.v64 = -2;
    b.vu64 = 0x8000000000000001ull;
    b.vf = 6.5e+37f;
    b.vd = -2.5e-310;  // subnormal double
    b.m.a = -1;
    b.m.d = 1.0 / 3.0;
    b.m.s = -2;
    b.m.i = 0x7fffffff;
    b.m.f = -3.75f;
    b.m.l = -1;
    b.m.tail[0] = 0x00;
    b.m.tail[1] = 0xff;
    b.m.tail[2] = 0x80;
    std::vector<unsigned char> buf;
    put(buf, &dout, sizeof(dout), 8);
    put(buf, &b.v8, 1, 1);
    put(buf, &b.v16, 2, 2);
    put(buf, &b.v32, 4, 4);
    put(buf, &b.v64, 8, 8);
    put(buf, &b.vu64, 8, 8);
    put(buf, &b.vf, 4, 4);
    put(buf, &b.vd, 8, 8);
    put(buf, &b.m, sizeof(Mixed), 8);
    put(buf, &dout2, sizeof(dout2), 8);
    EXPECT(buf.size() == 104, "extra buffer is %zu bytes, expected 104", buf.size());
    size_t bufsize = buf.size();
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf.data(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &bufsize, CU_LAUNCH_PARAM_END};
    CHECK(cuMemsetD8(dout, 0, OUT_BYTES));
    CHECK(cuMemsetD8(dout2, 0, 8));
    CHECK(cuLaunchKernel(fn, 1, 1, 1, 64, 1, 1, 0, NULL, NULL, extra));
    CHECK(cuCtxSynchronize());
    verify("extra", dout, dout2, b);

    CHECK(cuMemFree(dout));
    CHECK(cuMemFree(dout2));
    CHECK(cuModuleUnload(mod));
    release_primary(p);
    pass();
}
