// Which fields of CUDA_KERNEL_NODE_PARAMS_v2 the driver fills when cudart made the node:
// the shim hands a node's function back the same way (func or kern).
#include <cstdio>
#include <cuda.h>
#include <cuda_runtime.h>
__global__ void k(int *p) { p[0] = 1; }
int main() {
    int *d;
    cudaMalloc(&d, 4);
    cudaGraph_t g;
    cudaGraphCreate(&g, 0);
    cudaKernelNodeParams kp = {};
    void *args[] = {&d};
    kp.func = (void *)k;
    kp.gridDim = dim3(1);
    kp.blockDim = dim3(1);
    kp.kernelParams = args;
    cudaGraphNode_t n;
    printf("add: %d\n", (int)cudaGraphAddKernelNode(&n, g, nullptr, 0, &kp));
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    cudaGetDriverEntryPointByVersion("cuGraphKernelNodeGetParams", &fn, 12000, 0, &q);
    CUDA_KERNEL_NODE_PARAMS_v2 v = {};
    CUresult r = ((CUresult(*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v2 *))fn)((CUgraphNode)n, &v);
    printf("driver get: %d func %s kern %s ctx %s\n", (int)r, v.func ? "set" : "null",
           v.kern ? "set" : "null", v.ctx ? "set" : "null");
    cudaKernelNodeParams back = {};
    printf("runtime get: %d same func %d\n", (int)cudaGraphKernelNodeGetParams(n, &back),
           back.func == (void *)k);
    return 0;
}
