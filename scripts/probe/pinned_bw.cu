// Probe: H2D bandwidth from the kinds of pinned memory omps could use. omps's pinned
// memory is a memfd that both processes map and the server registers; is DMA from it
// as fast as from the driver's own cuMemHostAlloc memory, and do huge pages matter?
//
//   nvcc -arch=sm_90 -o pinned_bw pinned_bw.cu -lcuda && ./pinned_bw
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s: %d\n", #x, r_); return 1; } } while (0)

static const size_t BIG = 256u << 20;

static int bw(const char *what, void *host, CUdeviceptr d, CUstream s) {
    memset(host, 3, BIG);
    CK(cuMemcpyHtoDAsync(d, host, BIG, s));
    CK(cuStreamSynchronize(s));
    double best = 0, sum = 0;
    for (int i = 0; i < 5; i++) {
        auto t = std::chrono::steady_clock::now();
        CK(cuMemcpyHtoDAsync(d, host, BIG, s));
        CK(cuStreamSynchronize(s));
        double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
        double gbs = BIG / sec / 1e9;
        sum += gbs;
        if (gbs > best) best = gbs;
    }
    printf("%-44s mean %6.2f GB/s, best %6.2f\n", what, sum / 5, best);
    return 0;
}

int main() {
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr d;
    CK(cuMemAlloc(&d, BIG));
    for (int round = 0; round < 2; round++) {
        void *h;
        CK(cuMemHostAlloc(&h, BIG, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
        bw("cuMemHostAlloc", h, d, s);
        CK(cuMemFreeHost(h));
        for (int huge = 0; huge < 2; huge++) {
            int fd = memfd_create("probe", MFD_CLOEXEC);
            if (fd < 0 || ftruncate(fd, BIG) != 0) return 1;
            void *m = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m == MAP_FAILED) return 1;
            if (huge) madvise(m, BIG, MADV_HUGEPAGE);
            CK(cuMemHostRegister(m, BIG, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
            bw(huge ? "memfd + MADV_HUGEPAGE, registered" : "memfd, registered (as omps)", m, d, s);
            CK(cuMemHostUnregister(m));
            munmap(m, BIG);
            close(fd);
        }
        void *a = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        madvise(a, BIG, MADV_HUGEPAGE);
        CK(cuMemHostRegister(a, BIG, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
        bw("anonymous + MADV_HUGEPAGE, registered", a, d, s);
        CK(cuMemHostUnregister(a));
        munmap(a, BIG);
    }
    printf("PASS\n");
    return 0;
}
