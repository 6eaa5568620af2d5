// Graph memory nodes: a capture of cudaMallocAsync, a kernel writing the buffer, a copy
// out of it and cudaFreeAsync, launched 5 times; the same built by hand with alloc and
// free nodes (their parameters read back); an allocation that outlives its graph (a
// relaunch refused while it is unfreed, then cudaGraphInstantiateFlagAutoFreeOnLaunch,
// the pointer read and freed by stream work after the graph); graph memory attributes
// and cudaDeviceGraphMemTrim.
#include "rt_common.h"
#include <vector>

static const int N = 1 << 16;
static const size_t BYTES = N * sizeof(uint32_t);

__device__ int launches;  // bumped by the graph of part (c)

__global__ void fill(uint32_t *p, int n, uint32_t seed) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = mix32(i, seed);
}

__global__ void accumulate(uint32_t *acc, const uint32_t *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += p[i];
}

__global__ void fill_launch(uint32_t *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = 3u * i + (uint32_t)launches;
}

__global__ void bump_launches() { launches++; }

// Node counts by type, in a fixed order (the order of cudaGraphGetNodes is not relied on).
// With `work_only`, only the kernel and memcpy nodes: omps makes the memory a capture
// allocates when the capture calls cudaMallocAsync, so a captured graph holds no memory
// nodes there (docs/design.md, section 7, lists this difference).
static void print_node_types(const char *what, cudaGraph_t g, bool work_only = false) {
    size_t n = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
    int kernel = 0, memcpy_ = 0, alloc = 0, free_ = 0, other = 0;
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType t;
        CHECK(cudaGraphNodeGetType(node, &t));
        if (t == cudaGraphNodeTypeKernel) kernel++;
        else if (t == cudaGraphNodeTypeMemcpy) memcpy_++;
        else if (t == cudaGraphNodeTypeMemAlloc) alloc++;
        else if (t == cudaGraphNodeTypeMemFree) free_++;
        else other++;
    }
    if (work_only) {
        printf("%s: %d kernel, %d memcpy nodes\n", what, kernel, memcpy_);
        return;
    }
    printf("%s: %zu nodes: %d kernel, %d memcpy, %d alloc, %d free, %d other\n", what, n, kernel,
           memcpy_, alloc, free_, other);
}

