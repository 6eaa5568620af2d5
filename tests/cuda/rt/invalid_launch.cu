// Invalid launches (too many threads, too large a grid or block dimension, too
// much shared memory) return their error synchronously, from the launch itself
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

    // CUDA 13 (driver 580) reports these as cudaErrorInvalidValue, older
    // releases as cudaErrorInvalidConfiguration: only "refused" is checked here,
    // the names are compared with the native run's
    k<<<1, 2048>>>(d);
    EXPECT(after_launch("2048 threads per block") != cudaSuccess, "2048 threads accepted");
    k<<<1, dim3(1, 1, 128)>>>(d);
    EXPECT(after_launch("block z = 128") != cudaSuccess, "block z = 128 accepted");
    k<<<dim3(1, 70000), 1>>>(d);
    EXPECT(after_launch("grid y = 70000") != cudaSuccess, "grid y = 70000 accepted");
    k<<<1, 32, 1 << 20>>>(d);
    EXPECT(after_launch("1 MiB dynamic shared memory") != cudaSuccess, "1 MiB smem accepted");
    k<<<0, 32>>>(d);
    after_launch("empty grid");  // runs nothing either way
    bounded<<<1, 256>>>(d);
    int extra = after_launch("256 threads, launch bounds 128") == cudaSuccess ? 256 : 0;
    void *args[] = {&d};
    cudaError_t e = cudaLaunchKernel((const void *)k, dim3(1), dim3(1025), args, 0, 0);
    printf("cudaLaunchKernel 1025 threads returns: %s\n", cudaGetErrorName(e));
    EXPECT(e != cudaSuccess, "cudaLaunchKernel 1025 threads accepted");
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
    EXPECT(sum == 4096 + 128 + 128 + extra, "sum %d", sum);
    printf("sync after all: %s\n", cudaGetErrorName(cudaDeviceSynchronize()));
    CHECK(cudaFree(d));
    pass();
}
