// Dynamic shared memory: extern __shared__ at 48 KiB, a refused 96 KiB launch
// before the opt-in, cudaFuncSetAttribute(MaxDynamicSharedMemorySize), then
// 96 KiB and the device's opt-in maximum; cudaLaunchKernel with an args array.
#include "rt_common.h"

// each block reverses its slice of `ints` elements through shared memory
__global__ void reverse_block(const int *in, int *out, int ints) {
    extern __shared__ int s[];
    const int *src = in + (size_t)blockIdx.x * ints;
    for (int i = threadIdx.x; i < ints; i += blockDim.x) s[i] = src[i];
    __syncthreads();
    for (int i = threadIdx.x; i < ints; i += blockDim.x) out[(size_t)blockIdx.x * ints + i] = s[ints - 1 - i];
}

static int *d_in, *d_out, *h;
static const int BLOCKS = 8;

static bool run(size_t smem, bool via_launch_kernel) {
    int ints = (int)(smem / sizeof(int));
    CHECK(cudaMemset(d_out, 0, BLOCKS * smem));
    if (via_launch_kernel) {
        void *args[] = {&d_in, &d_out, &ints};
        cudaError_t e = cudaLaunchKernel((const void *)reverse_block, dim3(BLOCKS), dim3(256), args, smem, 0);
        if (e != cudaSuccess) { report_err("cudaLaunchKernel", e); return false; }
    } else {
        reverse_block<<<BLOCKS, 256, smem>>>(d_in, d_out, ints);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) { report_err("launch", e); return false; }
    }
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h, d_out, BLOCKS * smem, cudaMemcpyDeviceToHost));
    for (int b = 0; b < BLOCKS; b++)
        for (int i = 0; i < ints; i++) {
            int want = (int)mix32((size_t)b * ints + ints - 1 - i, 4);
            EXPECT(h[(size_t)b * ints + i] == want, "smem %zu block %d element %d", smem, b, i);
        }
    return true;
}

int main() {
    int optin = 0;
    CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    printf("opt-in max dynamic shared memory per block: %d\n", optin);
    size_t maxbytes = (size_t)optin, room = BLOCKS * (maxbytes + 1024);
    CHECK(cudaMalloc(&d_in, room));
    CHECK(cudaMalloc(&d_out, room));
    h = (int *)malloc(room);
    EXPECT(h, "malloc");
    for (size_t i = 0; i < room / 4; i++) h[i] = (int)mix32(i, 4);
    CHECK(cudaMemcpy(d_in, h, room, cudaMemcpyHostToDevice));

    printf("1 KiB: %s\n", run(1024, false) ? "ok" : "refused");
    printf("48 KiB: %s\n", run(48 * 1024, false) ? "ok" : "refused");
    bool r = run(96 * 1024, false);
    printf("96 KiB before opt-in: %s\n", r ? "ok" : "refused");
    EXPECT(!r, "96 KiB launch accepted without the opt-in");
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, reverse_block));
    printf("maxDynamicSharedSizeBytes before: %d\n", fa.maxDynamicSharedSizeBytes);
    CHECK(cudaFuncSetAttribute(reverse_block, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
    CHECK(cudaFuncGetAttributes(&fa, reverse_block));
    printf("maxDynamicSharedSizeBytes after: %d\n", fa.maxDynamicSharedSizeBytes);
    r = run(96 * 1024, false);
    printf("96 KiB after opt-in: %s\n", r ? "ok" : "refused");
    EXPECT(r, "96 KiB launch refused after the opt-in");
    r = run(96 * 1024, true);
    printf("96 KiB via cudaLaunchKernel: %s\n", r ? "ok" : "refused");
    EXPECT(r, "cudaLaunchKernel refused");
    CHECK(cudaFuncSetAttribute(reverse_block, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    r = run(maxbytes, false);
    printf("opt-in maximum: %s\n", r ? "ok" : "refused");
    EXPECT(r, "opt-in maximum refused");
    r = run(maxbytes + 1024, false);
    printf("opt-in maximum + 1 KiB: %s\n", r ? "ok" : "refused");
    EXPECT(!r, "launch over the opt-in maximum accepted");
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_out));
    free(h);
    pass();
}
