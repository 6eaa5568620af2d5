// Conditional nodes made during a stream capture, as the CUDA guide shows and PyTorch's
// CUDAGraph does for torch.cond: the capture's graph and dependencies from
// cudaStreamGetCaptureInfo, a handle made on that graph, the node added with
// cudaGraphAddNode, the stream moved past it with cudaStreamUpdateCaptureDependencies,
// and each body captured on a second stream with cudaStreamBeginCaptureToGraph. An IF
// node (with an else body) picks by a device flag; a WHILE node counts down. Replayed
// with several inputs.
#include "rt_common.h"

__global__ void set_if(cudaGraphConditionalHandle h, const int *flag) { cudaGraphSetConditional(h, *flag != 0); }
__global__ void set_while(cudaGraphConditionalHandle h, const int *n) { cudaGraphSetConditional(h, *n > 0); }
__global__ void add(int *out, int v) { *out += v; }
__global__ void countdown(cudaGraphConditionalHandle h, int *n, int *out) {
    *out += 10;
    *n -= 1;
    cudaGraphSetConditional(h, *n > 0);
}

// Adds a conditional node where stream s's capture stands; returns its bodies.
static void conditional(cudaStream_t s, cudaGraphConditionalHandle h, cudaGraphConditionalNodeType type,
                        unsigned size, cudaGraph_t *bodies) {
    cudaStreamCaptureStatus status;
    cudaGraph_t graph;
    const cudaGraphNode_t *deps;
    size_t ndeps;
    CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, nullptr, &ndeps));
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = type;
    p.conditional.size = size;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddNode(&node, graph, deps, nullptr, ndeps, &p));
    CHECK(cudaStreamUpdateCaptureDependencies(s, &node, nullptr, 1, cudaStreamSetCaptureDependencies));
    for (unsigned i = 0; i < size; i++) bodies[i] = p.conditional.phGraph_out[i];
}

int main() {
    int *flag, *n, *out;
    CHECK(cudaMalloc(&flag, sizeof(int)));
    CHECK(cudaMalloc(&n, sizeof(int)));
    CHECK(cudaMalloc(&out, sizeof(int)));
    cudaStream_t s, body;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&body, cudaStreamNonBlocking));

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureStatus status;
    cudaGraph_t capturing;
    CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, &capturing, nullptr, nullptr, nullptr));
    cudaGraphConditionalHandle hif, hwhile;
    CHECK(cudaGraphConditionalHandleCreate(&hif, capturing, 0, 0));
    CHECK(cudaGraphConditionalHandleCreate(&hwhile, capturing, 0, 0));
    cudaMemsetAsync(out, 0, sizeof(int), s);
    set_if<<<1, 1, 0, s>>>(hif, flag);
    cudaGraph_t ifb[2];
    conditional(s, hif, cudaGraphCondTypeIf, 2, ifb);
    CHECK(cudaStreamBeginCaptureToGraph(body, ifb[0], nullptr, nullptr, 0, cudaStreamCaptureModeRelaxed));
    add<<<1, 1, 0, body>>>(out, 1);
    cudaGraph_t ended;
    CHECK(cudaStreamEndCapture(body, &ended));
    printf("a body capture ends in its body graph: %s\n", ended == ifb[0] ? "yes" : "no");
    CHECK(cudaStreamBeginCaptureToGraph(body, ifb[1], nullptr, nullptr, 0, cudaStreamCaptureModeRelaxed));
    add<<<1, 1, 0, body>>>(out, 2);
    CHECK(cudaStreamEndCapture(body, &ended));
    set_while<<<1, 1, 0, s>>>(hwhile, n);
    cudaGraph_t wb;
    conditional(s, hwhile, cudaGraphCondTypeWhile, 1, &wb);
    CHECK(cudaStreamBeginCaptureToGraph(body, wb, nullptr, nullptr, 0, cudaStreamCaptureModeRelaxed));
    countdown<<<1, 1, 0, body>>>(hwhile, n, out);
    CHECK(cudaStreamEndCapture(body, &ended));
    add<<<1, 1, 0, s>>>(out, 100);
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(s, &g));
    size_t count = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &count));
    printf("captured graph: %zu nodes\n", count);

    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    const int inputs[][2] = {{1, 0}, {0, 3}, {5, 1}, {0, 0}};
    for (auto &in : inputs) {
        CHECK(cudaMemcpy(flag, &in[0], sizeof(int), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(n, &in[1], sizeof(int), cudaMemcpyHostToDevice));
        CHECK(cudaGraphLaunch(x, s));
        CHECK(cudaStreamSynchronize(s));
        int r = 0;
        CHECK(cudaMemcpy(&r, out, sizeof r, cudaMemcpyDeviceToHost));
        int want = (in[0] ? 1 : 2) + 10 * in[1] + 100;
        printf("flag %d, n %d: out %d\n", in[0], in[1], r);
        EXPECT(r == want, "flag %d n %d: got %d, want %d", in[0], in[1], r, want);
    }
    CHECK(cudaGraphExecDestroy(x));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaStreamDestroy(body));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(flag));
    CHECK(cudaFree(n));
    CHECK(cudaFree(out));
    pass();
}
