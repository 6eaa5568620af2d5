// __constant__ and __device__ symbols: initial values, cudaMemcpyToSymbol /
// FromSymbol (with offsets, and async), cudaGetSymbolAddress, cudaGetSymbolSize.
#include "rt_common.h"

__constant__ float c_coef[16];
__constant__ int c_scale;
__constant__ int c_init[4] = {11, 22, 33, 44};
__device__ int d_table[256];
__device__ int d_counter;
__device__ int d_init[4] = {1, 2, 3, 4};
__device__ double d_big[1 << 16];

__global__ void use_symbols(int *out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = (int)(c_coef[i & 15] * (float)c_scale) + d_table[i & 255] + c_init[i & 3] * d_init[i & 3];
        atomicAdd(&d_counter, 1);
    }
}

__global__ void bump_big(int k) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (1 << 16); i += gridDim.x * blockDim.x) d_big[i] += k;
}

int main() {
    int init[4];
    CHECK(cudaMemcpyFromSymbol(init, d_init, sizeof init));
    printf("d_init: %d %d %d %d\n", init[0], init[1], init[2], init[3]);
    CHECK(cudaMemcpyFromSymbol(init, c_init, sizeof init));
    printf("c_init: %d %d %d %d\n", init[0], init[1], init[2], init[3]);
    int zero = -1;
    CHECK(cudaMemcpyFromSymbol(&zero, d_counter, sizeof zero));
    printf("d_counter starts at: %d\n", zero);

    float coef[16];
    for (int i = 0; i < 16; i++) coef[i] = (float)(i * 3 - 7);
    int scale = 5, table[256];
    for (int i = 0; i < 256; i++) table[i] = (int)(mix32(i, 8) % 1000);
    CHECK(cudaMemcpyToSymbol(c_coef, coef, sizeof coef));
    CHECK(cudaMemcpyToSymbol(c_scale, &scale, sizeof scale));
    CHECK(cudaMemcpyToSymbol(d_table, table, 128 * sizeof(int)));                          // first half
    CHECK(cudaMemcpyToSymbol(d_table, table + 128, 128 * sizeof(int), 128 * sizeof(int)));  // second half at an offset

    const int n = 100000;
    int *out, *h = (int *)malloc(n * sizeof(int));
    EXPECT(h, "malloc");
    CHECK(cudaMalloc(&out, n * sizeof(int)));
    use_symbols<<<100, 256>>>(out, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(h, out, n * sizeof(int), cudaMemcpyDeviceToHost));
    const int ci[4] = {11, 22, 33, 44}, di[4] = {1, 2, 3, 4};
    for (int i = 0; i < n; i++) {
        int want = (int)(coef[i & 15] * (float)scale) + table[i & 255] + ci[i & 3] * di[i & 3];
        EXPECT(h[i] == want, "out[%d] = %d, want %d", i, h[i], want);
    }
    int counter = 0;
    CHECK(cudaMemcpyFromSymbol(&counter, d_counter, sizeof counter));
    printf("kernel results: ok, checksum %08x, d_counter %d\n", fnv1a(h, n * sizeof(int)), counter);
    EXPECT(counter == n, "d_counter %d", counter);

    int back[8];
    CHECK(cudaMemcpyFromSymbol(back, d_table, sizeof back, 124 * sizeof(int)));  // across the halves
    EXPECT(memcmp(back, table + 124, sizeof back) == 0, "FromSymbol with offset");
    printf("FromSymbol at an offset: ok\n");

    int *addr = NULL;
    size_t sz = 0;
    CHECK(cudaGetSymbolAddress((void **)&addr, d_table));
    CHECK(cudaGetSymbolSize(&sz, d_table));
    printf("cudaGetSymbolSize(d_table): %zu\n", sz);
    CHECK(cudaGetSymbolSize(&sz, c_coef));
    printf("cudaGetSymbolSize(c_coef): %zu\n", sz);
    CHECK(cudaGetSymbolSize(&sz, d_big));
    printf("cudaGetSymbolSize(d_big): %zu\n", sz);
    CHECK(cudaMemset(addr + 10, 0, 4 * sizeof(int)));
    CHECK(cudaMemcpy(back, addr + 8, sizeof back, cudaMemcpyDeviceToHost));
    EXPECT(back[0] == table[8] && back[2] == 0 && back[5] == 0 && back[6] == table[14], "symbol address memset");
    printf("memset through cudaGetSymbolAddress: ok\n");

    // async to/from a large symbol on a stream, a kernel in between
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    double *hb, *hb2;
    CHECK(cudaMallocHost(&hb, sizeof(double) << 16));
    CHECK(cudaMallocHost(&hb2, sizeof(double) << 16));
    for (int i = 0; i < (1 << 16); i++) hb[i] = i * 0.25;
    CHECK(cudaMemcpyToSymbolAsync(d_big, hb, sizeof(double) << 16, 0, cudaMemcpyHostToDevice, s));
    bump_big<<<64, 256, 0, s>>>(3);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyFromSymbolAsync(hb2, d_big, sizeof(double) << 16, 0, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < (1 << 16); i++) EXPECT(hb2[i] == i * 0.25 + 3, "d_big[%d] = %f", i, hb2[i]);
    printf("async symbol copies around a kernel: ok\n");

    CHECK(cudaFree(out));
    CHECK(cudaFreeHost(hb));
    CHECK(cudaFreeHost(hb2));
    CHECK(cudaStreamDestroy(s));
    free(h);
    pass();
}
