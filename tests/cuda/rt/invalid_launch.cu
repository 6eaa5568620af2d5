// Invalid launches return their error synchronously, from the launch itself
// (cudaGetLastError / cudaPeekAtLastError right after <<<>>>), and are not
// sticky: valid work afterwards runs and synchronises without error.
#include "rt_common.h"

__global__ void k(int *p) { p[blockIdx.x * blockDim.x + threadIdx.x] += 1; }
__global__ void __launch_bounds__(128) bounded(int *p) { p[threadIdx.x] += 1; }

static cudaError_t after_launch(const char *what) {
    cudaError_t peek = cudaPeekAtLastError();
    cudaError_t peek2 = cudaPeekAtLastError();
    cudaError_t get = cudaGetLastError();
    cudaError_t again = cudaGetLastError();
    printf("%s: peek %s, peek again %s, get %s, get again %s\n", what, cudaGetErrorName(peek),
           cudaGetErrorName(peek2), cudaGetErrorName(get), cudaGetErrorName(again));
    EXPECT(peek == get && peek2 == get && again == cudaSuccess, "%s: last-error semantics", what);
    return get;
}

int main() {
    int *d;
    CHECK(cudaMalloc(&d, 4096 * sizeof(int)));
    CHECK(cudaMemset(d, 0, 4096 * sizeof(int)));

    k<<<1, 2048>>>(d);
    EXPECT(after_launch("2048 threads per block") == cudaErrorInvalidConfiguration, "2048 threads");
    k<<<1, dim3(1, 1, 128)>>>(d);
    EXPECT(after_launch("block z = 128") == cudaErrorInvalidConfiguration, "block z");
    k<<<dim3(1, 70000), 1>>>(d);
    EXPECT(after_launch("grid y = 70000") == cudaErrorInvalidConfiguration, "grid y");
    k<<<0, 32>>>(d);
    EXPECT(after_launch("empty grid") == cudaErrorInvalidConfiguration, "empty grid");
    k<<<1, 32, 1 << 20>>>(d);
    EXPECT(after_launch("1 MiB dynamic shared memory") != cudaSuccess, "1 MiB smem");
    bounded<<<1, 256>>>(d);
    EXPECT(after_launch("256 threads, launch bounds 128") != cudaSuccess, "launch bounds");
    void *args[] = {&d};
    cudaError_t e = cudaLaunchKernel((const void *)k, dim3(1), dim3(1025), args, 0, 0);
    printf("cudaLaunchKernel 1025 threads returns: %s\n", cudaGetErrorName(e));
    EXPECT(e == cudaErrorInvalidConfiguration, "cudaLaunchKernel 1025 threads");
    after_launch("after cudaLaunchKernel");
    e = cudaLaunchKernel((const void *)&e, dim3(1), dim3(1), args, 0, 0);  // not a kernel
    EXPECT(e != cudaSuccess, "launched a non-kernel");
    report_err("cudaLaunchKernel of a non-kernel pointer", e);

    // the context is fine: valid launches work and nothing is reported at sync
    k<<<4, 1024>>>(d);
    CHECK_LAUNCH();
    bounded<<<1, 128>>>(d);
    CHECK_LAUNCH();
    CHECK(cudaLaunchKernel((const void *)k, dim3(2), dim3(64), args, 0, 0));
    CHECK(cudaDeviceSynchronize());
    int h[4096];
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    int sum = 0;
    for (int i = 0; i < 4096; i++) sum += h[i];
    printf("valid launches after the invalid ones: sum %d\n", sum);
    EXPECT(sum == 4096 + 128 + 128, "sum %d", sum);
    printf("sync after all: %s\n", cudaGetErrorName(cudaDeviceSynchronize()));
    CHECK(cudaFree(d));
    pass();
}
