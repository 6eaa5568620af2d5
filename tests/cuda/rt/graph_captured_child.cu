// A captured graph used as a child node of a graph built by hand (the child is copied:
// the captured graph is destroyed before the launch), and cudaGraphClone of a captured
// graph; each launched twice, results read back.
#include "rt_common.h"

__global__ void add(int *p, int v) { *p += v; }

int main() {
    int *x;
    CHECK(cudaMalloc(&x, sizeof(int)));
    CHECK(cudaMemset(x, 0, sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    add<<<1, 1, 0, s>>>(x, 1);
    add<<<1, 1, 0, s>>>(x, 10);
    cudaGraph_t captured;
    CHECK(cudaStreamEndCapture(s, &captured));

    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t child, after;
    CHECK(cudaGraphAddChildGraphNode(&child, g, nullptr, 0, captured));
    int v = 100;
    void *args[] = {&x, &v};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)add;
    kp.gridDim = dim3(1);
    kp.blockDim = dim3(1);
    kp.kernelParams = args;
    CHECK(cudaGraphAddKernelNode(&after, g, &child, 1, &kp));
    cudaGraph_t copy;
    CHECK(cudaGraphClone(&copy, captured));
    CHECK(cudaGraphDestroy(captured));
    cudaGraph_t inner;
    CHECK(cudaGraphChildGraphNodeGetGraph(child, &inner));
    size_t n = 0;
    CHECK(cudaGraphGetNodes(inner, nullptr, &n));
    printf("the child node's graph: %zu nodes\n", n);

    cudaGraphExec_t x1, x2;
    CHECK(cudaGraphInstantiate(&x1, g, 0));
    CHECK(cudaGraphInstantiate(&x2, copy, 0));
    int h = 0;
    for (int i = 0; i < 2; i++) {
        CHECK(cudaGraphLaunch(x1, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(&h, x, sizeof h, cudaMemcpyDeviceToHost));
        printf("built graph with the captured child, launch %d: %d\n", i + 1, h);
    }
    for (int i = 0; i < 2; i++) {
        CHECK(cudaGraphLaunch(x2, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(&h, x, sizeof h, cudaMemcpyDeviceToHost));
        printf("clone of the captured graph, launch %d: %d\n", i + 1, h);
    }
    EXPECT(h == 2 * 111 + 2 * 11, "got %d", h);
    CHECK(cudaGraphExecDestroy(x1));
    CHECK(cudaGraphExecDestroy(x2));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaGraphDestroy(copy));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(x));
    pass();
}
