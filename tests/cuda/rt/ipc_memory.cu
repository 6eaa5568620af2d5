// IPC between two processes: the parent forks before touching CUDA; it fills a buffer,
// exports it with cudaIpcGetMemHandle and sends the handle through a pipe; the child
// opens it, checks and rewrites the data, closes it and answers; the parent sees the
// child's writes. Opening one's own handle is refused.
#include "rt_common.h"
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

__global__ void scale(int *p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= k;
}

static const int N = 1 << 16;

static int child(int rfd, int wfd) {
    cudaIpcMemHandle_t h;
    if (read(rfd, &h, sizeof h) != (ssize_t)sizeof h) return 2;
    int *p = nullptr;
    CHECK(cudaIpcOpenMemHandle((void **)&p, h, cudaIpcMemLazyEnablePeerAccess));
    std::vector<int> v(N);
    CHECK(cudaMemcpy(v.data(), p, N * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += v[i] != i;
    scale<<<N / 256, 256>>>(p, N, 3);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaIpcCloseMemHandle(p));
    char ok = bad == 0 ? 'y' : 'n';
    if (write(wfd, &ok, 1) != 1) return 2;
    return 0;
}

int main() {
    int down[2], up[2];
    if (pipe(down) || pipe(up)) return 2;
    pid_t pid = fork();
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        _exit(child(down[0], up[1]));
    }
    // Only the child holds the write end of `up`: a child that dies unanswered is seen.
    close(down[0]);
    close(up[1]);
    int *p;
    CHECK(cudaMalloc(&p, N * sizeof(int)));
    std::vector<int> v(N);
    for (int i = 0; i < N; i++) v[i] = i;
    CHECK(cudaMemcpy(p, v.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    cudaIpcMemHandle_t h;
    CHECK(cudaIpcGetMemHandle(&h, p));
    int *self = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle((void **)&self, h, cudaIpcMemLazyEnablePeerAccess);
    printf("opening its own handle: %s\n", e == cudaSuccess ? "allowed" : "refused");
    (void)cudaGetLastError();
    if (write(down[1], &h, sizeof h) != (ssize_t)sizeof h) return 2;
    char ok = 0;
    if (read(up[0], &ok, 1) != 1) ok = '?';
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child read the parent's data: %s, child exit %d\n", yes_no(ok == 'y'),
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    EXPECT(ok == 'y', "the child saw other data");
    CHECK(cudaMemcpy(v.data(), p, N * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += v[i] != 3 * i;
    printf("parent sees the child's writes: %s\n", yes_no(bad == 0));
    EXPECT(bad == 0, "%d values not written by the child", bad);
    CHECK(cudaFree(p));
    puts("PASS");
    return 0;
}
