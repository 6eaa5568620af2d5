// Managed memory: cudaMallocManaged written by the host, a kernel and the host again;
// cudaPointerGetAttributes; cudaMemPrefetchAsync to the device and back (CUDA 13 form,
// with a cudaMemLocation); cudaMemAdvise read-mostly / preferred location / accessed-by
// read back with cudaMemRangeGetAttribute(s); cudaStreamAttachMemAsync single and global;
// cudaMemset and cudaMemcpy on managed memory; a 64 MiB buffer summed by a kernel.
// (__managed__ variables are not in it: omps does not support them, docs/design.md.)
#include "rt_common.h"
#include <vector>

__global__ void axpb(int *p, int n, int a, int b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = a * p[i] + b;
}

__global__ void sum_words(const uint32_t *p, size_t n, unsigned long long *out) {
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        s += p[i];
    atomicAdd(out, s);
}

static const int N = 1 << 20;
static const size_t BYTES = N * sizeof(int);

// p[i] == a * i + b everywhere (host reads of managed memory).
static void check_lin(const char *what, const int *p, int a, int b) {
    int bad = 0;
    for (int i = 0; i < N; i++) bad += p[i] != a * i + b;
    printf("%s: checksum %08x, %s\n", what, fnv1a(p, BYTES), bad == 0 ? "all as expected" : "WRONG");
    EXPECT(bad == 0, "%s: %d values wrong", what, bad);
}

static int range_int(cudaMemRangeAttribute attr, const void *p) {
    int v = 0;
    CHECK(cudaMemRangeGetAttribute(&v, sizeof v, attr, p, BYTES));
    return v;
}

static cudaMemLocation loc(cudaMemLocationType t, int id) {
    cudaMemLocation l = {};
    l.type = t;
    l.id = id;
    return l;
}

