// The classic: cudaMalloc, cudaMemcpy, <<<>>> launch, cudaDeviceSynchronize, cudaFree.
#include "rt_common.h"

__global__ void vadd(const float *a, const float *b, float *c, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) c[i] = a[i] + b[i];
}

static void run(int n, int grid, int block) {
    size_t bytes = (size_t)n * sizeof(float);
    float *ha = (float *)malloc(bytes), *hb = (float *)malloc(bytes), *hc = (float *)malloc(bytes);
    EXPECT(ha && hb && hc, "malloc");
    for (int i = 0; i < n; i++) {
        ha[i] = (float)(mix32(i, 1) % 100000);
        hb[i] = (float)(mix32(i, 2) % 100000);
    }
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, bytes));
    CHECK(cudaMalloc(&db, bytes));
    CHECK(cudaMalloc(&dc, bytes));
    CHECK(cudaMemcpy(da, ha, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, hb, bytes, cudaMemcpyHostToDevice));
    vadd<<<grid, block>>>(da, db, dc, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(hc, dc, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        EXPECT(hc[i] == ha[i] + hb[i], "n=%d: c[%d] = %f, want %f", n, i, hc[i], ha[i] + hb[i]);
    printf("n=%d grid=%d block=%d: ok, checksum %08x\n", n, grid, block, fnv1a(hc, bytes));
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    free(ha);
    free(hb);
    free(hc);
}

int main() {
    run(1, 1, 1);
    run(1000, 4, 256);
    run(1 << 20, 1024, 256);
    run(1000003, 97, 128);
    run(1 << 24, 4096, 1024);
    pass();
}
