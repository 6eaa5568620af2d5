// User objects: a host destructor that counts; cudaUserObjectRetain/Release by the caller;
// references moved (cudaGraphUserObjectMove) and retained into a graph; the destructor runs
// only once the graph, every executable graph instantiated from it, and their pending
// launches are gone (a launch held back by a host flag while all handles are destroyed);
// cudaGraphReleaseUserObject; a reference moved into a graph being captured. Destructors
// may run asynchronously on an internal thread, so the counter is polled (up to 2 s).
#include "rt_common.h"
#include <atomic>

static std::atomic<int> destroyed{0};
static std::atomic<unsigned> destroyed_mask{0};
static const char *const NAMES[] = {"A", "B", "C", "D", "E"};
static int ids[5] = {0, 1, 2, 3, 4};

static void CUDART_CB destroy_obj(void *p) {
    destroyed_mask |= 1u << *(int *)p;
    destroyed++;
}

// The counter and which objects are gone, after polling for `want` (up to 2 s); with
// want < 0, after a short pause (nothing is expected to change).
static int checkpoint(const char *what, int want) {
    if (want < 0) {
        host_sleep_us(20000);
    } else {
        uint64_t t0 = host_now_ns();
        while (destroyed.load() < want && host_now_ns() - t0 < 2000000000ull) host_sleep_us(1000);
    }
    int n = destroyed.load();
    unsigned m = destroyed_mask.load();
    printf("%s: destroyed %d (", what, n);
    const char *sep = "";
    for (int i = 0; i < 5; i++)
        if (m & (1u << i)) { printf("%s%s", sep, NAMES[i]); sep = " "; }
    printf(")\n");
    return n;
}

static cudaUserObject_t make(int id) {
    cudaUserObject_t o;
    CHECK(cudaUserObjectCreate(&o, &ids[id], destroy_obj, 1, cudaUserObjectNoDestructorSync));
    return o;
}

__global__ void touch(int *p) { *p += 1; }

int main() {
    int *flag_h, *flag_d, *seen;
    CHECK(cudaHostAlloc(&flag_h, 2 * sizeof(int), cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer((void **)&flag_d, flag_h, 0));
    flag_h[0] = 0;
    flag_h[1] = 0;
    seen = flag_d + 1;
    int *counter;
    CHECK(cudaMalloc(&counter, sizeof(int)));
    CHECK(cudaMemset(counter, 0, sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // A: references held by the caller only.
    cudaUserObject_t a = make(0);
    CHECK(cudaUserObjectRetain(a, 2));
    CHECK(cudaUserObjectRelease(a, 2));
    int n = checkpoint("A: created, retained 2, released 2", -1);
    EXPECT(n == 0, "A destroyed while referenced");
    CHECK(cudaUserObjectRelease(a));
    n = checkpoint("A: last reference released", 1);
    EXPECT(n == 1, "A not destroyed");

    // B moved into g, C retained by g and then released by the caller.
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaKernelNodeParams k = {};
    uint64_t timeout = 5000000000ull;
    int one = 1;
    void *args[] = {&flag_d, &one, &seen, &timeout};
    k.func = (void *)wait_flag;
    k.gridDim = dim3(1);
    k.blockDim = dim3(1);
    k.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, g, nullptr, 0, &k));
    cudaUserObject_t b = make(1), c = make(2);
    CHECK(cudaGraphRetainUserObject(g, b, 1, cudaGraphUserObjectMove));
    CHECK(cudaGraphRetainUserObject(g, c, 1, 0));
    CHECK(cudaUserObjectRelease(c));
    n = checkpoint("B moved into the graph, C retained by it and released by the caller", -1);
    EXPECT(n == 1, "B or C destroyed while the graph holds them");

    cudaGraphExec_t x1, x2;
    CHECK(cudaGraphInstantiate(&x1, g, 0));
    CHECK(cudaGraphInstantiate(&x2, g, 0));
    CHECK(cudaGraphLaunch(x1, s));  // waits for flag_h[0] == 1
    CHECK(cudaGraphDestroy(g));
    n = checkpoint("graph destroyed, two executable graphs left", -1);
    EXPECT(n == 1, "destroyed while executable graphs hold references");
    CHECK(cudaGraphExecDestroy(x2));
    n = checkpoint("second executable graph destroyed", -1);
    EXPECT(n == 1, "destroyed while an executable graph holds references");
    CHECK(cudaGraphExecDestroy(x1));
    n = checkpoint("first executable graph destroyed, its launch still waiting", -1);
    EXPECT(n == 1, "destroyed while a launch is pending");
    *(volatile int *)&flag_h[0] = 1;
    CHECK(cudaDeviceSynchronize());
    printf("the pending launch saw the flag: %s\n", yes_no(*(volatile int *)&flag_h[1] == 1));
    EXPECT(flag_h[1] == 1, "the launch did not wait for the flag");
    n = checkpoint("launch finished", 3);
    EXPECT(n == 3, "B and C not destroyed after the launch");

    // D: two graph references, released one at a time with cudaGraphReleaseUserObject.
    cudaGraph_t g2;
    CHECK(cudaGraphCreate(&g2, 0));
    CHECK(cudaGraphAddEmptyNode(&node, g2, nullptr, 0));
    cudaUserObject_t d = make(3);
    CHECK(cudaGraphRetainUserObject(g2, d, 2, 0));
    CHECK(cudaUserObjectRelease(d));
    CHECK(cudaGraphReleaseUserObject(g2, d, 1));
    n = checkpoint("D: graph holds 2, caller released its own, graph released 1", -1);
    EXPECT(n == 3, "D destroyed while the graph holds a reference");
    CHECK(cudaGraphReleaseUserObject(g2, d, 1));
    n = checkpoint("D: graph released its last reference", 4);
    EXPECT(n == 4, "D not destroyed");
    CHECK(cudaGraphDestroy(g2));

    // E: moved into the graph of a capture in progress.
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureStatus st;
    cudaGraph_t capg = nullptr;
    CHECK(cudaStreamGetCaptureInfo(s, &st, nullptr, &capg));
    cudaUserObject_t e = make(4);
    CHECK(cudaGraphRetainUserObject(capg, e, 1, cudaGraphUserObjectMove));
    touch<<<1, 1, 0, s>>>(counter);
    CHECK_LAUNCH();
    cudaGraph_t g3;
    CHECK(cudaStreamEndCapture(s, &g3));
    cudaGraphExec_t x3;
    CHECK(cudaGraphInstantiate(&x3, g3, 0));
    for (int i = 0; i < 3; i++) CHECK(cudaGraphLaunch(x3, s));
    CHECK(cudaGraphDestroy(g3));
    n = checkpoint("E: captured graph destroyed, executable graph left", -1);
    EXPECT(n == 4, "E destroyed while an executable graph holds it");
    CHECK(cudaGraphExecDestroy(x3));
    CHECK(cudaDeviceSynchronize());
    n = checkpoint("E: executable graph destroyed, launches finished", 5);
    EXPECT(n == 5, "E not destroyed");
    int hc = 0;
    CHECK(cudaMemcpy(&hc, counter, sizeof hc, cudaMemcpyDeviceToHost));
    printf("captured kernel ran %d times\n", hc);
    EXPECT(hc == 3, "captured kernel ran %d times", hc);

    n = checkpoint("end", 5);
    EXPECT(n == 5 && destroyed_mask.load() == 0x1f, "destructors ran %d times", n);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(counter));
    CHECK(cudaFreeHost(flag_h));
    pass();
}