int main() {
    int dev = 0;
    CHECK(cudaSetDevice(dev));
    int managed = 0, concurrent = 0;
    CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, dev));
    CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev));
    printf("managed memory: %s, concurrent managed access: %s\n", yes_no(managed), yes_no(concurrent));
    EXPECT(managed && concurrent, "managed memory with concurrent access needed");
    cudaStream_t s, s2;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

    // Host, kernel, host.
    int *m;
    CHECK(cudaMallocManaged(&m, BYTES, cudaMemAttachGlobal));
    for (int i = 0; i < N; i++) m[i] = i;
    axpb<<<N / 256, 256>>>(m, N, 3, 1);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    check_lin("host write, kernel 3x+1, host read", m, 3, 1);

    cudaPointerAttributes pa;
    CHECK(cudaPointerGetAttributes(&pa, m + 100));
    printf("pointer attributes: type %d (managed %s), device %d, device pointer %s, host pointer %s\n",
           (int)pa.type, yes_no(pa.type == cudaMemoryTypeManaged), pa.device,
           pa.devicePointer == m + 100 ? "same" : "differs", pa.hostPointer == m + 100 ? "same" : "differs");
    EXPECT(pa.type == cudaMemoryTypeManaged, "not managed");

    // Prefetch to the device, a kernel, prefetch back to the host.
    CHECK(cudaMemPrefetchAsync(m, BYTES, loc(cudaMemLocationTypeDevice, dev), 0, s));
    int lp = range_int(cudaMemRangeAttributeLastPrefetchLocation, m);
    int lpt = range_int(cudaMemRangeAttributeLastPrefetchLocationType, m);
    int lpi = range_int(cudaMemRangeAttributeLastPrefetchLocationId, m);
    printf("after prefetch to the device: last prefetch location %d, type %d, id %d\n", lp, lpt, lpi);
    EXPECT(lp == dev && lpt == cudaMemLocationTypeDevice && lpi == dev, "wrong last prefetch location");
    axpb<<<N / 256, 256, 0, s>>>(m, N, 2, -1);  // 6x+1
    CHECK_LAUNCH();
    CHECK(cudaMemPrefetchAsync(m, BYTES, loc(cudaMemLocationTypeHost, 0), 0, s));
    CHECK(cudaStreamSynchronize(s));
    lp = range_int(cudaMemRangeAttributeLastPrefetchLocation, m);
    lpt = range_int(cudaMemRangeAttributeLastPrefetchLocationType, m);
    printf("after prefetch to the host: last prefetch location %d, type %d\n", lp, lpt);
    check_lin("prefetched, kernel 2x-1, prefetched back", m, 6, 1);

    // Advice, read back.
    CHECK(cudaMemAdvise(m, BYTES, cudaMemAdviseSetReadMostly, loc(cudaMemLocationTypeDevice, dev)));
    printf("read mostly after set: %d\n", range_int(cudaMemRangeAttributeReadMostly, m));
    EXPECT(range_int(cudaMemRangeAttributeReadMostly, m) == 1, "read mostly not set");
    axpb<<<N / 256, 256>>>(m, N, 1, 2);  // reads and writes a read-mostly range: 6x+3
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    check_lin("kernel on a read-mostly range", m, 6, 3);
    CHECK(cudaMemAdvise(m, BYTES, cudaMemAdviseUnsetReadMostly, loc(cudaMemLocationTypeDevice, dev)));
    printf("read mostly after unset: %d\n", range_int(cudaMemRangeAttributeReadMostly, m));
    EXPECT(range_int(cudaMemRangeAttributeReadMostly, m) == 0, "read mostly still set");

    CHECK(cudaMemAdvise(m, BYTES, cudaMemAdviseSetPreferredLocation, loc(cudaMemLocationTypeDevice, dev)));
    int pl = range_int(cudaMemRangeAttributePreferredLocation, m);
    int plt = range_int(cudaMemRangeAttributePreferredLocationType, m);
    int pli = range_int(cudaMemRangeAttributePreferredLocationId, m);
    printf("preferred location device: location %d, type %d, id %d\n", pl, plt, pli);
    EXPECT(pl == dev && plt == cudaMemLocationTypeDevice && pli == dev, "wrong preferred location");
    CHECK(cudaMemAdvise(m, BYTES, cudaMemAdviseSetPreferredLocation, loc(cudaMemLocationTypeHost, 0)));
    pl = range_int(cudaMemRangeAttributePreferredLocation, m);
    plt = range_int(cudaMemRangeAttributePreferredLocationType, m);
    printf("preferred location host: location %d, type %d\n", pl, plt);
    EXPECT(pl == cudaCpuDeviceId && plt == cudaMemLocationTypeHost, "wrong preferred location");
    CHECK(cudaMemAdvise(m, BYTES, cudaMemAdviseUnsetPreferredLocation, loc(cudaMemLocationTypeHost, 0)));
    pl = range_int(cudaMemRangeAttributePreferredLocation, m);
    plt = range_int(cudaMemRangeAttributePreferredLocationType, m);
    printf("preferred location unset: location %d, type %d\n", pl, plt);
    EXPECT(pl == cudaInvalidDeviceId && plt == cudaMemLocationTypeInvalid, "preferred location still set");

    CHECK(cudaMemAdvise(m, BYTES, cudaMemAdviseSetAccessedBy, loc(cudaMemLocationTypeDevice, dev)));
    int by[4];
    CHECK(cudaMemRangeGetAttribute(by, sizeof by, cudaMemRangeAttributeAccessedBy, m, BYTES));
    printf("accessed by: %d %d %d %d\n", by[0], by[1], by[2], by[3]);
    EXPECT(by[0] == dev && by[1] == cudaInvalidDeviceId, "wrong accessed-by list");
    axpb<<<N / 256, 256>>>(m, N, 1, 1);  // 6x+4
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    check_lin("kernel on an accessed-by range", m, 6, 4);
    CHECK(cudaMemAdvise(m, BYTES, cudaMemAdviseUnsetAccessedBy, loc(cudaMemLocationTypeDevice, dev)));
    CHECK(cudaMemRangeGetAttribute(by, sizeof by, cudaMemRangeAttributeAccessedBy, m, BYTES));
    printf("accessed by after unset: %d %d %d %d\n", by[0], by[1], by[2], by[3]);
    EXPECT(by[0] == cudaInvalidDeviceId, "accessed-by still set");

    // Several attributes in one call.
    CHECK(cudaMemAdvise(m, BYTES, cudaMemAdviseSetReadMostly, loc(cudaMemLocationTypeDevice, dev)));
    CHECK(cudaMemAdvise(m, BYTES, cudaMemAdviseSetPreferredLocation, loc(cudaMemLocationTypeDevice, dev)));
    int rm = -1, t = -1, id = -1;
    void *data[] = {&rm, &t, &id};
    size_t sizes[] = {sizeof rm, sizeof t, sizeof id};
    cudaMemRangeAttribute attrs[] = {cudaMemRangeAttributeReadMostly,
                                     cudaMemRangeAttributePreferredLocationType,
                                     cudaMemRangeAttributePreferredLocationId};
    CHECK(cudaMemRangeGetAttributes(data, sizes, attrs, 3, m, BYTES));
    printf("cudaMemRangeGetAttributes: read mostly %d, preferred type %d, id %d\n", rm, t, id);
    EXPECT(rm == 1 && t == cudaMemLocationTypeDevice && id == dev, "wrong attributes");

    // Attached to one stream, then global again.
    int *m2;
    CHECK(cudaMallocManaged(&m2, BYTES, cudaMemAttachHost));
    CHECK(cudaStreamAttachMemAsync(s, m2, 0, cudaMemAttachSingle));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < N; i++) m2[i] = 2 * i;
    axpb<<<N / 256, 256, 0, s>>>(m2, N, 1, 5);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));
    check_lin("attached to a stream: host, kernel on that stream, host", m2, 2, 5);
    CHECK(cudaStreamAttachMemAsync(s, m2, 0, cudaMemAttachGlobal));
    CHECK(cudaStreamSynchronize(s));
    axpb<<<N / 256, 256, 0, s2>>>(m2, N, 1, 1);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    check_lin("attached global again: kernel on another stream", m2, 2, 6);

    // cudaMemset and cudaMemcpy with managed operands.
    CHECK(cudaMemset(m2, 0x5a, BYTES));
    CHECK(cudaDeviceSynchronize());
    int bad = 0;
    for (int i = 0; i < N; i++) bad += m2[i] != 0x5a5a5a5a;
    printf("cudaMemset on managed: %s\n", bad == 0 ? "all 0x5a" : "WRONG");
    EXPECT(bad == 0, "%d words wrong after memset", bad);
    CHECK(cudaMemcpy(m2, m, BYTES, cudaMemcpyDefault));
    check_lin("cudaMemcpy managed to managed (default)", m2, 6, 4);
    int *d;
    CHECK(cudaMalloc(&d, BYTES));
    CHECK(cudaMemset(m2, 0, BYTES));
    CHECK(cudaMemcpy(d, m, BYTES, cudaMemcpyDeviceToDevice));
    axpb<<<N / 256, 256>>>(d, N, 1, 10);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(m2, d, BYTES, cudaMemcpyDeviceToDevice));
    check_lin("managed to device, kernel, device to managed", m2, 6, 14);
    std::vector<int> h(N);
    CHECK(cudaMemcpy(h.data(), m2, BYTES, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(m, h.data(), BYTES, cudaMemcpyHostToDevice));
    CHECK(cudaDeviceSynchronize());
    check_lin("managed to host to managed", m, 6, 14);

    // 64 MiB, written by the host and summed by a kernel.
    const size_t words = (64u << 20) / sizeof(uint32_t);
    uint32_t *big;
    CHECK(cudaMallocManaged(&big, words * sizeof(uint32_t)));
    unsigned long long want = 0;
    for (size_t i = 0; i < words; i++) {
        big[i] = mix32(i, 7);
        want += big[i];
    }
    unsigned long long *sum;
    CHECK(cudaMallocManaged(&sum, sizeof *sum));
    *sum = 0;
    CHECK(cudaMemPrefetchAsync(big, words * sizeof(uint32_t), loc(cudaMemLocationTypeDevice, dev), 0, s));
    sum_words<<<1024, 256, 0, s>>>(big, words, sum);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));
    printf("64 MiB managed sum: %llu, matches the host: %s\n", *sum, yes_no(*sum == want));
    EXPECT(*sum == want, "sum %llu, want %llu", *sum, want);

    CHECK(cudaFree(sum));
    CHECK(cudaFree(big));
    CHECK(cudaFree(d));
    CHECK(cudaFree(m2));
    CHECK(cudaFree(m));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaStreamDestroy(s2));
    pass();
}
