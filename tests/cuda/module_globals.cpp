// module_globals: PTX image JIT-compiled with cuModuleLoadDataEx (with JIT
// options, including output ones); __device__/__constant__ globals read and
// written through cuModuleGetGlobal + cuMemcpyHtoD/DtoH, a kernel that updates
// them, lookups of missing names, cuModuleUnload, and a second load that must
// start from the initial values again.
#include "common.h"

static CUdeviceptr get_global(CUmodule mod, const char *name, size_t want_bytes) {
    CUdeviceptr d = 0;
    size_t bytes = 0;
    CHECK(cuModuleGetGlobal(&d, &bytes, mod, name));
    printf("global %s size %zu\n", name, bytes);
    EXPECT(bytes == want_bytes, "global %s: size %zu, expected %zu", name, bytes, want_bytes);
    EXPECT(d != 0, "global %s: null address", name);
    return d;
}

int main(int argc, char **argv) {
    std::string path = image_path(argc, argv, "module_globals.ptx");
    PrimaryCtx p = init_primary();
    std::vector<char> ptx = load_file(path);  // NUL-terminated

    static char info_log[8192], error_log[8192];
    CUjit_option opts[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                           CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                           CU_JIT_OPTIMIZATION_LEVEL, CU_JIT_WALL_TIME};
    float wall_ms_init = -1.0f;
    void *wall_slot = NULL;
    memcpy(&wall_slot, &wall_ms_init, sizeof(float));
    void *vals[] = {info_log, (void *)(uintptr_t)sizeof(info_log), error_log,
                    (void *)(uintptr_t)sizeof(error_log), (void *)(uintptr_t)4, wall_slot};
    CUmodule mod;
    CUresult r = cuModuleLoadDataEx(&mod, ptx.data(), 6, opts, vals);
    if (r != CUDA_SUCCESS)
        fail("cuModuleLoadDataEx returned %s (%d): %s; JIT error log: %s", cu_err_name(r), (int)r,
             cu_err_string(r), error_log);
    float wall_ms;
    memcpy(&wall_ms, &vals[5], sizeof(float));
    printf("jit wall time written back %d\n", wall_ms >= 0.0f ? 1 : 0);
    EXPECT(wall_ms >= 0.0f, "CU_JIT_WALL_TIME not written back (%f)", (double)wall_ms);
    printf("jit error log empty %d\n", error_log[0] == '\0' ? 1 : 0);

    CUdeviceptr d_counter = get_global(mod, "counter", sizeof(int));
    CUdeviceptr d_table = get_global(mod, "table", 256 * sizeof(float));
    CUdeviceptr d_magic = get_global(mod, "magic", sizeof(int));
    CUdeviceptr d_scale = get_global(mod, "scale", sizeof(float));
    // Either out-pointer may be NULL.
    CUdeviceptr d_counter2 = 0;
    size_t table_bytes = 0;
    CHECK(cuModuleGetGlobal(&d_counter2, NULL, mod, "counter"));
    CHECK(cuModuleGetGlobal(NULL, &table_bytes, mod, "table"));
    EXPECT(d_counter2 == d_counter, "second lookup of counter gave another address");
    EXPECT(table_bytes == 1024, "table size %zu on second lookup", table_bytes);

    CUdeviceptr dmissing;
    size_t bmissing;
    CHECK_EQ_RESULT(cuModuleGetGlobal(&dmissing, &bmissing, mod, "no_such_global"),
                    CUDA_ERROR_NOT_FOUND);
    CUfunction fmissing;
    CHECK_EQ_RESULT(cuModuleGetFunction(&fmissing, mod, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    printf("missing global and kernel: CUDA_ERROR_NOT_FOUND\n");

    // Initial values from the image.
    int counter = -1, magic = 0;
    CHECK(cuMemcpyDtoH(&counter, d_counter, sizeof(int)));
    CHECK(cuMemcpyDtoH(&magic, d_magic, sizeof(int)));
    printf("initial counter %d magic 0x%x\n", counter, magic);
    EXPECT(counter == 0 && magic == 0x1234567, "initial values wrong");

    // Write, run the kernel twice, read back.
    counter = 5;
    float table[256], scale = 2.0f;
    for (int i = 0; i < 256; i++) table[i] = (float)i * 0.5f;
    CHECK(cuMemcpyHtoD(d_counter, &counter, sizeof(int)));
    CHECK(cuMemcpyHtoD(d_table, table, sizeof(table)));
    CHECK(cuMemcpyHtoD(d_scale, &scale, sizeof(float)));
    CUfunction fn;
    CHECK(cuModuleGetFunction(&fn, mod, "update"));
    int delta = 3;
    void *params[] = {&delta};
    CHECK(cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    delta = -1;
    CHECK(cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    float got[256];
    CHECK(cuMemcpyDtoH(&counter, d_counter, sizeof(int)));
    CHECK(cuMemcpyDtoH(got, d_table, sizeof(got)));
    CHECK(cuMemcpyDtoH(&magic, d_magic, sizeof(int)));
    printf("after two launches counter %d magic 0x%x\n", counter, magic);
    EXPECT(counter == 5 + 256 * 3 - 256, "counter %d, expected %d", counter, 5 + 256 * 2);
    EXPECT(magic == 0x1234567, "magic 0x%x after two xors", magic);
    for (int i = 0; i < 256; i++) {
        float want = ((float)i * 0.5f * 2.0f + 1.0f) * 2.0f + 1.0f;
        if (got[i] != want) fail("table[%d] = %g, expected %g", i, (double)got[i], (double)want);
    }
    printf("table verified\n");
    CHECK(cuModuleUnload(mod));

    // A fresh load (plain cuModuleLoadData) starts from the image's values.
    CUmodule mod2;
    CHECK(cuModuleLoadData(&mod2, ptx.data()));
    CUdeviceptr d2_counter = get_global(mod2, "counter", sizeof(int));
    CUdeviceptr d2_magic = get_global(mod2, "magic", sizeof(int));
    CHECK(cuMemcpyDtoH(&counter, d2_counter, sizeof(int)));
    CHECK(cuMemcpyDtoH(&magic, d2_magic, sizeof(int)));
    printf("reloaded counter %d magic 0x%x\n", counter, magic);
    EXPECT(counter == 0 && magic == 0x1234567, "reloaded module did not start from initial values");
    CHECK(cuModuleUnload(mod2));

    release_primary(p);
    pass();
}
