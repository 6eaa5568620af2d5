// cudaHostRegister: page-aligned and unaligned ranges, async copies from
// registered memory, mapped registration with a kernel writing it, the errors
// for double registration and for unregistering twice.
#include "rt_common.h"

__global__ void stamp(int *p, int n, int v) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v + i;
}

int main() {
    const size_t n = 8 << 20;
    unsigned char *a = (unsigned char *)aligned_alloc(4096, n), *b = (unsigned char *)aligned_alloc(4096, n);
    EXPECT(a && b, "aligned_alloc");
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)mix32(i, 5);
    memset(b, 0, n);
    CHECK(cudaHostRegister(a, n, cudaHostRegisterDefault));
    CHECK(cudaHostRegister(b, n, cudaHostRegisterPortable));
    unsigned char *d;
    CHECK(cudaMalloc(&d, n));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMemcpyAsync(d, a, n, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(b, d, n, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(memcmp(a, b, n) == 0, "registered round trip mismatch");
    printf("registered round trip %zu bytes: ok, checksum %08x\n", n, fnv1a(b, n));

    cudaError_t e = cudaHostRegister(a, n, cudaHostRegisterDefault);
    EXPECT(e != cudaSuccess, "registering twice succeeded");
    report_err("register the same range again", e);

    // an unaligned range inside a malloc'd buffer
    unsigned char *raw = (unsigned char *)malloc((1 << 20) + 123);
    EXPECT(raw, "malloc");
    unsigned char *u = raw + 17;
    const size_t un = (1 << 20) + 50;
    for (size_t i = 0; i < un; i++) u[i] = (unsigned char)(i * 13);
    CHECK(cudaHostRegister(u, un, cudaHostRegisterDefault));
    CHECK(cudaMemcpyAsync(d, u, un, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemsetAsync(d, 0x42, 3, s));
    CHECK(cudaMemcpyAsync(u, d, un, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    bool ok = u[0] == 0x42 && u[2] == 0x42;
    for (size_t i = 3; i < un; i++) ok = ok && u[i] == (unsigned char)(i * 13);
    printf("unaligned registered range: %s\n", ok ? "ok" : "mismatch");
    EXPECT(ok, "unaligned registered range mismatch");
    CHECK(cudaHostUnregister(u));

    // mapped registration: a kernel writes the host pages
    int *m = (int *)aligned_alloc(4096, 1 << 20);
    EXPECT(m, "aligned_alloc");
    memset(m, 0, 1 << 20);
    CHECK(cudaHostRegister(m, 1 << 20, cudaHostRegisterMapped));
    int *md = NULL;
    CHECK(cudaHostGetDevicePointer(&md, m, 0));
    stamp<<<64, 256, 0, s>>>(md, (1 << 20) / 4, 1000);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < (1 << 20) / 4; i++) EXPECT(m[i] == 1000 + i, "mapped registered m[%d] = %d", i, m[i]);
    printf("kernel wrote mapped registered memory: ok\n");
    CHECK(cudaHostUnregister(m));

    CHECK(cudaHostUnregister(a));
    CHECK(cudaHostUnregister(b));
    e = cudaHostUnregister(a);
    EXPECT(e != cudaSuccess, "unregistering twice succeeded");
    report_err("unregister again", e);
    // plain pageable copies from the once-registered memory still work
    CHECK(cudaMemcpy(d, a, 4096, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, d, 4096, cudaMemcpyDeviceToHost));
    EXPECT(memcmp(a, b, 4096) == 0, "copy after unregister");
    printf("copies after unregister: ok\n");
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
    free(a);
    free(b);
    free(raw);
    free(m);
    pass();
}
