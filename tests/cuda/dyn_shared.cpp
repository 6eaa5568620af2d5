// dyn_shared: a block reduction using `extern __shared__` memory launched with
// sharedMemBytes = 48 KiB; an over-limit launch (96 KiB) that must be refused;
// the same at 96 KiB after cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES).
// Then a non-primary context: cuCtxCreate, cuCtxGetDevice, a module and a
// launch inside it, cuCtxPopCurrent/PushCurrent, cuCtxDestroy.
#include "common.h"

static const int BLOCKS = 64, THREADS = 1024;

// Run block_sum over BLOCKS blocks with smem_bytes of dynamic shared memory.
static CUresult run_sum(CUfunction fn, unsigned smem_bytes, uint32_t seed, bool launch_only_check) {
    int per_block = (int)(smem_bytes / 4);
    size_t n = (size_t)BLOCKS * per_block;
    std::vector<unsigned> in(n), out(BLOCKS, 0);
    for (size_t i = 0; i < n; i++) in[i] = mix32(i, seed);
    CUdeviceptr din, dout;
    CHECK(cuMemAlloc(&din, n * sizeof(unsigned)));
    CHECK(cuMemAlloc(&dout, BLOCKS * sizeof(unsigned)));
    CHECK(cuMemcpyHtoD(din, in.data(), n * sizeof(unsigned)));
    CHECK(cuMemsetD32(dout, 0, BLOCKS));
    void *params[] = {&din, &dout, &per_block};
    CUresult r = cuLaunchKernel(fn, BLOCKS, 1, 1, THREADS, 1, 1, smem_bytes, NULL, params, NULL);
    if (r == CUDA_SUCCESS) {
        CHECK(cuCtxSynchronize());
        CHECK(cuMemcpyDtoH(out.data(), dout, BLOCKS * sizeof(unsigned)));
        for (int b = 0; b < BLOCKS; b++) {
            unsigned want = 0;
            for (int i = 0; i < per_block; i++) want += in[(size_t)b * per_block + i];
            if (out[b] != want)
                fail("smem %u: block %d sum %u, expected %u", smem_bytes, b, out[b], want);
        }
        printf("block_sum with %u bytes of dynamic shared memory verified\n", smem_bytes);
    } else if (!launch_only_check) {
        fail("cuLaunchKernel with %u bytes of shared memory returned %s (%d): %s", smem_bytes,
             cu_err_name(r), (int)r, cu_err_string(r));
    }
    CHECK(cuCtxSynchronize());  // a refused launch must not poison the context
    CHECK(cuMemFree(din));
    CHECK(cuMemFree(dout));
    return r;
}

int main(int argc, char **argv) {
    std::string path = image_path(argc, argv, "dyn_shared.fatbin");
    PrimaryCtx p = init_primary();
    std::vector<char> image = load_file(path);
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, image.data()));
    CUfunction fn;
    CHECK(cuModuleGetFunction(&fn, mod, "block_sum"));

    int optin = 0, maxdyn = 0, stat = -1;
    CHECK(cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, p.dev));
    CHECK(cuFuncGetAttribute(&maxdyn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn));
    CHECK(cuFuncGetAttribute(&stat, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn));
    printf("func max_dynamic_shared default %d static %d\n", maxdyn, stat);
    EXPECT(optin >= 96 * 1024, "device opt-in shared memory %d < 96 KiB", optin);

    run_sum(fn, 48 * 1024, 1, false);

    CUresult r = run_sum(fn, 96 * 1024, 2, true);
    printf("96 KiB launch before opt-in: %s\n", cu_err_name(r));
    EXPECT(r != CUDA_SUCCESS, "launch with 96 KiB dynamic smem was accepted before opt-in");

    CHECK(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 96 * 1024));
    CHECK(cuFuncGetAttribute(&maxdyn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn));
    printf("func max_dynamic_shared after opt-in %d\n", maxdyn);
    EXPECT(maxdyn == 96 * 1024, "MAX_DYNAMIC_SHARED_SIZE_BYTES reads %d after set", maxdyn);
    run_sum(fn, 96 * 1024, 3, false);

    // A non-primary context.
    CUcontext cur = NULL, ctx = NULL, popped = NULL;
    CHECK(cuCtxGetCurrent(&cur));
    EXPECT(cur == p.ctx, "current context is not the primary one");
    CHECK(cuCtxCreate(&ctx, NULL, 0, p.dev));
    CHECK(cuCtxGetCurrent(&cur));
    EXPECT(cur == ctx && ctx != p.ctx, "cuCtxCreate did not make a new current context");
    CUdevice d = -1;
    CHECK(cuCtxGetDevice(&d));
    printf("created context device %d\n", (int)d);
    EXPECT(d == p.dev, "cuCtxGetDevice gave %d", (int)d);
    CUmodule mod2;
    CHECK(cuModuleLoadData(&mod2, image.data()));
    CUfunction fn2;
    CHECK(cuModuleGetFunction(&fn2, mod2, "block_sum"));
    run_sum(fn2, 48 * 1024, 4, false);  // default limit applies in the new context's module
    CHECK(cuCtxPopCurrent(&popped));
    EXPECT(popped == ctx, "cuCtxPopCurrent returned another context");
    CHECK(cuCtxGetCurrent(&cur));
    EXPECT(cur == p.ctx, "after pop, the primary context is not current");
    CHECK(cuCtxPushCurrent(ctx));
    CHECK(cuCtxGetCurrent(&cur));
    EXPECT(cur == ctx, "after push, the created context is not current");
    CHECK(cuCtxSynchronize());
    CHECK(cuModuleUnload(mod2));
    CHECK(cuCtxPopCurrent(&popped));
    EXPECT(popped == ctx, "second pop returned another context");
    CHECK(cuCtxDestroy(ctx));
    CHECK(cuCtxGetCurrent(&cur));
    EXPECT(cur == p.ctx, "after destroy, the primary context is not current");
    printf("context create/push/pop/destroy ok\n");

    // The primary context still works.
    run_sum(fn, 48 * 1024, 5, false);
    CHECK(cuModuleUnload(mod));
    release_primary(p);
    pass();
}
