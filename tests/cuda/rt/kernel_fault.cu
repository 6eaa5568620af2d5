// A kernel fault (a store to an unmapped address) is reported at the next
// synchronisation, not by the launch, and is sticky: every later call returns
// it. Nothing follows the fault in this program.
#include "rt_common.h"

__global__ void ok_k(int *p) { p[threadIdx.x] = threadIdx.x; }
__global__ void bad_k(int *p) { p[threadIdx.x] = 1; }

int main() {
    int *d;
    CHECK(cudaMalloc(&d, 256 * sizeof(int)));
    ok_k<<<1, 256>>>(d);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    int h[256];
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    EXPECT(h[255] == 255, "good kernel wrote %d", h[255]);
    printf("good kernel: ok\n");

    bad_k<<<1, 32>>>((int *)(uintptr_t)0x1000);
    cudaError_t launch = cudaGetLastError();
    printf("fault launch: %s\n", cudaGetErrorName(launch));
    EXPECT(launch == cudaSuccess, "the faulting launch was refused: %s", cudaGetErrorName(launch));
    cudaError_t sync = cudaDeviceSynchronize();
    printf("synchronize: %s\n", cudaGetErrorName(sync));
    EXPECT(sync != cudaSuccess, "the fault was not reported at synchronisation");
    cudaError_t again = cudaDeviceSynchronize();
    cudaError_t peek = cudaPeekAtLastError();
    cudaError_t get = cudaGetLastError();
    cudaError_t get2 = cudaGetLastError();
    void *p = NULL;
    cudaError_t mal = cudaMalloc(&p, 4096);
    cudaError_t cpy = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    printf("synchronize again: %s\n", cudaGetErrorName(again));
    printf("peek: %s, get: %s, get again: %s\n", cudaGetErrorName(peek), cudaGetErrorName(get), cudaGetErrorName(get2));
    printf("cudaMalloc after: %s\n", cudaGetErrorName(mal));
    printf("cudaMemcpy after: %s\n", cudaGetErrorName(cpy));
    EXPECT(again == sync && mal == sync && cpy == sync, "the fault is not sticky");
    printf("sticky: yes\n");
    pass();
}
