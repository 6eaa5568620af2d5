// Conditional graph nodes (CUDA 12.4+): handles from cudaGraphConditionalHandleCreate; an
// IF node with an else body, a WHILE node and an IF node driven by a handle's default
// value, all added with cudaGraphAddNode and their body graphs (phGraph_out) filled with
// kernel nodes. A kernel before them sets the IF and WHILE conditions from a device input
// (cudaGraphSetConditional on the device); the WHILE body counts a device counter down
// and clears its condition at zero. Launched with several inputs, results read back.
// Then what the driver allows after: new parameters in the executable graph and by an
// update, and a second instantiation (each outcome printed, to match native).
#include "rt_common.h"
#include <vector>

struct Input {
    int flag;  // selects the IF body (nonzero) or the else body
    int n;     // WHILE iterations
};

struct State {
    int counter, iterations, sum, then_ran, else_ran, default_ran, value;
    int total_iterations;  // over all launches (not reset by prep)
};

__global__ void prep(cudaGraphConditionalHandle hif, cudaGraphConditionalHandle hwhile, const Input *in,
                     State *st) {
    st->counter = in->n;
    st->iterations = st->sum = st->then_ran = st->else_ran = st->default_ran = 0;
    st->value = 0;
    cudaGraphSetConditional(hif, in->flag != 0);
    cudaGraphSetConditional(hwhile, in->n > 0);
}

__global__ void then_body(State *st, const Input *in) {
    st->then_ran++;
    st->value = in->n * 100;
}

__global__ void else_body(State *st) {
    st->else_ran++;
    st->value = -1;
}

__global__ void loop_body(cudaGraphConditionalHandle hwhile, State *st) {
    st->sum += st->counter;
    st->counter--;
    st->iterations++;
    st->total_iterations++;
    cudaGraphSetConditional(hwhile, st->counter > 0);
}

__global__ void default_body(State *st) { st->default_ran++; }

static cudaGraphNode_t add_kernel(cudaGraph_t g, const cudaGraphNode_t *dep, void *func, void **args) {
    cudaKernelNodeParams k = {};
    k.func = func;
    k.gridDim = dim3(1);
    k.blockDim = dim3(1);
    k.kernelParams = args;
    cudaGraphNode_t n;
    CHECK(cudaGraphAddKernelNode(&n, g, dep, dep ? 1 : 0, &k));
    return n;
}

// Adds a conditional node after dep; returns its body graphs through bodies.
static cudaGraphNode_t add_conditional(cudaGraph_t g, cudaGraphNode_t dep, cudaGraphConditionalHandle h,
                                       cudaGraphConditionalNodeType type, unsigned size, cudaGraph_t *bodies) {
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = type;
    p.conditional.size = size;
    cudaGraphNode_t n;
    CHECK(cudaGraphAddNode(&n, g, &dep, nullptr, 1, &p));
    for (unsigned i = 0; i < size; i++) bodies[i] = p.conditional.phGraph_out[i];
    return n;
}

static size_t node_count(cudaGraph_t g) {
    size_t n = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &n));
    return n;
}

