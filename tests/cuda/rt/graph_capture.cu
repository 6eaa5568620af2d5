// Stream capture and graphs: a fork-join capture over two streams (kernels, a memset, a
// device-to-device copy), instantiated and launched many times, with results checked on
// the host; a capture invalidated by a synchronize; capture status and ids; a graph
// launched on another stream; relaxed, thread-local and global modes.
#include "rt_common.h"
#include <vector>

__global__ void axpb(float *x, int n, float a, float b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i] + b;
}

__global__ void add(float *y, const float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

int main() {
    const int n = 1 << 16;
    const size_t bytes = n * sizeof(float);
    float *x, *y, *z;
    CHECK(cudaMalloc(&x, bytes));
    CHECK(cudaMalloc(&y, bytes));
    CHECK(cudaMalloc(&z, bytes));
    CHECK(cudaMemset(x, 0, bytes));
    CHECK(cudaMemset(y, 0, bytes));
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

    cudaStreamCaptureStatus st;
    unsigned long long id = 0;
    CHECK(cudaStreamIsCapturing(s1, &st));
    printf("before capture: %d\n", (int)st);

    for (int mode : {cudaStreamCaptureModeRelaxed, cudaStreamCaptureModeThreadLocal,
                     cudaStreamCaptureModeGlobal}) {
        CHECK(cudaStreamBeginCapture(s1, (cudaStreamCaptureMode)mode));
        CHECK(cudaStreamGetCaptureInfo(s1, &st, &id));
        printf("mode %d capturing: %d, id set: %s\n", mode, (int)st, yes_no(id != 0));
        CHECK(cudaEventRecord(fork, s1));
        CHECK(cudaStreamWaitEvent(s2, fork, 0));
        CHECK(cudaStreamIsCapturing(s2, &st));
        printf("forked stream capturing: %d\n", (int)st);
        axpb<<<n / 256, 256, 0, s1>>>(x, n, 1.0f, 1.0f);      // x += 1
        CHECK_LAUNCH();
        CHECK(cudaMemsetAsync(z, 0, bytes, s2));
        axpb<<<n / 256, 256, 0, s2>>>(z, n, 0.0f, 2.0f);      // z = 2
        CHECK_LAUNCH();
        CHECK(cudaEventRecord(join, s2));
        CHECK(cudaStreamWaitEvent(s1, join, 0));
        add<<<n / 256, 256, 0, s1>>>(y, x, n);                // y += x
        CHECK_LAUNCH();
        add<<<n / 256, 256, 0, s1>>>(y, z, n);                // y += 2
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(z, y, bytes, cudaMemcpyDeviceToDevice, s1));
        cudaGraph_t g;
        CHECK(cudaStreamEndCapture(s1, &g));
        CHECK(cudaStreamIsCapturing(s1, &st));
        printf("after capture: %d\n", (int)st);
        size_t nodes = 0;
        CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
        printf("nodes: %zu\n", nodes);
        cudaGraphExec_t e;
        CHECK(cudaGraphInstantiate(&e, g, 0));
        CHECK(cudaMemset(x, 0, bytes));
        CHECK(cudaMemset(y, 0, bytes));
        const int reps = 10;
        for (int r = 0; r < reps; r++) CHECK(cudaGraphLaunch(e, r % 2 ? s2 : s1));
        CHECK(cudaDeviceSynchronize());
        // After k launches: x = k, y = sum(1..k) + 2k.
        std::vector<float> hy(n), hz(n);
        CHECK(cudaMemcpy(hy.data(), y, bytes, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(hz.data(), z, bytes, cudaMemcpyDeviceToHost));
        const float want = reps * (reps + 1) / 2.0f + 2.0f * reps;
        int bad = 0;
        for (int i = 0; i < n; i++) bad += hy[i] != want || hz[i] != want;
        printf("mode %d: y = z = %.0f everywhere: %s\n", mode, want, yes_no(bad == 0));
        EXPECT(bad == 0, "%d wrong values", bad);
        CHECK(cudaGraphExecDestroy(e));
        CHECK(cudaGraphDestroy(g));
    }

    // A synchronize during capture is illegal and invalidates it.
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeRelaxed));
    axpb<<<1, 32, 0, s1>>>(x, 32, 1.0f, 1.0f);
    cudaError_t e1 = cudaStreamSynchronize(s1);
    printf("synchronize while capturing: %s\n", cudaGetErrorName(e1));
    CHECK(cudaStreamIsCapturing(s1, &st));
    printf("status after it: %d\n", (int)st);
    cudaGraph_t g2 = nullptr;
    cudaError_t e2 = cudaStreamEndCapture(s1, &g2);
    printf("end capture: %s\n", cudaGetErrorName(e2));
    (void)cudaGetLastError();
    CHECK(cudaStreamIsCapturing(s1, &st));
    printf("status after end: %d\n", (int)st);
    CHECK(cudaDeviceSynchronize());
    puts("PASS");
    return 0;
}
