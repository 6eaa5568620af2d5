// What a program reads back from and changes in a graph built by hand: a kernel node's
// parameters and launch attributes, the edges, a child node's graph (changes to it are
// the node's), nodes disabled and enabled in an executable graph, the generic
// SetParams calls, the executable graph's flags, and a DOT file written.
#include "rt_common.h"
#include <vector>

__global__ void fill(int *p, int v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

static const int N = 4096;

static int first(const int *p) {
    int v = 0;
    CHECK(cudaMemcpy(&v, p, sizeof v, cudaMemcpyDeviceToHost));
    return v;
}

int main() {
    int *p, *q;
    CHECK(cudaMalloc(&p, N * sizeof(int)));
    CHECK(cudaMalloc(&q, N * sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));

    // k: p = 7 (kernel); m: q = 1 (memset), after k; c: a child graph filling q with 2,
    // after m.
    int *pp = p, seven = 7, n = N;
    void *args[] = {&pp, &seven, &n};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)fill;
    kp.gridDim = dim3(N / 256);
    kp.blockDim = dim3(256);
    kp.kernelParams = args;
    cudaGraphNode_t k, m, c;
    CHECK(cudaGraphAddKernelNode(&k, g, nullptr, 0, &kp));
    cudaMemsetParams ms = {};
    ms.dst = q;
    ms.value = 1;
    ms.elementSize = 4;
    ms.width = N;
    ms.height = 1;
    CHECK(cudaGraphAddMemsetNode(&m, g, &k, 1, &ms));
    cudaGraph_t child;
    CHECK(cudaGraphCreate(&child, 0));
    cudaGraphNode_t cm;
    cudaMemsetParams two = ms;
    two.value = 2;
    CHECK(cudaGraphAddMemsetNode(&cm, child, nullptr, 0, &two));
    CHECK(cudaGraphAddChildGraphNode(&c, g, &m, 1, child));

    // The kernel node's parameters, as made.
    cudaKernelNodeParams back = {};
    CHECK(cudaGraphKernelNodeGetParams(k, &back));
    printf("kernel node: func %s, grid %u, block %u, value %d\n",
           back.func == (void *)fill ? "fill" : "other", back.gridDim.x, back.blockDim.x,
           *(int *)back.kernelParams[1]);
    // A launch attribute set and read back.
    cudaKernelNodeAttrValue prio = {};
    prio.priority = -1;
    CHECK(cudaGraphKernelNodeSetAttribute(k, cudaKernelNodeAttributePriority, &prio));
    cudaKernelNodeAttrValue pb = {};
    CHECK(cudaGraphKernelNodeGetAttribute(k, cudaKernelNodeAttributePriority, &pb));
    printf("priority attribute: %d\n", pb.priority);

    // Edges.
    size_t ne = 0;
    CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &ne));
    std::vector<cudaGraphNode_t> from(ne), to(ne);
    CHECK(cudaGraphGetEdges(g, from.data(), to.data(), nullptr, &ne));
    int known = 0;
    for (size_t i = 0; i < ne; i++)
        known += (from[i] == k && to[i] == m) || (from[i] == m && to[i] == c);
    printf("edges: %zu, both known: %s\n", ne, known == 2 ? "yes" : "no");

    // The child node's graph is its own copy: a node added to it is the node's.
    cudaGraph_t owned;
    CHECK(cudaGraphChildGraphNodeGetGraph(c, &owned));
    size_t nc = 0, no = 0;
    cudaGraphNode_t extra;
    CHECK(cudaGraphAddEmptyNode(&extra, owned, nullptr, 0));
    CHECK(cudaGraphGetNodes(owned, nullptr, &no));
    CHECK(cudaGraphGetNodes(child, nullptr, &nc));
    printf("child node's graph: %zu nodes, the original: %zu\n", no, nc);

    // Instantiated, launched: p = 7, q = 2 (the child runs after the memset).
    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    unsigned long long flags = 0;
    CHECK(cudaGraphExecGetFlags(x, &flags));
    printf("executable graph flags: %llu\n", flags);
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    printf("launch: p %d, q %d\n", first(p), first(q));

    // The kernel node disabled: p keeps what it has; enabled again.
    CHECK(cudaMemset(p, 0, N * sizeof(int)));
    CHECK(cudaGraphNodeSetEnabled(x, k, 0));
    unsigned int on = 9;
    CHECK(cudaGraphNodeGetEnabled(x, k, &on));
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    printf("kernel disabled (enabled %u): p %d\n", on, first(p));
    CHECK(cudaGraphNodeSetEnabled(x, k, 1));
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    printf("enabled again: p %d\n", first(p));

    // The generic SetParams: the executable graph's kernel now writes 11.
    int eleven = 11;
    void *args11[] = {&pp, &eleven, &n};
    cudaGraphNodeParams np = {};
    np.type = cudaGraphNodeTypeKernel;
    np.kernel.func = (void *)fill;
    np.kernel.gridDim = dim3(N / 256);
    np.kernel.blockDim = dim3(256);
    np.kernel.kernelParams = args11;
    CHECK(cudaGraphExecNodeSetParams(x, k, &np));
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    printf("generic exec set: p %d\n", first(p));

    const char *dot = "/tmp/omps-graph-queries.dot";
    CHECK(cudaGraphDebugDotPrint(g, dot, 0));
    FILE *f = fopen(dot, "r");
    printf("DOT file written: %s\n", f ? "yes" : "no");
    if (f) fclose(f);
    remove(dot);

    CHECK(cudaGraphExecDestroy(x));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaGraphDestroy(child));
    if (first(p) != 11) fail("p is %d", first(p));
    pass();
}
