// Direct peer access between GPUs, as a program that uses two of them sees it: what
// cudaDeviceCanAccessPeer and cudaDeviceGetP2PAttribute say, enabling (twice: the second
// is cudaErrorPeerAccessAlreadyEnabled) and disabling (twice: cudaErrorPeerAccessNotEnabled),
// kernels on one GPU that write and read the other's memory directly, peer copies in both
// directions, and memory freed and allocated again on one GPU while the other GPU's kernels
// keep reaching into it. With fewer than two devices it says so and passes.
#include "rt_common.h"

__global__ void fill_remote(unsigned *remote, int n, unsigned salt) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        remote[i] = mix32(i, salt);
}

__global__ void sum_remote(const unsigned *remote, int n, unsigned long long *out) {
    unsigned long long acc = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        acc += remote[i];
    atomicAdd(out, acc);
}

static unsigned long long expected_sum(int n, unsigned salt) {
    unsigned long long s = 0;
    for (int i = 0; i < n; i++) s += mix32(i, salt);
    return s;
}

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    if (count < 2) {
        printf("devices: %d (peer access needs two)\n", count);
        pass();
    }
    printf("devices: %d\n", count);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            if (a == b) continue;
            int can = -1;
            CHECK(cudaDeviceCanAccessPeer(&can, a, b));
            printf("can access %d -> %d: %s\n", a, b, yes_no(can));
            const cudaDeviceP2PAttr attrs[] = {cudaDevP2PAttrPerformanceRank,
                                               cudaDevP2PAttrAccessSupported,
                                               cudaDevP2PAttrNativeAtomicSupported,
                                               cudaDevP2PAttrCudaArrayAccessSupported};
            const char *names[] = {"performance rank", "access", "native atomics", "array access"};
            for (int k = 0; k < 4; k++) {
                int v = -1;
                CHECK(cudaDeviceGetP2PAttribute(&v, attrs[k], a, b));
                printf("  p2p %s: %d\n", names[k], v);
            }
        }
    int can01 = 0, can10 = 0;
    CHECK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CHECK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    int v = 0;
    report_err("p2p attribute of a device with itself",
               cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrAccessSupported, 0, 0));
    CHECK(cudaSetDevice(0));
    report_err("disable before enable", cudaDeviceDisablePeerAccess(1));
    report_err("enable with flags", cudaDeviceEnablePeerAccess(1, 1));
    report_err("enable the device itself", cudaDeviceEnablePeerAccess(0, 0));
    if (!can01 || !can10) {
        report_err("enable 0 -> 1", cudaDeviceEnablePeerAccess(1, 0));
        pass();
    }
    CHECK(cudaDeviceEnablePeerAccess(1, 0));
    report_err("enable 0 -> 1 again", cudaDeviceEnablePeerAccess(1, 0));
    CHECK(cudaSetDevice(1));
    CHECK(cudaDeviceEnablePeerAccess(0, 0));

    const int n = 1 << 22;
    const size_t bytes = n * sizeof(unsigned);
    unsigned *on0 = 0, *on1 = 0;
    unsigned long long *sum0 = 0, *sum1 = 0, got = 0;
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&on0, bytes));
    CHECK(cudaMalloc(&sum0, sizeof(*sum0)));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&on1, bytes));
    CHECK(cudaMalloc(&sum1, sizeof(*sum1)));

    // GPU 0's kernel writes GPU 1's memory; GPU 1's kernel reads it back locally and GPU
    // 0's reads it remotely.
    CHECK(cudaSetDevice(0));
    fill_remote<<<264, 256>>>(on1, n, 7);
    CHECK_LAUNCH();
    CHECK(cudaMemset(sum0, 0, sizeof(*sum0)));
    sum_remote<<<264, 256>>>(on1, n, sum0);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(&got, sum0, sizeof(got), cudaMemcpyDeviceToHost));
    EXPECT(got == expected_sum(n, 7), "GPU 0 reading GPU 1's memory: %llx", got);
    printf("kernel on 0 wrote and read 1's memory: ok\n");
    CHECK(cudaSetDevice(1));
    CHECK(cudaMemset(sum1, 0, sizeof(*sum1)));
    sum_remote<<<264, 256>>>(on1, n, sum1);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(&got, sum1, sizeof(got), cudaMemcpyDeviceToHost));
    EXPECT(got == expected_sum(n, 7), "GPU 1 reading what GPU 0 wrote: %llx", got);
    printf("kernel on 1 read what 0 wrote: ok\n");

    // Peer copies both ways, then a kernel on 1 reads 0's copy in place.
    CHECK(cudaMemcpyPeer(on0, 0, on1, 1, bytes));
    CHECK(cudaSetDevice(1));
    fill_remote<<<264, 256>>>(on1, n, 11);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMemset(sum1, 0, sizeof(*sum1)));
    sum_remote<<<264, 256, 0, s>>>(on0, n, sum1);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(&got, sum1, sizeof(got), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(got == expected_sum(n, 7), "GPU 1 reading 0's peer copy: %llx", got);
    CHECK(cudaMemcpyPeerAsync(on0, 0, on1, 1, bytes, s));
    CHECK(cudaMemset(sum1, 0, sizeof(*sum1)));
    sum_remote<<<264, 256, 0, s>>>(on0, n, sum1);
    CHECK(cudaMemcpyAsync(&got, sum1, sizeof(got), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(got == expected_sum(n, 11), "after an async peer copy: %llx", got);
    printf("peer copies both ways, read in place: ok\n");

    // Free and allocate on 0 while 1's kernels keep reading 0's memory: every round's
    // buffer holds its own values when 1 reads it.
    for (int round = 0; round < 20; round++) {
        unsigned *tmp = 0;
        CHECK(cudaSetDevice(0));
        CHECK(cudaMalloc(&tmp, bytes));
        fill_remote<<<264, 256>>>(tmp, n, 100 + round);
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaSetDevice(1));
        CHECK(cudaMemsetAsync(sum1, 0, sizeof(*sum1), s));
        sum_remote<<<264, 256, 0, s>>>(tmp, n, sum1);
        CHECK(cudaMemcpyAsync(&got, sum1, sizeof(got), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        EXPECT(got == expected_sum(n, 100 + round), "round %d: %llx", round, got);
        CHECK(cudaSetDevice(0));
        CHECK(cudaFree(tmp));
    }
    printf("20 rounds of allocate on 0, read from 1, free: ok\n");

    CHECK(cudaSetDevice(1));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaDeviceDisablePeerAccess(0));
    report_err("disable 1 -> 0 again", cudaDeviceDisablePeerAccess(0));
    CHECK(cudaFree(on1));
    CHECK(cudaFree(sum1));
    CHECK(cudaSetDevice(0));
    CHECK(cudaDeviceDisablePeerAccess(1));
    CHECK(cudaFree(on0));
    CHECK(cudaFree(sum0));
    pass();
}
