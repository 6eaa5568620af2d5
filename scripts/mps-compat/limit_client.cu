// A client for operator.sh: what it sees of its memory limit. Prints the total
// cudaMemGetInfo reports (MiB), whether 1536 MiB can be allocated, and whether 1024 MiB
// more can (past a 2 GiB limit it cannot), then (with `hold`) stays 4 s so that the
// operator's script sees it.
#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <cuda_runtime.h>

int main(int argc, char **argv) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    void *a = nullptr, *b = nullptr;
    cudaError_t ea = cudaMalloc(&a, 1536ull << 20);
    cudaError_t eb = cudaMalloc(&b, 1024ull << 20);
    printf("total %zu MiB; 1536 MiB: %s; 1024 MiB more: %s\n", total_b >> 20,
           cudaGetErrorName(ea), cudaGetErrorName(eb));
    if (argc > 1 && strcmp(argv[1], "hold") == 0) sleep(4);
    cudaFree(a);
    if (eb == cudaSuccess) cudaFree(b);
    return 0;
}
