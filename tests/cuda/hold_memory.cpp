// hold_memory: the kill -9 victim. Allocates 256 MiB, memsets it, prints
// READY (flushed), then launches a short kernel + sync in a loop until killed.
//
// usage: hold_memory [image.cubin] [--seconds S]
//   --seconds S  stop after S seconds and print PASS (for testing; default: forever)
#include "common.h"

int main(int argc, char **argv) {
    static const char *const value_opts[] = {"--seconds", NULL};
    unsigned long long seconds = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seconds") == 0) {
            if (i + 1 >= argc) fail("--seconds needs a value");
            seconds = parse_u64("--seconds", argv[++i]);
        } else if (strncmp(argv[i], "--", 2) == 0) {
            fail("unknown option %s", argv[i]);
        }
    }
    std::string path = image_path(argc, argv, "spin.cubin", value_opts);

    PrimaryCtx p = init_primary();
    std::vector<char> image = load_file(path);
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, image.data()));
    CUfunction fn;
    CHECK(cuModuleGetFunction(&fn, mod, "touch"));

    const size_t bytes = 256u << 20;
    CUdeviceptr buf;
    CHECK(cuMemAlloc(&buf, bytes));
    CHECK(cuMemsetD8(buf, 0, bytes));
    CHECK(cuCtxSynchronize());
    printf("READY\n");
    fflush(stdout);

    // Each launch touches 1 MiB of the buffer, a different slice each time.
    const unsigned long long words = (1u << 20) / 4;
    uint64_t deadline = seconds ? monotonic_ns() + seconds * 1000000000ull : 0;
    unsigned long long iter = 0;
    for (;;) {
        CUdeviceptr slice = buf + (iter % 256) * (1u << 20);
        unsigned v = 1;
        unsigned long long n = words;
        void *params[] = {&slice, &n, &v};
        CHECK(cuLaunchKernel(fn, 64, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
        CHECK(cuCtxSynchronize());
        iter++;
        if (deadline && monotonic_ns() >= deadline) break;
    }
    // Every slice was touched floor(iter/256) or that +1 times.
    unsigned first = 0;
    CHECK(cuMemcpyDtoH(&first, buf, sizeof(first)));
    unsigned long long want = iter / 256 + (iter % 256 ? 1 : 0);
    if (first != (unsigned)want) fail("slice 0 word 0 is %u, expected %llu", first, want);
    printf("hold_memory stopped after its time\n");
    CHECK(cuMemFree(buf));
    CHECK(cuModuleUnload(mod));
    release_primary(p);
    pass();
}
