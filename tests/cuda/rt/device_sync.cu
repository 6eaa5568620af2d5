// cudaDeviceSynchronize waits for every stream, non-blocking ones included:
// kernels on 8 streams and the legacy stream write mapped host memory after
// different sleeps; after one cudaDeviceSynchronize the host reads it directly.
// Also cudaDeviceSetLimit / cudaDeviceGetLimit round trips.
#include "rt_common.h"

__global__ void late_write(int *host_slot, int v, uint64_t ns) {
    dev_sleep_ns(ns);
    *(volatile int *)host_slot = v;
    __threadfence_system();
}

int main() {
    const int NS = 8;
    int *slots;
    CHECK(cudaHostAlloc(&slots, 64 * sizeof(int), cudaHostAllocMapped));
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i <= NS; i++) slots[i] = 0;
        cudaStream_t s[NS];
        for (int i = 0; i < NS; i++) {
            CHECK(cudaStreamCreateWithFlags(&s[i], i % 2 ? cudaStreamNonBlocking : cudaStreamDefault));
            late_write<<<1, 1, 0, s[i]>>>(slots + i, 100 * round + i + 1, (uint64_t)(20 + 10 * i) * 1000 * 1000);
            CHECK_LAUNCH();
        }
        late_write<<<1, 1>>>(slots + NS, 100 * round + 99, 30ull * 1000 * 1000);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        int ok = 0;
        for (int i = 0; i < NS; i++) ok += slots[i] == 100 * round + i + 1;
        ok += slots[NS] == 100 * round + 99;
        printf("round %d: %d of %d writes visible after cudaDeviceSynchronize\n", round, ok, NS + 1);
        EXPECT(ok == NS + 1, "round %d: only %d writes done", round, ok);
        for (int i = 0; i < NS; i++) CHECK(cudaStreamDestroy(s[i]));
    }

    // synchronising an idle device, repeatedly
    for (int i = 0; i < 100; i++) CHECK(cudaDeviceSynchronize());
    printf("100 idle cudaDeviceSynchronize: ok\n");

    struct { cudaLimit l; size_t v; const char *name; } lim[] = {
        {cudaLimitStackSize, 4096, "stack size"},
        {cudaLimitPrintfFifoSize, 4 << 20, "printf fifo size"},
        {cudaLimitMallocHeapSize, 16 << 20, "malloc heap size"},
    };
    for (auto &l : lim) {
        size_t got = 0;
        CHECK(cudaDeviceSetLimit(l.l, l.v));
        CHECK(cudaDeviceGetLimit(&got, l.l));
        printf("%s: set %zu, got back >= set: %s\n", l.name, l.v, yes_no(got >= l.v));
        EXPECT(got >= l.v, "%s: got %zu", l.name, got);
    }
    // the device still runs kernels after the limit changes
    for (int i = 0; i <= NS; i++) slots[i] = 0;
    late_write<<<1, 1>>>(slots, 5, 0);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("kernel after limit changes: %d\n", slots[0]);
    EXPECT(slots[0] == 5, "kernel after limits wrote %d", slots[0]);
    CHECK(cudaFreeHost(slots));
    pass();
}
