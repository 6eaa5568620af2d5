// Occupancy calculator: cudaOccupancyMaxActiveBlocksPerMultiprocessor (with and
// without flags) across block sizes and dynamic shared memory,
// cudaOccupancyMaxPotentialBlockSize, cudaOccupancyAvailableDynamicSMemPerBlock;
// then a reduction launched with the suggested configuration.
#include "rt_common.h"

__global__ void reduce(const int *in, unsigned long long *out, int n) {
    extern __shared__ unsigned long long part[];
    unsigned long long s = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) s += (unsigned)in[i];
    part[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {  // any block size, power of two or not
        unsigned long long t = 0;
        for (int i = 0; i < blockDim.x; i++) t += part[i];
        atomicAdd(out, t);
    }
}

__global__ void heavy(float *p) {
    __shared__ float big[8192];
    big[threadIdx.x] = p[threadIdx.x];
    __syncthreads();
    p[threadIdx.x] = big[(threadIdx.x + 1) % blockDim.x];
}

struct SmemPerBlock {  // dynamic shared memory that reduce needs for a block size
    __host__ __device__ size_t operator()(int b) const { return (size_t)b * 8; }
};

int main() {
    for (int bs : {32, 64, 128, 256, 512, 1024}) {
        int nb = -1, nb32 = -1, nbf = -1;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, reduce, bs, bs * 8));
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb32, reduce, bs, 32 * 1024));
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&nbf, reduce, bs, bs * 8, cudaOccupancyDisableCachingOverride));
        printf("reduce, block %d: %d blocks/SM, %d with 32 KiB dynamic smem, %d with flags\n", bs, nb, nb32, nbf);
        EXPECT(nb >= 1 && nb32 >= 1, "no block fits");
    }
    int nh = -1;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nh, heavy, 256, 0));
    printf("heavy (32 KiB static smem), block 256: %d blocks/SM\n", nh);

    int min_grid = 0, block = 0;
    CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &block, heavy, 0, 0));
    printf("heavy: suggested block %d, min grid %d\n", block, min_grid);
    CHECK(cudaOccupancyMaxPotentialBlockSizeVariableSMem(&min_grid, &block, reduce, SmemPerBlock(), 0));
    printf("reduce: suggested block %d, min grid %d\n", block, min_grid);
    size_t avail = 0;
    CHECK(cudaOccupancyAvailableDynamicSMemPerBlock(&avail, reduce, 2, 256));
    printf("reduce: dynamic smem available per block at 2 blocks x 256: %zu\n", avail);

    const int n = 3000017;
    int *h = (int *)malloc(n * sizeof(int)), *d;
    EXPECT(h, "malloc");
    unsigned long long want = 0, got = 0, *dout;
    for (int i = 0; i < n; i++) { h[i] = (int)(mix32(i, 13) & 0xffff); want += (unsigned)h[i]; }
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaMalloc(&dout, sizeof want));
    CHECK(cudaMemcpy(d, h, n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dout, 0, sizeof want));
    reduce<<<min_grid, block, block * 8>>>(d, dout, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(&got, dout, sizeof got, cudaMemcpyDeviceToHost));
    printf("reduction with the suggested configuration: %llu (%s)\n", got, got == want ? "ok" : "wrong");
    EXPECT(got == want, "sum %llu, want %llu", got, want);
    CHECK(cudaFree(d));
    CHECK(cudaFree(dout));
    free(h);
    pass();
}
