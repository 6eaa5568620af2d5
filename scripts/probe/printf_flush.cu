// Probe: when does the driver write device-side printf output, and where to?
// omps's server owns the only context, so it must know which of its calls make the
// driver flush the printf FIFO, whether the text goes through stdio or straight to fd 1,
// and whether a flush on one stream or thread empties the whole context's FIFO.
//
//   nvcc -arch=sm_90 -o printf_flush printf_flush.cu -lpthread && ./printf_flush
//
// fd 1 is replaced by a pipe that a reader thread drains; the report goes to stderr.
#include <cuda_runtime.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <unistd.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)

static std::atomic<long> g_bytes{0};
static char g_text[1 << 16];

__global__ void say(int tag) {
    if (threadIdx.x == 0 && blockIdx.x == 0) printf("tag %d\n", tag);
}

__global__ void spin(long long ns) {
    long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > ns) break;
    }
}

static void reader(int fd) {
    char buf[4096];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) return;
        long at = g_bytes.load();
        if (at + n < (long)sizeof g_text) memcpy(g_text + at, buf, n);
        g_bytes.fetch_add(n);
    }
}

static long settle() { usleep(30000); return g_bytes.load(); }

static int wait_done(cudaEvent_t e) {
    while (cudaEventQuery(e) == cudaErrorNotReady) usleep(100);
    return 0;
}

// One experiment: launch a printf kernel on `s`, wait for it by polling an event (no
// synchronizing call), then run `flush` and report whether bytes appeared, before and
// after the program's own fflush(stdout).
template <class F>
static int trial(const char *name, int tag, cudaStream_t s, F flush) {
    cudaEvent_t e;
    CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    long b0 = g_bytes.load();
    say<<<1, 32, 0, s>>>(tag);
    CK(cudaGetLastError());
    CK(cudaEventRecord(e, s));
    wait_done(e);
    long b1 = settle();
    auto t0 = std::chrono::steady_clock::now();
    flush();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    long b2 = settle();
    fflush(stdout);
    long b3 = settle();
    fprintf(stderr, "%-44s after poll %4ld B, after call %4ld B (%.1f us), after fflush %4ld B\n",
            name, b1 - b0, b2 - b0, us, b3 - b0);
    CK(cudaEventDestroy(e));
    return 0;
}

int main() {
    int p[2];
    if (pipe(p) != 0) return 1;
    fprintf(stderr, "stdout is %s before the swap\n", isatty(1) ? "a tty" : "not a tty");
    dup2(p[1], 1);
    std::thread rd(reader, p[0]);
    CK(cudaFree(0));
    cudaStream_t a, b, c;
    CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
    cudaEvent_t done;
    CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CK(cudaEventRecord(done, b));

    trial("nothing (usleep only)", 1, a, [] {});
    trial("cudaStreamQuery(other idle stream)", 2, a, [&] { cudaStreamQuery(b); });
    trial("cudaEventQuery(completed event)", 3, a, [&] { cudaEventQuery(done); });
    trial("cudaEventSynchronize(completed event)", 4, a, [&] { cudaEventSynchronize(done); });
    trial("cudaStreamSynchronize(other idle stream)", 5, a, [&] { cudaStreamSynchronize(b); });
    trial("cudaStreamSynchronize(the kernel's stream)", 6, a, [&] { cudaStreamSynchronize(a); });
    trial("cudaDeviceSynchronize", 7, a, [&] { cudaDeviceSynchronize(); });
    trial("cudaStreamSynchronize(idle) in another thread", 8, a, [&] {
        std::thread t([&] { cudaStreamSynchronize(b); });
        t.join();
    });
    // A long kernel on c keeps the context busy: does a sync of an idle stream still
    // flush, and how long does it take?
    spin<<<1, 32, 0, c>>>(300000000ll);
    trial("busy ctx: cudaStreamSynchronize(idle b)", 9, a, [&] { cudaStreamSynchronize(b); });
    trial("busy ctx: cudaEventSynchronize(done)", 10, a, [&] { cudaEventSynchronize(done); });
    trial("busy ctx: cudaDeviceSynchronize", 11, a, [&] { cudaDeviceSynchronize(); });
    // Which printf records does a flush take: several kernels on several streams.
    {
        cudaEvent_t e1, e2;
        CK(cudaEventCreate(&e1));
        CK(cudaEventCreate(&e2));
        long b0 = g_bytes.load();
        say<<<1, 32, 0, a>>>(12);
        CK(cudaEventRecord(e1, a));
        say<<<1, 32, 0, c>>>(13);
        CK(cudaEventRecord(e2, c));
        wait_done(e1);
        wait_done(e2);
        cudaStreamSynchronize(b);
        fflush(stdout);
        long b1 = settle();
        fprintf(stderr, "two streams, one idle-stream sync: %ld B\n", b1 - b0);
    }
    fflush(stdout);
    settle();
    long n = g_bytes.load();
    fprintf(stderr, "--- all text seen on fd 1 (%ld B):\n%.*s--- end\n", n, (int)(n < (long)sizeof g_text ? n : 0), g_text);
    return 0;
}