int main() {
    Input *in;
    State *st;
    CHECK(cudaMalloc(&in, sizeof(Input)));
    CHECK(cudaMalloc(&st, sizeof(State)));
    CHECK(cudaMemset(st, 0, sizeof(State)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle hif, hwhile, hdef;
    CHECK(cudaGraphConditionalHandleCreate(&hif, g, 0, 0));
    CHECK(cudaGraphConditionalHandleCreate(&hwhile, g, 0, 0));
    CHECK(cudaGraphConditionalHandleCreate(&hdef, g, 1, cudaGraphCondAssignDefault));

    void *prep_args[] = {&hif, &hwhile, &in, &st};
    cudaGraphNode_t nprep = add_kernel(g, nullptr, (void *)prep, prep_args);
    cudaGraph_t ifb[2], whileb[1], defb[1];
    cudaGraphNode_t nif = add_conditional(g, nprep, hif, cudaGraphCondTypeIf, 2, ifb);
    void *then_args[] = {&st, &in};
    add_kernel(ifb[0], nullptr, (void *)then_body, then_args);
    void *st_args[] = {&st};
    add_kernel(ifb[1], nullptr, (void *)else_body, st_args);
    cudaGraphNode_t nwhile = add_conditional(g, nif, hwhile, cudaGraphCondTypeWhile, 1, whileb);
    void *loop_args[] = {&hwhile, &st};
    add_kernel(whileb[0], nullptr, (void *)loop_body, loop_args);
    cudaGraphNode_t ndef = add_conditional(g, nwhile, hdef, cudaGraphCondTypeIf, 1, defb);
    add_kernel(defb[0], nullptr, (void *)default_body, st_args);

    cudaGraphNodeType t1, t2;
    CHECK(cudaGraphNodeGetType(nif, &t1));
    CHECK(cudaGraphNodeGetType(ndef, &t2));
    printf("graph: %zu nodes, conditional node types %d %d, body nodes: then %zu, else %zu, while %zu, default %zu\n",
           node_count(g), (int)t1, (int)t2, node_count(ifb[0]), node_count(ifb[1]), node_count(whileb[0]),
           node_count(defb[0]));

    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));

    const Input inputs[] = {{1, 5}, {0, 3}, {1, 0}, {0, 10}, {7, 1}, {0, 0}};
    int total = 0;
    int k = 0;
    for (const Input &hin : inputs) {
        CHECK(cudaMemcpy(in, &hin, sizeof hin, cudaMemcpyHostToDevice));
        CHECK(cudaGraphLaunch(x, s));
        CHECK(cudaStreamSynchronize(s));
        State h;
        CHECK(cudaMemcpy(&h, st, sizeof h, cudaMemcpyDeviceToHost));
        total += hin.n;
        printf("launch %d (flag %d, n %d): then %d, else %d, value %d, iterations %d, sum %d, counter %d, "
               "default body %d, total iterations %d\n",
               ++k, hin.flag, hin.n, h.then_ran, h.else_ran, h.value, h.iterations, h.sum, h.counter,
               h.default_ran, h.total_iterations);
        bool ok = h.then_ran == (hin.flag != 0) && h.else_ran == (hin.flag == 0) &&
                  h.value == (hin.flag ? hin.n * 100 : -1) && h.iterations == hin.n &&
                  h.sum == hin.n * (hin.n + 1) / 2 && h.counter == 0 && h.default_ran == 1 &&
                  h.total_iterations == total;
        EXPECT(ok, "launch %d: unexpected state", k);
    }

    // Back to back, without synchronizing in between.
    Input hin = {1, 4};
    CHECK(cudaMemcpy(in, &hin, sizeof hin, cudaMemcpyHostToDevice));
    for (int i = 0; i < 3; i++) CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    State h;
    CHECK(cudaMemcpy(&h, st, sizeof h, cudaMemcpyDeviceToHost));
    total += 3 * hin.n;
    printf("3 launches back to back (flag 1, n 4): value %d, sum %d, total iterations %d\n", h.value, h.sum,
           h.total_iterations);
    EXPECT(h.value == 400 && h.sum == 10 && h.total_iterations == total, "back-to-back launches wrong");

    // Changed parameters: of the node that sets the conditions, in the executable graph,
    // and by an update from the graph; then of a node inside a body.
    Input *in2;
    CHECK(cudaMalloc(&in2, sizeof(Input)));
    Input hin2 = {0, 2};
    CHECK(cudaMemcpy(in2, &hin2, sizeof hin2, cudaMemcpyHostToDevice));
    void *prep2_args[] = {&hif, &hwhile, &in2, &st};
    cudaKernelNodeParams kp2 = {};
    kp2.func = (void *)prep;
    kp2.gridDim = dim3(1);
    kp2.blockDim = dim3(1);
    kp2.kernelParams = prep2_args;
    cudaError_t r = cudaGraphExecKernelNodeSetParams(x, nprep, &kp2);
    printf("exec set params of the prep node: %s\n", cudaGetErrorName(r));
    if (r == cudaSuccess) {
        CHECK(cudaGraphLaunch(x, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(&h, st, sizeof h, cudaMemcpyDeviceToHost));
        printf("  then launched (flag 0, n 2): value %d, sum %d\n", h.value, h.sum);
    }
    CHECK(cudaGraphKernelNodeSetParams(nprep, &kp2));
    cudaGraphExecUpdateResultInfo info = {};
    r = cudaGraphExecUpdate(x, g, &info);
    printf("exec update from the graph: %s (result %d)\n", cudaGetErrorName(r), (int)info.result);
    if (r == cudaSuccess) {
        hin2 = {1, 3};
        CHECK(cudaMemcpy(in2, &hin2, sizeof hin2, cudaMemcpyHostToDevice));
        CHECK(cudaGraphLaunch(x, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(&h, st, sizeof h, cudaMemcpyDeviceToHost));
        printf("  then launched (flag 1, n 3): value %d, sum %d\n", h.value, h.sum);
    }
    size_t nbody = 1;
    cudaGraphNode_t then_node;
    CHECK(cudaGraphGetNodes(ifb[0], &then_node, &nbody));
    void *else_args[] = {&st};
    cudaKernelNodeParams kb = {};
    kb.func = (void *)else_body;
    kb.gridDim = dim3(1);
    kb.blockDim = dim3(1);
    kb.kernelParams = else_args;
    r = cudaGraphExecKernelNodeSetParams(x, then_node, &kb);
    printf("exec set params of a node in a body: %s\n", cudaGetErrorName(r));
    // A second executable graph of the same graph.
    cudaGraphExec_t x2;
    r = cudaGraphInstantiate(&x2, g, 0);
    printf("second instantiation: %s\n", cudaGetErrorName(r));
    if (r == cudaSuccess) CHECK(cudaGraphExecDestroy(x2));

    CHECK(cudaGraphExecDestroy(x));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(in));
    CHECK(cudaFree(in2));
    CHECK(cudaFree(st));
    pass();
}
