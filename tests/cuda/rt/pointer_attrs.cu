// cudaPointerGetAttributes on device, interior-device, pinned, mapped,
// host-registered, pageable and stack pointers.
#include "rt_common.h"

static const char *type_name(cudaMemoryType t) {
    switch (t) {
        case cudaMemoryTypeUnregistered: return "unregistered";
        case cudaMemoryTypeHost: return "host";
        case cudaMemoryTypeDevice: return "device";
        case cudaMemoryTypeManaged: return "managed";
    }
    return "?";
}

static void show(const char *what, const void *p, const void *want_dev, const void *want_host) {
    cudaPointerAttributes a;
    memset(&a, 0xff, sizeof a);
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        report_err(what, e);
        return;
    }
    printf("%s: type %s, device %d, devicePointer %s, hostPointer %s\n", what, type_name(a.type), a.device,
           a.devicePointer == want_dev ? "as expected" : (a.devicePointer ? "other" : "null"),
           a.hostPointer == want_host ? "as expected" : (a.hostPointer ? "other" : "null"));
}

int main() {
    CHECK(cudaSetDevice(0));
    char *d, *pin, *mapped;
    CHECK(cudaMalloc(&d, 1 << 20));
    CHECK(cudaMallocHost(&pin, 1 << 16));
    CHECK(cudaHostAlloc(&mapped, 1 << 16, cudaHostAllocMapped));
    void *mapped_dev = NULL;
    CHECK(cudaHostGetDevicePointer(&mapped_dev, mapped, 0));
    printf("mapped device pointer equals host pointer: %s\n", yes_no(mapped_dev == mapped));
    char *reg = (char *)aligned_alloc(4096, 1 << 16);
    EXPECT(reg, "aligned_alloc");
    CHECK(cudaHostRegister(reg, 1 << 16, cudaHostRegisterDefault));
    char *pageable = (char *)malloc(1 << 16);
    EXPECT(pageable, "malloc");
    int stack_var = 0;

    show("device", d, d, NULL);
    show("device interior", d + 12345, d + 12345, NULL);
    show("pinned", pin, pin, pin);
    show("pinned interior", pin + 100, pin + 100, pin + 100);
    show("mapped", mapped, mapped_dev, mapped);
    show("registered", reg, reg, reg);
    show("registered interior", reg + 4100, reg + 4100, reg + 4100);
    show("pageable", pageable, NULL, pageable);
    show("stack", &stack_var, NULL, &stack_var);

    CHECK(cudaHostUnregister(reg));
    show("unregistered again", reg, NULL, reg);
    CHECK(cudaFree(d));
    CHECK(cudaFreeHost(pin));
    CHECK(cudaFreeHost(mapped));
    free(reg);
    free(pageable);
    CHECK(cudaGetLastError());
    pass();
}
