// Copy bandwidth between two GPUs: cudaMemcpyPeer of 256 MiB, 0 -> 1 and 1 -> 0, before
// and after peer access is enabled, and a kernel on 0 reading 1's memory in place. Prints GB/s (the
// best of 5) on stdout as "peer_bw <what> <GB/s>".
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>

#define CK(c) do { cudaError_t e_ = (c); if (e_ != cudaSuccess) { \
    printf("FAIL %s: %s\n", #c, cudaGetErrorName(e_)); return 1; } } while (0)

static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

__global__ void touch(const float4 *p, size_t n, float *out) {
    float acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += p[i].x + p[i].w;
    if (acc == 12345.f) *out = acc;
}

int main() {
    int count = 0;
    CK(cudaGetDeviceCount(&count));
    if (count < 2) { printf("peer_bw needs two devices\n"); return 1; }
    const size_t bytes = 256ull << 20;
    void *a, *b; float *out;
    CK(cudaSetDevice(0)); CK(cudaMalloc(&a, bytes)); CK(cudaMalloc(&out, 4)); CK(cudaMemset(a, 1, bytes));
    CK(cudaSetDevice(1)); CK(cudaMalloc(&b, bytes)); CK(cudaMemset(b, 2, bytes));
    int can = 0;
    CK(cudaDeviceCanAccessPeer(&can, 0, 1));
    for (int enabled = 0; enabled < 2; enabled++) {
        if (enabled) {
            if (!can) break;
            CK(cudaSetDevice(0)); CK(cudaDeviceEnablePeerAccess(1, 0));
            CK(cudaSetDevice(1)); CK(cudaDeviceEnablePeerAccess(0, 0));
        }
        for (int dir = 0; dir < 2; dir++) {
            double best = 1e9;
            for (int r = 0; r < 6; r++) {
                double t0 = now();
                if (dir == 0) CK(cudaMemcpyPeer(b, 1, a, 0, bytes)); else CK(cudaMemcpyPeer(a, 0, b, 1, bytes));
                CK(cudaDeviceSynchronize());
                double t = now() - t0;
                if (r > 0 && t < best) best = t;
            }
            printf("peer_bw memcpy_peer_%s%s %.1f\n", dir == 0 ? "0to1" : "1to0",
                   enabled ? "_enabled" : "", bytes / best / 1e9);
        }
    }
    if (can) {
        CK(cudaSetDevice(0));
        double best = 1e9;
        for (int r = 0; r < 6; r++) {
            double t0 = now();
            touch<<<528, 512>>>((const float4 *)b, bytes / 16, out);
            CK(cudaDeviceSynchronize());
            double t = now() - t0;
            if (r > 0 && t < best) best = t;
        }
        printf("peer_bw kernel_reads_peer %.1f\n", bytes / best / 1e9);
    } else {
        printf("peer_bw kernel_reads_peer none\n");
    }
    return 0;
}
