// Error names and strings for a few codes, and errors from real calls:
// cudaGetLastError / cudaPeekAtLastError semantics for non-sticky errors.
#include "rt_common.h"

int main() {
    const cudaError_t codes[] = {
        cudaSuccess, cudaErrorInvalidValue, cudaErrorMemoryAllocation, cudaErrorInitializationError,
        cudaErrorInvalidConfiguration, cudaErrorInvalidDevice, cudaErrorInvalidMemcpyDirection,
        cudaErrorNotReady, cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorNoDevice,
        cudaErrorInvalidResourceHandle, cudaErrorNotSupported, cudaErrorCooperativeLaunchTooLarge,
        (cudaError_t)12345};
    for (cudaError_t c : codes) printf("%d %s: %s\n", (int)c, cudaGetErrorName(c), cudaGetErrorString(c));

    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(0));  // initialise
    CHECK(cudaGetLastError());

    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, (size_t)1 << 60);
    printf("cudaMalloc(2^60): %s\n", cudaGetErrorName(e));
    EXPECT(e == cudaErrorMemoryAllocation, "cudaMalloc(2^60) gave %s", cudaGetErrorName(e));
    printf("peek: %s\n", cudaGetErrorName(cudaPeekAtLastError()));
    printf("peek again: %s\n", cudaGetErrorName(cudaPeekAtLastError()));
    printf("get: %s\n", cudaGetErrorName(cudaGetLastError()));
    printf("get again: %s\n", cudaGetErrorName(cudaGetLastError()));

    int n = 0;
    CHECK(cudaGetDeviceCount(&n));
    e = cudaSetDevice(n + 7);
    EXPECT(e != cudaSuccess, "cudaSetDevice(%d) succeeded", n + 7);
    report_err("cudaSetDevice(count + 7)", e);

    int *d = NULL;
    CHECK(cudaMalloc(&d, 64));
    int h[16] = {0};
    e = cudaMemcpy(h, d, 64, (cudaMemcpyKind)99);
    EXPECT(e != cudaSuccess, "cudaMemcpy with kind 99 succeeded");
    report_err("cudaMemcpy(kind 99)", e);

    e = cudaFree((void *)(uintptr_t)0x1234);
    report_err("cudaFree(bogus)", e);

    cudaStream_t s;
    e = cudaStreamCreateWithFlags(&s, 0x80);
    report_err("cudaStreamCreateWithFlags(0x80)", e);
    if (e == cudaSuccess) CHECK(cudaStreamDestroy(s));

    // nothing above is sticky: the context still works
    CHECK(cudaMemset(d, 0x5a, 64));
    CHECK(cudaMemcpy(h, d, 64, cudaMemcpyDeviceToHost));
    EXPECT(h[15] == 0x5a5a5a5a, "memset after errors gave 0x%08x", h[15]);
    CHECK(cudaFree(d));
    CHECK(cudaDeviceSynchronize());
    printf("after errors: %s\n", cudaGetErrorName(cudaGetLastError()));
    pass();
}
