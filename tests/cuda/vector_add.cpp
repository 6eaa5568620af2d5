// vector_add: fatbin image loaded with cuModuleLoadFatBinary; 1M floats.
// Prints the device facts a client sees (name, UUID, memory, attributes,
// driver version, device count) so that omps's answers can be diffed
// against the real driver's.
//
// usage: vector_add [image.fatbin] [--loops N]
//   --loops N  repeat alloc/copy/launch/verify/free N times (default 1);
//              used as a long-running survivor client.
#include "common.h"

static const int N = 1 << 20;

static void print_device_facts(CUdevice dev) {
    int count = 0, version = 0;
    CHECK(cuDeviceGetCount(&count));
    CHECK(cuDriverGetVersion(&version));
    printf("device_count %d\n", count);
    printf("driver_version %d\n", version);

    char name[256];
    CHECK(cuDeviceGetName(name, sizeof(name), dev));
    printf("name %s\n", name);

    CUuuid uuid;
    CHECK(cuDeviceGetUuid(&uuid, dev));
    const unsigned char *u = (const unsigned char *)uuid.bytes;
    printf("uuid GPU-");
    for (int i = 0; i < 16; i++) {
        printf("%02x", u[i]);
        if (i == 3 || i == 5 || i == 7 || i == 9) printf("-");
    }
    printf("\n");

    size_t total = 0;
    CHECK(cuDeviceTotalMem(&total, dev));
    EXPECT(total > 0, "cuDeviceTotalMem returned 0");
    printf("total_mem %zu\n", total);

    char busid[64];
    CHECK(cuDeviceGetPCIBusId(busid, sizeof(busid), dev));
    printf("pci_bus_id %s\n", busid);

    static const struct {
        CUdevice_attribute a;
        const char *name;
    } attrs[] = {
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "cc_major"},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "cc_minor"},
        {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "sm_count"},
        {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "max_threads_per_block"},
        {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, "max_threads_per_sm"},
        {CU_DEVICE_ATTRIBUTE_WARP_SIZE, "warp_size"},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, "max_block_dim_x"},
        {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, "max_grid_dim_x"},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, "max_smem_per_block"},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, "max_smem_per_block_optin"},
        {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, "max_regs_per_block"},
        {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "l2_cache_size"},
        {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, "mem_bus_width"},
        {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, "concurrent_kernels"},
        {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, "unified_addressing"},
        {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, "pci_domain"},
        {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, "pci_bus"},
        {CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, "pci_device"},
    };
    for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        int v = 0;
        CHECK(cuDeviceGetAttribute(&v, attrs[i].a, dev));
        printf("attr %s %d\n", attrs[i].name, v);
    }
}

int main(int argc, char **argv) {
    static const char *const value_opts[] = {"--loops", NULL};
    long loops = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--loops") == 0) {
            if (i + 1 >= argc) fail("--loops needs a value");
            loops = (long)parse_u64("--loops", argv[++i]);
            if (loops < 1) fail("--loops must be >= 1");
        } else if (strncmp(argv[i], "--", 2) == 0) {
            fail("unknown option %s", argv[i]);
        }
    }
    std::string path = image_path(argc, argv, "vector_add.fatbin", value_opts);

    PrimaryCtx p = init_primary();
    print_device_facts(p.dev);

    std::vector<char> image = load_file(path);
    CUmodule mod;
    CHECK(cuModuleLoadFatBinary(&mod, image.data()));
    CUfunction fn;
    CHECK(cuModuleGetFunction(&fn, mod, "vector_add"));

    std::vector<float> a(N), b(N), c(N);
    const size_t bytes = (size_t)N * sizeof(float);
    for (long it = 0; it < loops; it++) {
        // Values chosen so that every sum is exact in float.
        for (int i = 0; i < N; i++) {
            a[i] = (float)((i + it) % 4096) * 0.25f;
            b[i] = (float)((i * 7 + 3 * it) % 1000) - 500.0f;
        }
        CUdeviceptr da, db, dc;
        CHECK(cuMemAlloc(&da, bytes));
        CHECK(cuMemAlloc(&db, bytes));
        CHECK(cuMemAlloc(&dc, bytes));
        CHECK(cuMemcpyHtoD(da, a.data(), bytes));
        CHECK(cuMemcpyHtoD(db, b.data(), bytes));
        CHECK(cuMemsetD32(dc, 0xFFFFFFFFu, N));  // NaN everywhere: unwritten elements show
        int n = N;
        void *params[] = {&da, &db, &dc, &n};
        CHECK(cuLaunchKernel(fn, (N + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
        CHECK(cuMemcpyDtoH(c.data(), dc, bytes));
        for (int i = 0; i < N; i++) {
            float want = a[i] + b[i];
            if (memcmp(&c[i], &want, sizeof(float)) != 0)
                fail("loop %ld: c[%d] = %g, expected %g", it, i, (double)c[i], (double)want);
        }
        CHECK(cuMemFree(da));
        CHECK(cuMemFree(db));
        CHECK(cuMemFree(dc));
    }
    printf("vector_add n=%d loops=%ld verified\n", N, loops);

    CHECK(cuModuleUnload(mod));
    release_primary(p);
    pass();
}
