// cudaLaunchKernelEx with launch attributes: thread block clusters of 2 and 4
// (sm_90) with distributed shared memory, a priority attribute, no attributes;
// cudaOccupancyMaxActiveClusters; a grid that is not a multiple of the cluster.
#include "rt_common.h"
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// each block publishes blockIdx.x * 10 in shared memory; block r of a cluster
// reads the value of block (r + 1) % size through distributed shared memory
__global__ void cluster_k(int *out) {
    __shared__ int s;
    cg::cluster_group c = cg::this_cluster();
    if (threadIdx.x == 0) s = blockIdx.x * 10;
    c.sync();
    unsigned peer = (c.block_rank() + 1) % c.num_blocks();
    int *ps = c.map_shared_rank(&s, peer);
    if (threadIdx.x == 0) out[blockIdx.x] = *ps * 100 + (int)c.block_rank() * 10 + (int)c.num_blocks();
    c.sync();  // keep our shared memory alive until the peer has read it
}

__global__ void plain_k(int *out, int add) { out[blockIdx.x * blockDim.x + threadIdx.x] += add; }

static void run_cluster(int *d, int grid, int csize, cudaStream_t s) {
    CHECK(cudaMemset(d, 0xff, grid * sizeof(int)));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(64);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = csize;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int nclusters = -1;
    CHECK(cudaOccupancyMaxActiveClusters(&nclusters, (void *)cluster_k, &cfg));
    printf("cluster %d: max active clusters %d\n", csize, nclusters);
    CHECK(cudaLaunchKernelEx(&cfg, cluster_k, d));
    CHECK(cudaStreamSynchronize(s));
    int h[64];
    CHECK(cudaMemcpy(h, d, grid * sizeof(int), cudaMemcpyDeviceToHost));
    for (int b = 0; b < grid; b++) {
        int rank = b % csize, peer = b - rank + (rank + 1) % csize;
        int want = peer * 10 * 100 + rank * 10 + csize;
        EXPECT(h[b] == want, "cluster %d block %d: %d, want %d", csize, b, h[b], want);
    }
    printf("cluster %d, grid %d: distributed shared memory exchange ok, checksum %08x\n", csize, grid, fnv1a(h, grid * 4));
}

int main() {
    int cl = 0;
    CHECK(cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, 0));
    printf("cluster launch supported: %d\n", cl);
    EXPECT(cl == 1, "no cluster launch (needs sm_90)");
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d;
    CHECK(cudaMalloc(&d, 64 * 64 * sizeof(int)));
    run_cluster(d, 8, 2, s);
    run_cluster(d, 64, 4, s);

    // priority attribute, and no attributes at all
    int least, greatest;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CHECK(cudaMemset(d, 0, 64 * 64 * sizeof(int)));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(64);
    cfg.blockDim = dim3(64);
    cfg.stream = s;
    cudaLaunchAttribute pa;
    pa.id = cudaLaunchAttributePriority;
    pa.val.priority = greatest;
    cfg.attrs = &pa;
    cfg.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&cfg, plain_k, d, 5));
    cfg.attrs = NULL;
    cfg.numAttrs = 0;
    CHECK(cudaLaunchKernelEx(&cfg, plain_k, d, 7));
    CHECK(cudaStreamSynchronize(s));
    int h[64 * 64];
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64 * 64; i++) EXPECT(h[i] == 12, "plain element %d = %d", i, h[i]);
    printf("cudaLaunchKernelEx with a priority attribute and with none: ok\n");

    // a grid that is not a multiple of the cluster size is refused
    cudaLaunchAttribute ca;
    ca.id = cudaLaunchAttributeClusterDimension;
    ca.val.clusterDim.x = 4;
    ca.val.clusterDim.y = 1;
    ca.val.clusterDim.z = 1;
    cfg.gridDim = dim3(6);
    cfg.attrs = &ca;
    cfg.numAttrs = 1;
    cudaError_t e = cudaLaunchKernelEx(&cfg, cluster_k, d);
    EXPECT(e != cudaSuccess, "grid 6 with cluster 4 accepted");
    report_err("grid 6 with cluster 4", e);
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
    pass();
}
