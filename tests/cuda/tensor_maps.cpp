// TMA descriptors: cuTensorMapEncodeTiled / Im2col / Im2colWide and
// cuTensorMapReplaceAddress must give the driver's 128 bytes exactly. The inputs use
// fixed (aligned, not allocated) addresses, so native and omps runs encode the very same
// arguments and their printed descriptors must match byte for byte. Invalid arguments
// must be refused with the driver's error.
#include "common.h"

static void print_map(const char *what, const CUtensorMap &m) {
    const unsigned char *b = (const unsigned char *)&m;
    printf("%s:", what);
    for (int i = 0; i < 128; i++) printf("%s%02x", i % 16 ? "" : " ", b[i]);
    printf("\n");
}

int main() {
    init_primary();
    void *addr = (void *)0x7f0000000000ull;
    void *addr2 = (void *)0x7f0000100000ull;

    CUtensorMap m;
    cuuint64_t dims2[2] = {1024, 512};
    cuuint64_t strides2[1] = {1024 * 2};
    cuuint32_t box2[2] = {64, 64};
    cuuint32_t es2[2] = {1, 1};
    CHECK(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, addr, dims2, strides2,
                                 box2, es2, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    print_map("tiled 2d f16 swizzle128", m);
    CHECK(cuTensorMapReplaceAddress(&m, addr2));
    print_map("tiled after replace", m);

    cuuint64_t dims5[5] = {16, 8, 8, 4, 2};
    cuuint64_t strides5[4] = {16 * 4, 16 * 8 * 4, 16 * 8 * 8 * 4, 16 * 8 * 8 * 4 * 4};
    cuuint32_t box5[5] = {16, 4, 4, 2, 1};
    cuuint32_t es5[5] = {1, 1, 1, 1, 1};
    CHECK(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 5, addr, dims5, strides5,
                                 box5, es5, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA));
    print_map("tiled 5d f32", m);

    // NHWC activations, 3x3 filter window.
    cuuint64_t dims4[4] = {64, 16, 16, 2};
    cuuint64_t strides4[3] = {64 * 2, 64 * 16 * 2, 64 * 16 * 16 * 2};
    int lower[2] = {-1, -1}, upper[2] = {-1, -1};
    cuuint32_t es4[4] = {1, 1, 1, 1};
    CHECK(cuTensorMapEncodeIm2col(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, addr, dims4, strides4,
                                  lower, upper, 64, 128, es4, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    print_map("im2col 4d bf16", m);

    CUresult r = cuTensorMapEncodeIm2colWide(
        &m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, addr, dims4, strides4, -1, 1, 64, 128, es4,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_IM2COL_WIDE_MODE_W,
        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    printf("im2col wide: %s\n", cu_err_name(r));
    if (r == CUDA_SUCCESS) print_map("im2col wide 4d bf16", m);

    // Refusals: rank 0, a misaligned address, a box larger than 256.
    CHECK_EQ_RESULT(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 0, addr, dims2,
                                           strides2, box2, es2, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                           CU_TENSOR_MAP_SWIZZLE_NONE,
                                           CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                    CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ_RESULT(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                                           (char *)addr + 8, dims2, strides2, box2, es2,
                                           CU_TENSOR_MAP_INTERLEAVE_NONE,
                                           CU_TENSOR_MAP_SWIZZLE_NONE,
                                           CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                    CUDA_ERROR_INVALID_VALUE);
    cuuint32_t big[2] = {512, 64};
    CHECK_EQ_RESULT(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, addr, dims2,
                                           strides2, big, es2, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                           CU_TENSOR_MAP_SWIZZLE_NONE,
                                           CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                    CUDA_ERROR_INVALID_VALUE);
    pass();
}
