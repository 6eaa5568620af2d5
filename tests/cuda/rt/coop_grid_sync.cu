// Cooperative groups: cudaLaunchCooperativeKernel with the largest co-resident
// grid, 20 grid-wide steps separated by grid.sync(), compared with the host;
// a grid too large to be co-resident is refused.
#include "rt_common.h"
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// x_{t+1}[i] = (x_t[i-1] + 2 x_t[i] + x_t[i+1] + t) mod 2^32, ping-ponging between a and b
__global__ void steps(uint32_t *a, uint32_t *b, int n, int nsteps, unsigned *blocks_seen) {
    cg::grid_group g = cg::this_grid();
    if (g.thread_rank() == 0) *blocks_seen = g.num_blocks();
    for (int t = 0; t < nsteps; t++) {
        uint32_t *src = (t & 1) ? b : a, *dst = (t & 1) ? a : b;
        for (int i = (int)g.thread_rank(); i < n; i += (int)g.num_threads()) {
            uint32_t l = src[(i + n - 1) % n], r = src[(i + 1) % n];
            dst[i] = l + 2u * src[i] + r + (uint32_t)t;
        }
        g.sync();
    }
}

int main() {
    int coop = 0, sms = 0;
    CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("cooperative launch supported: %d\n", coop);
    EXPECT(coop == 1, "no cooperative launch");
    const int threads = 256;
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, steps, threads, 0));
    EXPECT(per_sm >= 1, "occupancy %d", per_sm);
    int blocks = per_sm * sms;

    const int n = 1000003, nsteps = 20;
    uint32_t *a, *b;
    unsigned *seen;
    CHECK(cudaMalloc(&a, n * 4));
    CHECK(cudaMalloc(&b, n * 4));
    CHECK(cudaMalloc(&seen, sizeof(unsigned)));
    uint32_t *h = (uint32_t *)malloc(n * 4), *h2 = (uint32_t *)malloc(n * 4);
    EXPECT(h && h2, "malloc");
    for (int i = 0; i < n; i++) h[i] = mix32(i, 12);
    CHECK(cudaMemcpy(a, h, n * 4, cudaMemcpyHostToDevice));
    int nn = n, ns = nsteps;
    void *args[] = {&a, &b, &nn, &ns, &seen};
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaLaunchCooperativeKernel((const void *)steps, dim3(blocks), dim3(threads), args, 0, s));
    CHECK(cudaStreamSynchronize(s));
    unsigned got_blocks = 0;
    CHECK(cudaMemcpy(&got_blocks, seen, sizeof got_blocks, cudaMemcpyDeviceToHost));
    EXPECT(got_blocks == (unsigned)blocks, "grid saw %u blocks, launched %d", got_blocks, blocks);
    printf("grid is occupancy x SMs: yes\n");
    CHECK(cudaMemcpy(h2, nsteps % 2 ? b : a, n * 4, cudaMemcpyDeviceToHost));

    uint32_t *x = h, *y = (uint32_t *)malloc(n * 4);
    EXPECT(y, "malloc");
    for (int t = 0; t < nsteps; t++) {
        for (int i = 0; i < n; i++) y[i] = x[(i + n - 1) % n] + 2u * x[i] + x[(i + 1) % n] + (uint32_t)t;
        uint32_t *tmp = x; x = y; y = tmp;
    }
    for (int i = 0; i < n; i++) EXPECT(h2[i] == x[i], "element %d after %d steps: %08x, want %08x", i, nsteps, h2[i], x[i]);
    printf("%d grid-synchronised steps over %d elements: ok, checksum %08x\n", nsteps, n, fnv1a(h2, n * 4));

    cudaError_t e = cudaLaunchCooperativeKernel((const void *)steps, dim3(blocks * 4 + 1), dim3(threads), args, 0, s);
    EXPECT(e != cudaSuccess, "an oversized cooperative grid was accepted");
    report_err("cooperative grid larger than co-resident", e);
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(seen));
    CHECK(cudaStreamDestroy(s));
    free(h2);
    free(x);  // x and y are h and the second buffer, in some order
    free(y);
    pass();
}
