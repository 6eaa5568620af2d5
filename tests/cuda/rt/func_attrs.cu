// cudaFuncGetAttributes on kernels with static shared memory, launch bounds,
// local memory and a compile-time cluster size; cudaFuncSetAttribute and
// cudaFuncSetCacheConfig round trips; cudaFuncGetName. (numRegs and the other
// compiler-chosen numbers are fixed for a given binary, so they are printed.)
#include "rt_common.h"

__global__ void plain(int *p) { p[threadIdx.x] = threadIdx.x; }

__global__ void static_smem(float *out) {
    __shared__ float tile[1024];
    __shared__ int extra[100];
    tile[threadIdx.x] = (float)threadIdx.x;
    extra[threadIdx.x % 100] = threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = tile[1023 - threadIdx.x] + extra[threadIdx.x % 100];
}

__global__ void __launch_bounds__(128) bounded(int *p) { p[threadIdx.x] *= 2; }

__global__ void with_local(int *p, int k) {
    int local[64];
    for (int i = 0; i < 64; i++) local[(i * 7 + k) & 63] = i * p[i];
    p[threadIdx.x] = local[(threadIdx.x + k) & 63];
}

__global__ void __cluster_dims__(2, 1, 1) clustered(int *p) { p[blockIdx.x] = blockIdx.x; }

static void show(const char *name, const void *f) {
    cudaFuncAttributes a;
    CHECK(cudaFuncGetAttributes(&a, f));
    printf("%s: sharedSizeBytes %zu constSizeBytes %zu localSizeBytes %zu maxThreadsPerBlock %d numRegs %d\n", name,
           a.sharedSizeBytes, a.constSizeBytes, a.localSizeBytes, a.maxThreadsPerBlock, a.numRegs);
    printf("%s: ptxVersion %d binaryVersion %d cacheModeCA %d maxDynamicSharedSizeBytes %d preferredShmemCarveout %d\n",
           name, a.ptxVersion, a.binaryVersion, a.cacheModeCA, a.maxDynamicSharedSizeBytes, a.preferredShmemCarveout);
    printf("%s: clusterDimMustBeSet %d requiredCluster %dx%dx%d nonPortableClusterSizeAllowed %d\n", name,
           a.clusterDimMustBeSet, a.requiredClusterWidth, a.requiredClusterHeight, a.requiredClusterDepth,
           a.nonPortableClusterSizeAllowed);
    const char *fname = NULL;
    CHECK(cudaFuncGetName(&fname, f));
    printf("%s: cudaFuncGetName %s\n", name, fname ? fname : "(null)");
}

int main() {
    show("plain", (const void *)plain);
    show("static_smem", (const void *)static_smem);
    show("bounded", (const void *)bounded);
    show("with_local", (const void *)with_local);
    show("clustered", (const void *)clustered);

    cudaFuncAttributes a;
    CHECK(cudaFuncGetAttributes(&a, static_smem));
    EXPECT(a.sharedSizeBytes == 1024 * 4 + 100 * 4, "static shared size %zu", a.sharedSizeBytes);
    CHECK(cudaFuncGetAttributes(&a, bounded));
    EXPECT(a.maxThreadsPerBlock <= 128, "launch bounds not reflected: %d", a.maxThreadsPerBlock);

    CHECK(cudaFuncSetAttribute(plain, cudaFuncAttributePreferredSharedMemoryCarveout, 50));
    CHECK(cudaFuncSetAttribute(plain, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    CHECK(cudaFuncSetCacheConfig(plain, cudaFuncCachePreferShared));
    CHECK(cudaFuncGetAttributes(&a, plain));
    printf("plain after set: preferredShmemCarveout %d maxDynamicSharedSizeBytes %d\n", a.preferredShmemCarveout,
           a.maxDynamicSharedSizeBytes);
    EXPECT(a.maxDynamicSharedSizeBytes == 64 * 1024, "maxDynamicSharedSizeBytes did not stick");

    cudaFuncAttributes bad;
    cudaError_t e = cudaFuncGetAttributes(&bad, (const void *)&a);  // not a kernel
    EXPECT(e != cudaSuccess, "attributes of a non-kernel pointer");
    report_err("cudaFuncGetAttributes(not a kernel)", e);

    // the kernels still run
    int *d;
    CHECK(cudaMalloc(&d, 1024 * sizeof(int)));
    CHECK(cudaMemset(d, 0, 1024 * sizeof(int)));
    plain<<<1, 256, 64 * 1024>>>(d);
    CHECK_LAUNCH();
    bounded<<<1, 128>>>(d);
    CHECK_LAUNCH();
    clustered<<<4, 32>>>(d + 512);
    CHECK_LAUNCH();
    int h[516];
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    EXPECT(h[100] == 200 && h[200] == 200 && h[513] == 1 && h[515] == 3, "kernel results");
    printf("kernels ran: ok\n");
    CHECK(cudaFree(d));
    pass();
}
