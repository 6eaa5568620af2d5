// Device-side printf: the output of kernels appears on the program's stdout,
// in order with the host's own lines (stdout is flushed around each kernel).
#include "rt_common.h"

__global__ void say(int k, const char *tag) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        printf("device: kernel %d says %s\n", k, tag);
        printf("device: int %d, long long %lld, unsigned %u, hex %x\n", -k, 1234567890123ll * k, 4000000000u, 0xbeefu);
        printf("device: float %.3f, double %.6f, char %c, string %s\n", 1.5f * k, 3.141592653589793 / k, 'A' + k, "ok");
    }
}

__global__ void lines(int n) {
    if (threadIdx.x == 0)
        for (int i = 0; i < n; i++) printf("device: line %d of %d\n", i + 1, n);
}

int main() {
    char *tag;
    CHECK(cudaMalloc(&tag, 16));
    CHECK(cudaMemcpy(tag, "hello", 6, cudaMemcpyHostToDevice));
    for (int k = 1; k <= 3; k++) {
        printf("host: before kernel %d\n", k);
        fflush(stdout);
        say<<<2, 64>>>(k, tag);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        fflush(stdout);
        printf("host: after kernel %d\n", k);
    }
    fflush(stdout);
    lines<<<1, 32>>>(5);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    fflush(stdout);

    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    say<<<1, 32, 0, s>>>(7, tag);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));
    fflush(stdout);
    printf("host: after the stream's kernel\n");
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(tag));
    pass();
}
