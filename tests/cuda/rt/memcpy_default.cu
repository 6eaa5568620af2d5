// Unified addressing: cudaMemcpy(Async) with cudaMemcpyDefault between pageable,
// pinned and device memory in every direction, and host-to-host copies.
#include "rt_common.h"

int main() {
    int uva = 0;
    CHECK(cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, 0));
    printf("unified addressing: %d\n", uva);
    EXPECT(uva == 1, "no unified addressing");
    const size_t n = (4 << 20) + 12;
    unsigned char *pg = (unsigned char *)malloc(n), *pg2 = (unsigned char *)malloc(n);
    unsigned char *pin, *pin2, *d, *d2;
    EXPECT(pg && pg2, "malloc");
    CHECK(cudaMallocHost(&pin, n));
    CHECK(cudaHostAlloc(&pin2, n, cudaHostAllocDefault));
    CHECK(cudaMalloc(&d, n));
    CHECK(cudaMalloc(&d2, n));
    for (size_t i = 0; i < n; i++) pg[i] = (unsigned char)mix32(i, 3);
    const uint32_t want = fnv1a(pg, n);

    CHECK(cudaMemcpy(d, pg, n, cudaMemcpyDefault));      // pageable -> device
    CHECK(cudaMemcpy(d2, d, n, cudaMemcpyDefault));      // device -> device
    CHECK(cudaMemcpy(pin, d2, n, cudaMemcpyDefault));    // device -> pinned
    EXPECT(fnv1a(pin, n) == want, "pageable->device->device->pinned mismatch");
    printf("pageable -> device -> device -> pinned: ok\n");

    memset(pg2, 0, n);
    CHECK(cudaMemcpy(pg2, pin, n, cudaMemcpyDefault));   // pinned -> pageable (host to host)
    EXPECT(fnv1a(pg2, n) == want, "pinned->pageable mismatch");
    memset(pin2, 0, n);
    CHECK(cudaMemcpy(pin2, pg2, n, cudaMemcpyHostToHost));
    EXPECT(fnv1a(pin2, n) == want, "host-to-host mismatch");
    printf("pinned -> pageable -> pinned (host to host): ok\n");

    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMemsetAsync(d, 0, n, s));
    CHECK(cudaMemcpyAsync(d + 1, pin2 + 1, n - 2, cudaMemcpyDefault, s));   // pinned -> device, odd offset
    CHECK(cudaMemcpyAsync(d2, d, n, cudaMemcpyDefault, s));
    memset(pg2, 0xEE, n);
    CHECK(cudaMemcpyAsync(pg2, d2, n, cudaMemcpyDefault, s));               // device -> pageable
    CHECK(cudaStreamSynchronize(s));
    EXPECT(pg2[0] == 0 && pg2[n - 1] == 0, "ends not zero");
    EXPECT(memcmp(pg2 + 1, pg + 1, n - 2) == 0, "async default copies mismatch");
    printf("async default copies with odd offsets: ok, checksum %08x\n", fnv1a(pg2, n));

    // device -> device with explicit kinds and small sizes
    for (size_t sz : {(size_t)1, (size_t)3, (size_t)4, (size_t)65, (size_t)4097}) {
        CHECK(cudaMemset(d2, 0, 8192));
        CHECK(cudaMemcpy(d2 + 1, d + 2, sz, cudaMemcpyDeviceToDevice));
        unsigned char back[8192];
        CHECK(cudaMemcpy(back, d2, 8192, cudaMemcpyDeviceToHost));
        EXPECT(back[0] == 0 && back[sz + 1] == 0 && memcmp(back + 1, pg + 2, sz) == 0, "d2d %zu bytes", sz);
    }
    printf("small device-to-device copies: ok\n");
    CHECK(cudaFree(d));
    CHECK(cudaFree(d2));
    CHECK(cudaFreeHost(pin));
    CHECK(cudaFreeHost(pin2));
    CHECK(cudaStreamDestroy(s));
    pass();
}
