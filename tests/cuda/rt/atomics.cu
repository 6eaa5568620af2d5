// Atomics on global and shared memory: add (int, unsigned long long, float,
// double), min/max, inc with wrap, and/or/xor, CAS loops, exch; results with
// a deterministic value are compared with the host's.
#include "rt_common.h"

struct Acc {
    int count;
    unsigned int inc;
    unsigned int mx, mn;
    unsigned int x_or, a_nd, o_r;
    unsigned long long sum64;
    float fsum;
    double dsum;
    int cas_max;
    int exch;
    unsigned int hist[256];
};

__device__ void cas_max(int *p, int v) {
    int old = *p, assumed;
    do {
        assumed = old;
        if (assumed >= v) return;
        old = atomicCAS(p, assumed, v);
    } while (old != assumed);
}

__global__ void atoms(Acc *acc, int n) {
    __shared__ unsigned int sh[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sh[i] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        uint32_t r = mix32(i, 21);
        atomicAdd(&acc->count, 1);
        atomicInc(&acc->inc, 999);
        atomicMax(&acc->mx, r);
        atomicMin(&acc->mn, r);
        atomicXor(&acc->x_or, r);
        atomicAnd(&acc->a_nd, r | 0x80000001u);
        atomicOr(&acc->o_r, r & 0x00f0000fu);
        atomicAdd(&acc->sum64, (unsigned long long)r);
        atomicAdd(&acc->fsum, 1.0f);
        atomicAdd(&acc->dsum, 0.5);
        cas_max(&acc->cas_max, (int)(r >> 1));
        atomicExch(&acc->exch, i);
        atomicAdd(&sh[r & 255], 1u);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += blockDim.x) atomicAdd(&acc->hist[i], sh[i]);
}

int main() {
    const int n = 1 << 20;
    Acc h0 = {};
    h0.mn = 0xffffffffu;
    h0.a_nd = 0xffffffffu;
    h0.cas_max = -1;
    h0.exch = -1;
    Acc *d;
    CHECK(cudaMalloc(&d, sizeof(Acc)));
    CHECK(cudaMemcpy(d, &h0, sizeof h0, cudaMemcpyHostToDevice));
    atoms<<<264, 256>>>(d, n);
    CHECK_LAUNCH();
    Acc g;
    CHECK(cudaMemcpy(&g, d, sizeof g, cudaMemcpyDeviceToHost));

    Acc w = h0;
    for (int i = 0; i < n; i++) {
        uint32_t r = mix32(i, 21);
        w.count++;
        w.inc = w.inc >= 999 ? 0 : w.inc + 1;
        if (r > w.mx) w.mx = r;
        if (r < w.mn) w.mn = r;
        w.x_or ^= r;
        w.a_nd &= r | 0x80000001u;
        w.o_r |= r & 0x00f0000fu;
        w.sum64 += r;
        w.fsum += 1.0f;
        w.dsum += 0.5;
        if ((int)(r >> 1) > w.cas_max) w.cas_max = (int)(r >> 1);
        w.hist[r & 255]++;
    }
    printf("count %d inc %u\n", g.count, g.inc);
    printf("max %08x min %08x\n", g.mx, g.mn);
    printf("xor %08x and %08x or %08x\n", g.x_or, g.a_nd, g.o_r);
    printf("sum64 %llu\n", g.sum64);
    printf("fsum %.1f dsum %.1f\n", g.fsum, g.dsum);
    printf("cas max %d\n", g.cas_max);
    printf("histogram checksum %08x\n", fnv1a(g.hist, sizeof g.hist));
    EXPECT(g.count == w.count && g.inc == w.inc, "count/inc: %d %u, want %d %u", g.count, g.inc, w.count, w.inc);
    EXPECT(g.mx == w.mx && g.mn == w.mn, "min/max");
    EXPECT(g.x_or == w.x_or && g.a_nd == w.a_nd && g.o_r == w.o_r, "bitwise");
    EXPECT(g.sum64 == w.sum64, "sum64 %llu want %llu", g.sum64, w.sum64);
    EXPECT(g.fsum == w.fsum && g.dsum == w.dsum, "float sums %f %f", g.fsum, g.dsum);
    EXPECT(g.cas_max == w.cas_max, "cas max");
    EXPECT(memcmp(g.hist, w.hist, sizeof g.hist) == 0, "histogram");
    EXPECT(g.exch >= 0 && g.exch < n, "exch %d out of range", g.exch);
    printf("exch holds some index: yes\n");

    // many threads hammering one counter from every block, on two streams at once
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CHECK(cudaMemcpy(d, &h0, sizeof h0, cudaMemcpyHostToDevice));
    atoms<<<132, 512, 0, s1>>>(d, n);
    CHECK_LAUNCH();
    atoms<<<66, 1024, 0, s2>>>(d, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(&g, d, sizeof g, cudaMemcpyDeviceToHost));
    printf("two concurrent kernels: count %d sum64 ok %s\n", g.count, yes_no(g.sum64 == 2 * w.sum64));
    EXPECT(g.count == 2 * n && g.sum64 == 2 * w.sum64, "concurrent atomics");
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    pass();
}
