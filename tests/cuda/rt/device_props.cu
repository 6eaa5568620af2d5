// Device queries through the runtime API: count, versions, cudaGetDeviceProperties
// (stable fields only), attributes agreeing with the properties, PCI bus id
// round trip, cudaMemGetInfo consistency (values not printed).
#include "rt_common.h"

int main() {
    int n = 0;
    CHECK(cudaGetDeviceCount(&n));
    EXPECT(n >= 1, "no device");
    printf("devices: %d\n", n);
    int drv = 0, rt = 0;
    CHECK(cudaDriverGetVersion(&drv));
    CHECK(cudaRuntimeGetVersion(&rt));
    printf("driver version: %d\n", drv);
    printf("runtime version: %d\n", rt);
    EXPECT(drv >= rt, "driver %d older than runtime %d", drv, rt);

    CHECK(cudaSetDevice(0));
    int dev = -1;
    CHECK(cudaGetDevice(&dev));
    EXPECT(dev == 0, "cudaGetDevice gave %d", dev);

    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    printf("name: %s\n", p.name);
    printf("uuid:");
    for (int i = 0; i < 16; i++) printf("%s%02x", (i == 4 || i == 6 || i == 8 || i == 10) ? "-" : "",
                                        (unsigned char)p.uuid.bytes[i]);
    printf("\n");
    printf("compute capability: %d.%d\n", p.major, p.minor);
    printf("total global mem MiB: %zu\n", p.totalGlobalMem >> 20);
    printf("multiprocessors: %d\n", p.multiProcessorCount);
    printf("warp size: %d\n", p.warpSize);
    printf("max threads per block: %d\n", p.maxThreadsPerBlock);
    printf("max threads dim: %d %d %d\n", p.maxThreadsDim[0], p.maxThreadsDim[1], p.maxThreadsDim[2]);
    printf("max grid size: %d %d %d\n", p.maxGridSize[0], p.maxGridSize[1], p.maxGridSize[2]);
    printf("max threads per SM: %d\n", p.maxThreadsPerMultiProcessor);
    printf("max blocks per SM: %d\n", p.maxBlocksPerMultiProcessor);
    printf("shared mem per block: %zu\n", p.sharedMemPerBlock);
    printf("shared mem per block optin: %zu\n", p.sharedMemPerBlockOptin);
    printf("shared mem per SM: %zu\n", p.sharedMemPerMultiprocessor);
    printf("reserved shared mem per block: %zu\n", p.reservedSharedMemPerBlock);
    printf("regs per block: %d\n", p.regsPerBlock);
    printf("regs per SM: %d\n", p.regsPerMultiprocessor);
    printf("total const mem: %zu\n", p.totalConstMem);
    printf("l2 cache size: %d\n", p.l2CacheSize);
    printf("memory bus width: %d\n", p.memoryBusWidth);
    printf("mem pitch: %zu\n", p.memPitch);
    printf("texture alignment: %zu\n", p.textureAlignment);
    printf("unified addressing: %d\n", p.unifiedAddressing);
    printf("managed memory: %d\n", p.managedMemory);
    printf("concurrent kernels: %d\n", p.concurrentKernels);
    printf("can map host memory: %d\n", p.canMapHostMemory);
    printf("cooperative launch: %d\n", p.cooperativeLaunch);
    printf("cluster launch: %d\n", p.clusterLaunch);
    printf("stream priorities supported: %d\n", p.streamPrioritiesSupported);
    printf("async engine count: %d\n", p.asyncEngineCount);
    printf("integrated: %d\n", p.integrated);
    printf("ECC enabled: %d\n", p.ECCEnabled);
    printf("host register supported: %d\n", p.hostRegisterSupported);
    printf("memory pools supported: %d\n", p.memoryPoolsSupported);

    struct { cudaDeviceAttr a; int want; const char *what; } attrs[] = {
        {cudaDevAttrComputeCapabilityMajor, p.major, "major"},
        {cudaDevAttrComputeCapabilityMinor, p.minor, "minor"},
        {cudaDevAttrMultiProcessorCount, p.multiProcessorCount, "SMs"},
        {cudaDevAttrMaxThreadsPerBlock, p.maxThreadsPerBlock, "max threads"},
        {cudaDevAttrWarpSize, p.warpSize, "warp size"},
        {cudaDevAttrMaxSharedMemoryPerBlockOptin, (int)p.sharedMemPerBlockOptin, "smem optin"},
        {cudaDevAttrL2CacheSize, p.l2CacheSize, "L2"},
        {cudaDevAttrUnifiedAddressing, p.unifiedAddressing, "UVA"},
        {cudaDevAttrCooperativeLaunch, p.cooperativeLaunch, "coop"},
    };
    for (auto &a : attrs) {
        int v = -1;
        CHECK(cudaDeviceGetAttribute(&v, a.a, 0));
        EXPECT(v == a.want, "attribute %s = %d, properties say %d", a.what, v, a.want);
    }
    printf("attributes agree with properties: yes\n");

    char bus[64];
    CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
    int by_bus = -1;
    CHECK(cudaDeviceGetByPCIBusId(&by_bus, bus));
    printf("device by its PCI bus id: %d\n", by_bus);

    size_t fr = 0, tot = 0;
    CHECK(cudaMemGetInfo(&fr, &tot));
    EXPECT(fr > 0 && fr <= tot, "free %zu not in (0, %zu]", fr, tot);
    printf("cudaMemGetInfo: 0 < free <= total: yes\n");
    printf("cudaMemGetInfo total equals totalGlobalMem: %s\n", yes_no(tot == p.totalGlobalMem));
    pass();
}
