// A graph built by hand: a memset node and a kernel node side by side, a memcpy node
// after both, an event record and an event wait node, an empty node, and a child graph
// of one kernel, then a host node. Launched twice; then the
// executable graph's kernel node gets new arguments; then an update from a clone with
// other arguments succeeds and one from a graph of another shape is refused.
#include "rt_common.h"
#include <vector>

__global__ void fill(int *p, int v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

static const int N = 1 << 16;

// A host node: counts the replays that reached it (after everything before it).
static void CUDART_CB bump(void *count) { ++*(int *)count; }

static cudaKernelNodeParams fill_node(void **args) {
    cudaKernelNodeParams k = {};
    k.func = (void *)fill;
    k.gridDim = dim3(N / 256);
    k.blockDim = dim3(256);
    k.kernelParams = args;
    return k;
}

// p: [0, N/4) = 3, the rest 5; q: [0, N/2) = 5, the rest `hi`.
static void check(const int *p, const int *q, int hi, const char *what) {
    std::vector<int> hp(N), hq(N);
    CHECK(cudaMemcpy(hp.data(), p, N * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hq.data(), q, N * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < N; i++) {
        bad += hp[i] != (i < N / 4 ? 3 : 5);
        bad += hq[i] != (i < N / 2 ? 5 : hi);
    }
    printf("%s: q's upper half %d, %s\n", what, hq[N - 1], bad == 0 ? "all as expected" : "WRONG");
    EXPECT(bad == 0, "%s: %d values wrong", what, bad);
}

int main() {
    int *p, *q;
    CHECK(cudaMalloc(&p, N * sizeof(int)));
    CHECK(cudaMalloc(&q, N * sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));

    cudaMemsetParams ms = {};
    ms.dst = p;
    ms.value = 5;
    ms.elementSize = 4;
    ms.width = N;
    ms.height = 1;
    cudaGraphNode_t a, b, c, d, e;
    CHECK(cudaGraphAddMemsetNode(&a, g, nullptr, 0, &ms));
    int *qa = q, nine = 9, n = N;
    void *args[] = {&qa, &nine, &n};
    cudaKernelNodeParams kb = fill_node(args);
    CHECK(cudaGraphAddKernelNode(&b, g, nullptr, 0, &kb));
    nine = 1;  // the node copied its arguments

    cudaMemcpy3DParms cp = {};
    cp.srcPtr = make_cudaPitchedPtr(p, N * sizeof(int), N, 1);
    cp.dstPtr = make_cudaPitchedPtr(q, N * sizeof(int), N, 1);
    cp.extent = make_cudaExtent(N / 2 * sizeof(int), 1, 1);
    cp.kind = cudaMemcpyDeviceToDevice;
    cudaGraphNode_t ab[] = {a, b};
    CHECK(cudaGraphAddMemcpyNode(&c, g, ab, 2, &cp));
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaGraphNode_t rec, w;
    CHECK(cudaGraphAddEventRecordNode(&rec, g, &c, 1, ev));
    CHECK(cudaGraphAddEventWaitNode(&w, g, &rec, 1, ev));
    CHECK(cudaGraphAddEmptyNode(&d, g, &w, 1));

    cudaGraph_t child;
    CHECK(cudaGraphCreate(&child, 0));
    int *pa = p, three = 3, quarter = N / 4;
    void *cargs[] = {&pa, &three, &quarter};
    cudaKernelNodeParams kc = fill_node(cargs);
    cudaGraphNode_t k;
    CHECK(cudaGraphAddKernelNode(&k, child, nullptr, 0, &kc));
    CHECK(cudaGraphAddChildGraphNode(&e, g, &d, 1, child));
    CHECK(cudaGraphDestroy(child));
    static int replays = 0;
    cudaHostNodeParams hp = {};
    hp.fn = bump;
    hp.userData = &replays;
    cudaGraphNode_t hn;
    CHECK(cudaGraphAddHostNode(&hn, g, &e, 1, &hp));

    size_t count = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &count));
    printf("nodes: %zu\n", count);
    size_t ndeps = 0;
    CHECK(cudaGraphNodeGetDependencies(c, nullptr, nullptr, &ndeps));
    printf("the memcpy node waits for %zu nodes\n", ndeps);

    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    for (int round = 0; round < 2; round++) {
        CHECK(cudaMemset(p, 0, N * sizeof(int)));
        CHECK(cudaMemset(q, 0, N * sizeof(int)));
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaGraphLaunch(x, s));
        CHECK(cudaStreamSynchronize(s));
        check(p, q, 9, round == 0 ? "first launch" : "second launch");
    }

    nine = 7;
    kb = fill_node(args);
    CHECK(cudaGraphExecKernelNodeSetParams(x, b, &kb));
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    check(p, q, 7, "after cudaGraphExecKernelNodeSetParams");

    cudaGraph_t g2;
    CHECK(cudaGraphClone(&g2, g));
    cudaGraphNode_t b2;
    CHECK(cudaGraphNodeFindInClone(&b2, b, g2));
    nine = 8;
    kb = fill_node(args);
    CHECK(cudaGraphKernelNodeSetParams(b2, &kb));
    cudaGraphExecUpdateResultInfo info;
    CHECK(cudaGraphExecUpdate(x, g2, &info));
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    check(p, q, 8, "after cudaGraphExecUpdate");

    printf("the host node ran %d times in 4 launches\n", replays);
    EXPECT(replays == 4, "the host node ran %d times", replays);

    cudaGraphNode_t extra;
    CHECK(cudaGraphAddEmptyNode(&extra, g2, nullptr, 0));
    cudaError_t r = cudaGraphExecUpdate(x, g2, &info);
    printf("update from another shape: %s, result %d\n", cudaGetErrorName(r), (int)info.result);
    EXPECT(r == cudaErrorGraphExecUpdateFailure, "an update across shapes was not refused");
    (void)cudaGetLastError();

    CHECK(cudaGraphExecDestroy(x));
    CHECK(cudaGraphDestroy(g2));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaFree(p));
    CHECK(cudaFree(q));
    pass();
}
