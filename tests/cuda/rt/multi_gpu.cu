// Several GPUs from one process: every device the process sees gets its own buffers and
// kernels, all in flight at once (a stream per device); each result is copied to the next
// device with cudaMemcpyPeer and checked there too. Prints the device count, each peer
// copy, and each device's name and checksum.
#include "rt_common.h"

__global__ void fill(unsigned *p, int n, unsigned salt) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = (unsigned)i * 2654435761u ^ salt;
}

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    printf("devices: %d\n", count);
    const int n = 1 << 22;
    unsigned *d[16] = {0}, *h[16] = {0};
    cudaStream_t s[16];
    EXPECT(count >= 1 && count <= 16, "device count %d", count);
    for (int g = 0; g < count; g++) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaStreamCreateWithFlags(&s[g], cudaStreamNonBlocking));
        CHECK(cudaMalloc(&d[g], n * sizeof(unsigned)));
        CHECK(cudaMallocHost(&h[g], n * sizeof(unsigned)));
        fill<<<256, 256, 0, s[g]>>>(d[g], n, 0x9e3779b9u * (g + 1));
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(h[g], d[g], n * sizeof(unsigned), cudaMemcpyDeviceToHost, s[g]));
    }
    for (int g = 0; g < count; g++) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaStreamSynchronize(s[g]));
    }
    // Each device's buffer copied to the next device (cudaMemcpyPeer), then back into the
    // host and checked: copies between GPUs, whatever the link between them.
    for (int g = 0; count > 1 && g < count; g++) {
        int to = (g + 1) % count;
        unsigned *tmp = 0;
        CHECK(cudaSetDevice(to));
        CHECK(cudaMalloc(&tmp, n * sizeof(unsigned)));
        CHECK(cudaMemcpyPeer(tmp, to, d[g], g, n * sizeof(unsigned)));
        unsigned *back = (unsigned *)malloc(n * sizeof(unsigned));
        EXPECT(back, "malloc");
        CHECK(cudaMemcpy(back, tmp, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
        EXPECT(memcmp(back, h[g], n * sizeof(unsigned)) == 0, "peer copy %d -> %d", g, to);
        printf("peer copy %d -> %d: ok\n", g, to);
        free(back);
        CHECK(cudaFree(tmp));
    }
    for (int g = 0; g < count; g++) {
        CHECK(cudaSetDevice(g));
        cudaDeviceProp p;
        CHECK(cudaGetDeviceProperties(&p, g));
        for (int i = 0; i < n; i++)
            EXPECT(h[g][i] == ((unsigned)i * 2654435761u ^ (0x9e3779b9u * (g + 1))), "device %d element %d", g, i);
        printf("device %d: %s, checksum %08x\n", g, p.name, fnv1a(h[g], n * sizeof(unsigned)));
        CHECK(cudaFreeHost(h[g]));
        CHECK(cudaFree(d[g]));
        CHECK(cudaStreamDestroy(s[g]));
    }
    pass();
}
