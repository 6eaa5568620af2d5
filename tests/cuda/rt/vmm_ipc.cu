// VMM memory shared between two processes, as PyTorch's expandable segments share CUDA
// tensors: the parent forks before touching CUDA; it makes physical memory that may be
// exported as a POSIX descriptor, maps it and fills it, exports the descriptor and sends
// it over a Unix socket (SCM_RIGHTS); the child imports it, maps it in its own
// reservation, checks the data, triples it and answers; the parent sees the child's
// writes, and after it released its own handle the child's mapping still works. Driver
// API calls (the runtime has no VMM calls), made through the runtime's entry point table.
#include "rt_common.h"
#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

__global__ void scale(int *p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= k;
}

// The driver entry points, through cudaGetDriverEntryPointByVersion (no -lcuda needed).
#define DRV(name) static decltype(&name) p_##name;
DRV(cuMemCreate) DRV(cuMemAddressReserve) DRV(cuMemMap) DRV(cuMemSetAccess)
DRV(cuMemExportToShareableHandle) DRV(cuMemImportFromShareableHandle) DRV(cuMemRelease)
DRV(cuMemUnmap) DRV(cuMemAddressFree) DRV(cuMemGetAllocationGranularity)
#undef DRV

static void load() {
#define LOAD(name, ver)                                                                    \
    do {                                                                                   \
        cudaDriverEntryPointQueryResult q;                                                 \
        CHECK(cudaGetDriverEntryPointByVersion(#name, (void **)&p_##name, ver,             \
                                               cudaEnableDefault, &q));                    \
        if (q != cudaDriverEntryPointSuccess) fail("no entry point %s", #name);           \
    } while (0)
    LOAD(cuMemCreate, 10020);
    LOAD(cuMemAddressReserve, 10020);
    LOAD(cuMemMap, 10020);
    LOAD(cuMemSetAccess, 10020);
    LOAD(cuMemExportToShareableHandle, 10020);
    LOAD(cuMemImportFromShareableHandle, 10020);
    LOAD(cuMemRelease, 10020);
    LOAD(cuMemUnmap, 10020);
    LOAD(cuMemAddressFree, 10020);
    LOAD(cuMemGetAllocationGranularity, 10020);
#undef LOAD
}

#define CU(call)                                                                           \
    do {                                                                                   \
        CUresult r_ = (call);                                                              \
        if (r_ != CUDA_SUCCESS) fail("%s at %s:%d returned %d", #call, __FILE__, __LINE__, (int)r_); \
    } while (0)

static const int N = 1 << 18;

static CUmemAllocationProp prop() {
    CUmemAllocationProp p = {};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    return p;
}

// Maps physical memory `h` of `size` bytes at a new reservation, read-write on device 0.
static CUdeviceptr map(CUmemGenericAllocationHandle h, size_t size) {
    CUdeviceptr p;
    CU(p_cuMemAddressReserve(&p, size, 0, 0, 0));
    CU(p_cuMemMap(p, size, 0, h, 0));
    CUmemAccessDesc a = {};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = 0;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(p_cuMemSetAccess(p, size, &a, 1));
    return p;
}

static size_t granular(size_t n) {
    CUmemAllocationProp p = prop();
    size_t g;
    CU(p_cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    return (n + g - 1) / g * g;
}

static int send_fd(int sock, int fd) {
    char c = 'f';
    iovec io = {&c, 1};
    char buf[CMSG_SPACE(sizeof(int))] = {};
    msghdr m = {};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    m.msg_control = buf;
    m.msg_controllen = sizeof buf;
    cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    return sendmsg(sock, &m, 0) == 1 ? 0 : -1;
}

static int recv_fd(int sock) {
    char c;
    iovec io = {&c, 1};
    char buf[CMSG_SPACE(sizeof(int))] = {};
    msghdr m = {};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    m.msg_control = buf;
    m.msg_controllen = sizeof buf;
    if (recvmsg(sock, &m, 0) != 1) return -1;
    cmsghdr *cm = CMSG_FIRSTHDR(&m);
    if (!cm || cm->cmsg_type != SCM_RIGHTS) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(cm), sizeof(int));
    return fd;
}

static int child(int sock) {
    int fd = recv_fd(sock);
    if (fd < 0) return 2;
    CHECK(cudaFree(0));
    load();
    size_t size = granular(N * sizeof(int));
    CUmemGenericAllocationHandle h;
    CU(p_cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    CUdeviceptr p = map(h, size);
    std::vector<int> v(N);
    CHECK(cudaMemcpy(v.data(), (void *)p, N * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += v[i] != i;
    scale<<<N / 256, 256>>>((int *)p, N, 3);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    char ok = bad == 0 ? 'y' : 'n';
    if (write(sock, &ok, 1) != 1) return 2;
    // The parent releases its handle and unmaps; this mapping still reads its memory.
    char go;
    if (read(sock, &go, 1) != 1) return 2;
    CHECK(cudaMemcpy(v.data(), (void *)p, N * sizeof(int), cudaMemcpyDeviceToHost));
    bad = 0;
    for (int i = 0; i < N; i++) bad += v[i] != 3 * i;
    ok = bad == 0 ? 'y' : 'n';
    if (write(sock, &ok, 1) != 1) return 2;
    CU(p_cuMemUnmap(p, size));
    CU(p_cuMemAddressFree(p, size));
    CU(p_cuMemRelease(h));
    return 0;
}

int main() {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 2;
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        _exit(child(sv[1]));
    }
    close(sv[1]);
    CHECK(cudaFree(0));
    load();
    size_t size = granular(N * sizeof(int));
    CUmemAllocationProp pr = prop();
    CUmemGenericAllocationHandle h;
    CU(p_cuMemCreate(&h, size, &pr, 0));
    CUdeviceptr p = map(h, size);
    std::vector<int> v(N);
    for (int i = 0; i < N; i++) v[i] = i;
    CHECK(cudaMemcpy((void *)p, v.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    int fd = -1;
    CU(p_cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    if (send_fd(sv[0], fd)) return 2;
    close(fd);
    char ok = 0;
    if (read(sv[0], &ok, 1) != 1) ok = '?';
    printf("child read the parent's data: %s\n", ok == 'y' ? "yes" : "no");
    CHECK(cudaMemcpy(v.data(), (void *)p, N * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += v[i] != 3 * i;
    printf("parent sees the child's writes: %s\n", bad == 0 ? "yes" : "no");
    CU(p_cuMemUnmap(p, size));
    CU(p_cuMemAddressFree(p, size));
    CU(p_cuMemRelease(h));
    char go = 'g';
    if (write(sv[0], &go, 1) != 1) return 2;
    if (read(sv[0], &ok, 1) != 1) ok = '?';
    printf("child's mapping outlives the parent's release: %s\n", ok == 'y' ? "yes" : "no");
    int st = 0;
    waitpid(pid, &st, 0);
    printf("child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    if (ok != 'y' || bad || !WIFEXITED(st) || WEXITSTATUS(st)) fail("sharing failed");
    pass();
}
