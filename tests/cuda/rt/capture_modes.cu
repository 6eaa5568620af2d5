// What a stream capture's mode forbids, and to whom: while the main thread captures in
// global, thread-local or relaxed mode, another thread (and the capturing thread itself)
// makes calls the CUDA guide calls potentially unsafe, each with its own capture. Each
// call's result is printed, and how the capture ended. The other thread may exchange its
// own mode (cudaThreadExchangeStreamCaptureMode) to relaxed.
#include "rt_common.h"
#include <functional>
#include <thread>

static void *dev_buf, *host_buf, *to_free;
static bool freed;
static char pageable[4096];
static cudaStream_t side;
static cudaEvent_t ev;

struct Call {
    const char *name;
    std::function<cudaError_t()> run;
};

static const Call calls[] = {
    {"cudaMalloc", [] { void *p; cudaError_t r = cudaMalloc(&p, 256); if (r == cudaSuccess) cudaFree(p); return r; }},
    {"cudaMemcpy H2D", [] { return cudaMemcpy(dev_buf, host_buf, 64, cudaMemcpyHostToDevice); }},
    {"cudaMemset", [] { return cudaMemset(dev_buf, 0, 64); }},
    {"cudaMallocHost", [] { void *p; cudaError_t r = cudaMallocHost(&p, 256); if (r == cudaSuccess) cudaFreeHost(p); return r; }},
    {"cudaStreamSynchronize(other)", [] { return cudaStreamSynchronize(side); }},
    {"cudaEventQuery(other)", [] { return cudaEventQuery(ev); }},
    {"cudaMemGetInfo", [] { size_t f, t; return cudaMemGetInfo(&f, &t); }},
    {"cudaMemcpyAsync(other)", [] { return cudaMemcpyAsync(dev_buf, host_buf, 64, cudaMemcpyHostToDevice, side); }},
    {"cudaFree", [] { cudaError_t r = cudaFree(to_free); freed = r == cudaSuccess; return r; }},
    {"cudaMallocPitch", [] { void *p; size_t pitch; cudaError_t r = cudaMallocPitch(&p, &pitch, 64, 4); if (r == cudaSuccess) cudaFree(p); return r; }},
    {"cudaStreamQuery(other)", [] { return cudaStreamQuery(side); }},
    {"cudaEventSynchronize(other)", [] { return cudaEventSynchronize(ev); }},
    {"cudaHostRegister", [] { cudaError_t r = cudaHostRegister(pageable, sizeof pageable, 0); if (r == cudaSuccess) cudaHostUnregister(pageable); return r; }},
    {"cudaMemcpy D2H pageable", [] { return cudaMemcpy(pageable, dev_buf, 64, cudaMemcpyDeviceToHost); }},
};

__global__ void k(int *p) { p[0] = 1; }

static const char *mode_name(cudaStreamCaptureMode m) {
    return m == cudaStreamCaptureModeGlobal ? "global" : m == cudaStreamCaptureModeThreadLocal ? "thread-local" : "relaxed";
}

int main() {
    CHECK(cudaMalloc(&dev_buf, 4096));
    CHECK(cudaMallocHost(&host_buf, 4096));
    CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&ev));
    CHECK(cudaEventRecord(ev, side));
    CHECK(cudaStreamSynchronize(side));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const cudaStreamCaptureMode modes[] = {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                                           cudaStreamCaptureModeRelaxed};
    for (cudaStreamCaptureMode mode : modes) {
        // who: 0 the capturing thread, 1 another thread, 2 another thread in relaxed mode.
        for (int who = 0; who < 3; who++) {
            for (const Call &c : calls) {
                CHECK(cudaMalloc(&to_free, 256));
                freed = false;
                CHECK(cudaStreamBeginCapture(s, mode));
                k<<<1, 1, 0, s>>>((int *)dev_buf);
                cudaError_t r;
                if (who == 0) {
                    r = c.run();
                } else {
                    std::thread t([&] {
                        if (who == 2) {
                            cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
                            cudaThreadExchangeStreamCaptureMode(&m);
                        }
                        r = c.run();
                    });
                    t.join();
                }
                cudaGraph_t g = nullptr;
                cudaError_t end = cudaStreamEndCapture(s, &g);
                if (g) cudaGraphDestroy(g);
                printf("%s capture, %s: %s -> %s; capture ended %s\n", mode_name(mode),
                       who == 0 ? "capturing thread" : who == 1 ? "other thread" : "other thread (relaxed)", c.name,
                       cudaGetErrorName(r), cudaGetErrorName(end));
                cudaGetLastError();
                CHECK(cudaStreamSynchronize(side));
                if (!freed) CHECK(cudaFree(to_free));
            }
        }
    }
    // An unsafe call invalidates the capture that forbade it, which stays unended (PyTorch's
    // tests leave such a capture behind and go on): what may the process do until it ends?
    for (cudaStreamCaptureMode mode : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal}) {
        CHECK(cudaStreamBeginCapture(s, mode));
        k<<<1, 1, 0, s>>>((int *)dev_buf);
        cudaError_t first = cudaDeviceSynchronize();
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        cudaError_t is = cudaStreamIsCapturing(s, &st);
        cudaError_t again = cudaDeviceSynchronize();
        void *p = nullptr;
        cudaError_t m = cudaMalloc(&p, 256);
        if (m == cudaSuccess) cudaFree(p);
        cudaError_t other = cudaSuccess;
        std::thread t([&] { other = cudaDeviceSynchronize(); });
        t.join();
        k<<<1, 1, 0, s>>>((int *)dev_buf);
        cudaError_t launch = cudaGetLastError();
        cudaGraph_t g = nullptr;
        cudaError_t end = cudaStreamEndCapture(s, &g);
        if (g) cudaGraphDestroy(g);
        printf("%s capture invalidated by a sync: %s; status %d (%s); sync again %s; malloc %s; "
               "other thread's sync %s; launch into it %s; capture ended %s\n",
               mode_name(mode), cudaGetErrorName(first), (int)st, cudaGetErrorName(is), cudaGetErrorName(again),
               cudaGetErrorName(m), cudaGetErrorName(other), cudaGetErrorName(launch), cudaGetErrorName(end));
        cudaGetLastError();
        CHECK(cudaDeviceSynchronize());
    }
    // The exchange returns the mode it replaces.
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&m));
    printf("default mode was %s\n", mode_name(m));
    CHECK(cudaThreadExchangeStreamCaptureMode(&m));
    printf("then %s\n", mode_name(m));
    CHECK(cudaDeviceSynchronize());
    pass();
}
