// A device-side assert: its message reaches the program's own output, the
// synchronisation after it reports cudaErrorAssert, and the error is sticky.
// Under omps the message comes back from the server's shared context to the
// client whose kernel asserted. Runs last beside kernel_fault (it ends the context).
#include "rt_common.h"
#include <cassert>

__global__ void check_none_is(const int *v, int n, int bad) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) assert(v[i] != bad);
}

int main() {
    const int n = 256;
    int h[n], *d;
    for (int i = 0; i < n; i++) h[i] = i;
    CHECK(cudaMalloc(&d, sizeof h));
    CHECK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
    check_none_is<<<1, n>>>(d, n, -1);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("no value is -1: no assert\n");
    fflush(stdout);

    // Only thread 200 (value 200) fails, so the message names one block and thread.
    check_none_is<<<1, n>>>(d, n, 200);
    cudaError_t sync = cudaDeviceSynchronize();
    fflush(stdout);
    printf("synchronize after the failing assert: %s\n", cudaGetErrorName(sync));
    EXPECT(sync == cudaErrorAssert, "expected cudaErrorAssert, got %s", cudaGetErrorName(sync));
    cudaError_t again = cudaDeviceSynchronize();
    printf("synchronize again: %s\n", cudaGetErrorName(again));
    EXPECT(again == sync, "the assert is not sticky");
    pass();
}
