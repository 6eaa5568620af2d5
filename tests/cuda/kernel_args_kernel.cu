// Kernel image for kernel_args (built as a cubin for sm_90).
#include <stdint.h>

// Must match the host's definition in kernel_args.cpp: 48 bytes, 8-aligned,
// with padding after a, s, f and at the end.
struct __align__(8) Mixed {
    int8_t a;       // 0  (7 bytes of padding follow)
    double d;       // 8
    int16_t s;      // 16 (2 bytes of padding follow)
    int32_t i;      // 20
    float f;        // 24 (4 bytes of padding follow)
    int64_t l;      // 32
    uint8_t tail[3];// 40 (5 bytes of padding at the end)
};
static_assert(sizeof(Mixed) == 48, "Mixed must be 48 bytes");

// Writes every argument back, field by field, at fixed offsets of out
// (padding bytes are never written). out2 receives a marker and a value
// computed through static shared memory.
extern "C" __global__ void write_args(unsigned char *out, int8_t v8, int16_t v16, int32_t v32,
                                      int64_t v64, uint64_t vu64, float vf, double vd, Mixed m,
                                      uint32_t *out2) {
    __shared__ int sbuf[64];  // 256 bytes of static shared memory
    int t = threadIdx.x;
    sbuf[t] = t * v32;
    __syncthreads();
    if (t == 0) {
        *(int8_t *)(out + 0) = v8;
        *(int16_t *)(out + 2) = v16;
        *(int32_t *)(out + 4) = v32;
        *(int64_t *)(out + 8) = v64;
        *(uint64_t *)(out + 16) = vu64;
        *(float *)(out + 24) = vf;
        *(double *)(out + 32) = vd;
        unsigned char *ms = out + 40;  // struct copied field by field
        *(int8_t *)(ms + 0) = m.a;
        *(double *)(ms + 8) = m.d;
        *(int16_t *)(ms + 16) = m.s;
        *(int32_t *)(ms + 20) = m.i;
        *(float *)(ms + 24) = m.f;
        *(int64_t *)(ms + 32) = m.l;
        ms[40] = m.tail[0];
        ms[41] = m.tail[1];
        ms[42] = m.tail[2];
        int sum = 0;
        for (int k = 0; k < 64; k++) sum += sbuf[k];
        out2[0] = 0xC0FFEE00u | (uint32_t)blockDim.x;
        out2[1] = (uint32_t)sum;
    }
}