// copy == mix32(i, seed) and acc == reps * mix32(i, seed) everywhere.
static void check_results(const char *what, const uint32_t *copy, const uint32_t *acc,
                          uint32_t seed, uint32_t reps) {
    std::vector<uint32_t> hc(N), ha(N);
    CHECK(cudaMemcpy(hc.data(), copy, BYTES, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(ha.data(), acc, BYTES, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += hc[i] != mix32(i, seed) || ha[i] != reps * mix32(i, seed);
    printf("%s: copy checksum %08x, accumulated checksum %08x, %s\n", what,
           fnv1a(hc.data(), BYTES), fnv1a(ha.data(), BYTES), bad == 0 ? "all as expected" : "WRONG");
    EXPECT(bad == 0, "%s: %d values wrong", what, bad);
}

static cudaKernelNodeParams kernel_node(void *func, void **args) {
    cudaKernelNodeParams k = {};
    k.func = func;
    k.gridDim = dim3(N / 256);
    k.blockDim = dim3(256);
    k.kernelParams = args;
    return k;
}

int main() {
    int dev = 0;
    CHECK(cudaSetDevice(dev));
    int pools = 0;
    CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev));
    printf("memory pools supported: %s\n", yes_no(pools != 0));
    EXPECT(pools != 0, "no memory pool support");
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint32_t *copy, *acc;
    CHECK(cudaMalloc(&copy, BYTES));
    CHECK(cudaMalloc(&acc, BYTES));

    // (a) Captured: alloc, fill, copy out, accumulate, free.
    {
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        uint32_t *buf = nullptr;
        CHECK(cudaMallocAsync((void **)&buf, BYTES, s));
        fill<<<N / 256, 256, 0, s>>>(buf, N, 11);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(copy, buf, BYTES, cudaMemcpyDeviceToDevice, s));
        accumulate<<<N / 256, 256, 0, s>>>(acc, buf, N);
        CHECK_LAUNCH();
        CHECK(cudaFreeAsync(buf, s));
        cudaGraph_t g;
        CHECK(cudaStreamEndCapture(s, &g));
        print_node_types("captured graph", g, true);
        cudaGraphExec_t x;
        CHECK(cudaGraphInstantiate(&x, g, 0));
        CHECK(cudaMemset(copy, 0, BYTES));
        CHECK(cudaMemset(acc, 0, BYTES));
        CHECK(cudaDeviceSynchronize());
        for (int r = 0; r < 5; r++) CHECK(cudaGraphLaunch(x, s));
        CHECK(cudaStreamSynchronize(s));
        check_results("captured, 5 launches", copy, acc, 11, 5);
        CHECK(cudaGraphExecDestroy(x));
        CHECK(cudaGraphDestroy(g));
    }

    // (b) By hand: alloc node -> fill -> memcpy node -> accumulate -> free node.
    {
        cudaGraph_t g;
        CHECK(cudaGraphCreate(&g, 0));
        cudaMemAllocNodeParams ap = {};
        ap.poolProps.allocType = cudaMemAllocationTypePinned;
        ap.poolProps.handleTypes = cudaMemHandleTypeNone;
        ap.poolProps.location.type = cudaMemLocationTypeDevice;
        ap.poolProps.location.id = dev;
        ap.bytesize = BYTES;
        cudaGraphNode_t na, nf, nc, nk, nfree;
        CHECK(cudaGraphAddMemAllocNode(&na, g, nullptr, 0, &ap));
        uint32_t *buf = (uint32_t *)ap.dptr;
        printf("alloc node returned an address: %s\n", yes_no(buf != nullptr));
        EXPECT(buf != nullptr, "no address from the alloc node");
        int n = N;
        uint32_t seed = 22;
        void *fargs[] = {&buf, &n, &seed};
        cudaKernelNodeParams kf = kernel_node((void *)fill, fargs);
        CHECK(cudaGraphAddKernelNode(&nf, g, &na, 1, &kf));
        CHECK(cudaGraphAddMemcpyNode1D(&nc, g, &nf, 1, copy, buf, BYTES, cudaMemcpyDeviceToDevice));
        void *aargs[] = {&acc, &buf, &n};
        cudaKernelNodeParams ka = kernel_node((void *)accumulate, aargs);
        CHECK(cudaGraphAddKernelNode(&nk, g, &nc, 1, &ka));
        CHECK(cudaGraphAddMemFreeNode(&nfree, g, &nk, 1, buf));
        print_node_types("hand-built graph", g);

        cudaMemAllocNodeParams back = {};
        CHECK(cudaGraphMemAllocNodeGetParams(na, &back));
        printf("alloc node params: %zu bytes, type %d, location type %d id %d, same address: %s\n",
               back.bytesize, (int)back.poolProps.allocType, (int)back.poolProps.location.type,
               back.poolProps.location.id, yes_no(back.dptr == buf));
        EXPECT(back.bytesize == BYTES && back.dptr == buf, "alloc node params differ");
        void *freed = nullptr;
        CHECK(cudaGraphMemFreeNodeGetParams(nfree, &freed));
        printf("free node frees the allocation: %s\n", yes_no(freed == buf));
        EXPECT(freed == buf, "free node params differ");

        cudaGraphExec_t x;
        CHECK(cudaGraphInstantiate(&x, g, 0));
        CHECK(cudaMemset(copy, 0, BYTES));
        CHECK(cudaMemset(acc, 0, BYTES));
        CHECK(cudaDeviceSynchronize());
        for (int r = 0; r < 5; r++) CHECK(cudaGraphLaunch(x, s));
        CHECK(cudaStreamSynchronize(s));
        check_results("hand-built, 5 launches", copy, acc, 22, 5);
        CHECK(cudaGraphExecDestroy(x));
        CHECK(cudaGraphDestroy(g));
    }

    // (c) An allocation that outlives the graph: alloc -> fill_launch -> bump, no free node.
    {
        int zero = 0;
        CHECK(cudaMemcpyToSymbol(launches, &zero, sizeof zero));
        cudaGraph_t g;
        CHECK(cudaGraphCreate(&g, 0));
        cudaMemAllocNodeParams ap = {};
        ap.poolProps.allocType = cudaMemAllocationTypePinned;
        ap.poolProps.location.type = cudaMemLocationTypeDevice;
        ap.poolProps.location.id = dev;
        ap.bytesize = BYTES;
        cudaGraphNode_t na, nf, nb;
        CHECK(cudaGraphAddMemAllocNode(&na, g, nullptr, 0, &ap));
        uint32_t *p = (uint32_t *)ap.dptr;
        int n = N;
        void *fargs[] = {&p, &n};
        cudaKernelNodeParams kf = kernel_node((void *)fill_launch, fargs);
        CHECK(cudaGraphAddKernelNode(&nf, g, &na, 1, &kf));
        cudaKernelNodeParams kb = {};
        kb.func = (void *)bump_launches;
        kb.gridDim = dim3(1);
        kb.blockDim = dim3(1);
        kb.kernelParams = nullptr;  // no parameters
        CHECK(cudaGraphAddKernelNode(&nb, g, &nf, 1, &kb));
        print_node_types("graph without a free node", g);

        std::vector<uint32_t> h(N);
        auto check_p = [&](const char *what, uint32_t launch) {
            // Stream work after the launch may use the allocation until it is freed.
            CHECK(cudaMemcpyAsync(h.data(), p, BYTES, cudaMemcpyDeviceToHost, s));
            CHECK(cudaStreamSynchronize(s));
            int bad = 0;
            for (int i = 0; i < N; i++) bad += h[i] != 3u * i + launch;
            printf("%s: checksum %08x, %s\n", what, fnv1a(h.data(), BYTES),
                   bad == 0 ? "all as expected" : "WRONG");
            EXPECT(bad == 0, "%s: %d values wrong", what, bad);
        };

        // Without AutoFreeOnLaunch a relaunch is refused while the allocation is unfreed.
        cudaGraphExec_t x;
        CHECK(cudaGraphInstantiate(&x, g, 0));
        CHECK(cudaGraphLaunch(x, s));
        check_p("plain instantiation, launch 1", 0);
        cudaError_t r = report_err("relaunch with the allocation unfreed", cudaGraphLaunch(x, s));
        EXPECT(r == cudaErrorInvalidValue, "the relaunch was not refused");
        CHECK(cudaFreeAsync(p, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaGraphLaunch(x, s));
        check_p("plain instantiation, relaunch after cudaFreeAsync", 1);
        CHECK(cudaFreeAsync(p, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaGraphExecDestroy(x));

        CHECK(cudaGraphInstantiate(&x, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
        CHECK(cudaGraphLaunch(x, s));
        check_p("auto-free instantiation, launch 1", 2);

        // (d) While a graph allocation is live, graph memory is in use.
        size_t used = 0, high = 0;
        CHECK(cudaDeviceGetGraphMemAttribute(dev, cudaGraphMemAttrUsedMemCurrent, &used));
        CHECK(cudaDeviceGetGraphMemAttribute(dev, cudaGraphMemAttrUsedMemHigh, &high));
        printf("graph memory in use while the allocation is live: %s\n", used ? "nonzero" : "zero");
        printf("high watermark covers the allocation: %s\n", yes_no(high >= BYTES));
        EXPECT(used != 0 && high >= BYTES, "graph memory attributes too small");

        CHECK(cudaGraphLaunch(x, s));  // frees the previous launch's allocation first
        check_p("auto-free instantiation, launch 2", 3);
        CHECK(cudaFreeAsync(p, s));
        CHECK(cudaStreamSynchronize(s));
        int lh = 0;
        CHECK(cudaMemcpyFromSymbol(&lh, launches, sizeof lh));
        printf("graph launches that ran: %d\n", lh);
        EXPECT(lh == 4, "%d launches ran", lh);
        CHECK(cudaGraphExecDestroy(x));
        CHECK(cudaGraphDestroy(g));
    }

    CHECK(cudaDeviceSynchronize());
    CHECK(cudaDeviceGraphMemTrim(dev));
    puts("cudaDeviceGraphMemTrim: cudaSuccess");
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(copy));
    CHECK(cudaFree(acc));
    pass();
}
