// The client roles of the scheduling measures (scripts/sched): one binary, a role per
// invocation, each printing one line of figures. All roles wait for an optional start
// time (ns since the epoch, --start-at) so that processes start their timed part together.
//
//   roles rate SECONDS                      empty kernels, async, on one stream:
//                                           "RATE <launches> <seconds>"
//   roles hog STREAMS KERNEL_MS SECONDS     single-block kernels of KERNEL_MS on STREAMS
//                                           streams, back to back: "HOG <kernels done>"
//   roles lc KERNELS SECONDS [BLOCKS US]    requests of KERNELS small kernels + sync (with
//                                           BLOCKS and US: kernels of BLOCKS x 128 threads
//                                           spinning US each):
//                                           "LC <requests> <p50 us> <p99 us> <max us>"
//   roles be SECONDS [BLOCKS_PER_SM US]     kernels of BLOCKS_PER_SM (16) x 128-thread
//                                           blocks per SM spinning US (100) each, four
//                                           queued at all times:
//                                           "BE <kernels done> <blocks done>"
//   roles startup T0                        a cudaMalloc first thing: "STARTUP <ms since T0>"
//   roles tiny MS                           cudaMalloc, one kernel of MS ms, sync:
//                                           "TINY ok <ms>"
//   roles deep MS N                         a kernel of MS ms, N empty launches behind it
//                                           on its stream, sync: "DEEP <ms>"
//   roles graph KERNELS REPS               a captured graph of KERNELS small kernels,
//                                           launched + synchronized REPS times:
//                                           "GRAPH <p50 us> <p99 us>"
//   roles limit                             a kernel of 264 blocks x 1024 threads spinning
//                                           1 ms each (one wave on 132 SMs), timed:
//                                           "LIMIT <SMs seen> <distinct SMs used> <ms>"
//   roles fair [LAUNCHES EVERY]             LAUNCHES (100) kernels of 64 threads with a
//                                           cudaStreamSynchronize after every EVERY (10):
//                                           "FAIR <s from the start instant to the end>
//                                           <s from its first launch to the end>"
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>
#include <unistd.h>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorName(e_)); exit(1); } } while (0)

__global__ void spin(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
__global__ void empty() {}
__global__ void where(int *smid, long long ns) {
    if (threadIdx.x == 0) {
        int id;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
        smid[blockIdx.x] = id;
    }
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
__global__ void small(float *x) { x[threadIdx.x] = x[threadIdx.x] * 0.5f + 1.0f; }

using clk = std::chrono::steady_clock;
static double secs_since(clk::time_point t) {
    return std::chrono::duration<double>(clk::now() - t).count();
}

static long long now_ns() {
    timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

// One sleep to the instant, not a look every 200 us: 1,024 processes looking that often
// make about 5 million wake-ups a second (estimated, not measured), enough to slow the
// start-up of the last of them on a 16-core machine.
static void wait_start(long long at_ns) {
    if (at_ns <= 0) return;
    timespec at = {(time_t)(at_ns / 1000000000LL), (long)(at_ns % 1000000000LL)};
    while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &at, nullptr) == EINTR) {}
}

int main(int argc, char **argv) {
    long long start_at = 0;
    std::vector<char *> a;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--start-at") && i + 1 < argc) start_at = atoll(argv[++i]);
        else a.push_back(argv[i]);
    }
    if (a.empty()) { fprintf(stderr, "usage: roles rate|hog|lc|be|limit|startup|tiny|deep|graph|fair ARGS [--start-at NS]\n"); return 2; }
    if (!strcmp(a[0], "startup") && a.size() >= 2) {
        // First thing: a cudaMalloc, timed from T0 (ns since the epoch, taken by the
        // harness just before it started this process).
        void *p;
        CK(cudaMalloc(&p, 1 << 20));
        printf("STARTUP %.3f\n", (now_ns() - atoll(a[1])) / 1e6);
        return 0;
    }
    CK(cudaFree(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // First launches (module loading) before the timed part.
    empty<<<1, 1, 0, s>>>();
    spin<<<1, 1, 0, s>>>(1000);
    CK(cudaStreamSynchronize(s));
    const char *role = a[0];
    if (!strcmp(role, "rate") && a.size() >= 2) {
        double sec = atof(a[1]);
        wait_start(start_at);
        auto t = clk::now();
        long long n = 0;
        while (secs_since(t) < sec) {
            for (int i = 0; i < 1000; i++) empty<<<1, 1, 0, s>>>();
            n += 1000;
        }
        CK(cudaStreamSynchronize(s));
        printf("RATE %lld %.6f\n", n, secs_since(t));
    } else if (!strcmp(role, "hog") && a.size() >= 4) {
        int streams = atoi(a[1]);
        long long kernel_ns = (long long)(atof(a[2]) * 1e6);
        double sec = atof(a[3]);
        std::vector<cudaStream_t> ss(streams);
        std::vector<cudaEvent_t> ev(streams);
        for (int i = 0; i < streams; i++) {
            CK(cudaStreamCreateWithFlags(&ss[i], cudaStreamNonBlocking));
            CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
        }
        wait_start(start_at);
        auto t = clk::now();
        long long done = 0;
        // One kernel in flight per stream; each is counted as it completes and replaced.
        for (int i = 0; i < streams; i++) {
            spin<<<1, 1, 0, ss[i]>>>(kernel_ns);
            CK(cudaEventRecord(ev[i], ss[i]));
        }
        while (secs_since(t) < sec) {
            for (int i = 0; i < streams; i++) {
                if (cudaEventQuery(ev[i]) == cudaSuccess) {
                    done++;
                    spin<<<1, 1, 0, ss[i]>>>(kernel_ns);
                    CK(cudaEventRecord(ev[i], ss[i]));
                }
            }
            std::this_thread::sleep_for(std::chrono::microseconds(500));
        }
        printf("HOG %lld\n", done);
        // Waits for the last kernels: under MPS, a client that exits with work running was
        // seen to take the next client down with it (a "fatal GPU error" in its log).
        CK(cudaDeviceSynchronize());
    } else if (!strcmp(role, "lc") && a.size() >= 3) {
        int kernels = atoi(a[1]);
        double sec = atof(a[2]);
        int blocks = a.size() >= 5 ? atoi(a[3]) : 0;
        long long spin_ns = a.size() >= 5 ? (long long)(atof(a[4]) * 1e3) : 0;
        float *x;
        CK(cudaMalloc(&x, 256 * sizeof(float)));
        CK(cudaMemset(x, 0, 256 * sizeof(float)));
        wait_start(start_at);
        std::vector<double> us;
        auto t = clk::now();
        while (secs_since(t) < sec) {
            auto r = clk::now();
            for (int k = 0; k < kernels; k++) {
                if (blocks > 0) spin<<<blocks, 128, 0, s>>>(spin_ns);
                else small<<<1, 256, 0, s>>>(x);
            }
            CK(cudaStreamSynchronize(s));
            us.push_back(std::chrono::duration<double, std::micro>(clk::now() - r).count());
        }
        std::sort(us.begin(), us.end());
        printf("LC %zu %.1f %.1f %.1f\n", us.size(), us[us.size() / 2], us[us.size() * 99 / 100], us.back());
    } else if (!strcmp(role, "be") && a.size() >= 2) {
        double sec = atof(a[1]);
        int per_sm = a.size() >= 3 ? atoi(a[2]) : 16;
        long long spin_ns = (long long)((a.size() >= 4 ? atof(a[3]) : 100.0) * 1e3);
        const int depth = 4;
        cudaEvent_t ev[depth];
        for (auto &e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        wait_start(start_at);
        // Sized by the SMs it may use now, every other client connected (as a server that
        // sizes its grids at each request would).
        int sms = 0;
        CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        auto t = clk::now();
        long long done = 0, queued = 0;
        // Keeps `depth` kernels queued: the GPU never runs dry between them.
        while (secs_since(t) < sec) {
            if (queued - done == depth) {
                CK(cudaEventSynchronize(ev[done % depth]));
                done++;
            }
            spin<<<sms * per_sm, 128, 0, s>>>(spin_ns);
            CK(cudaEventRecord(ev[queued % depth], s));
            queued++;
        }
        printf("BE %lld %lld\n", done, done * sms * per_sm);
        CK(cudaDeviceSynchronize());
    } else if (!strcmp(role, "tiny") && a.size() >= 2) {
        // Many clients at once: each allocates, runs one kernel of MS ms and synchronizes.
        void *p;
        CK(cudaMalloc(&p, 1 << 20));
        wait_start(start_at);
        auto t = clk::now();
        spin<<<2, 32, 0, s>>>((long long)(atof(a[1]) * 1e6));
        CK(cudaStreamSynchronize(s));
        printf("TINY ok %.1f\n", secs_since(t) * 1e3);
    } else if (!strcmp(role, "deep") && a.size() >= 3) {
        // A kernel of MS ms, then N empty launches behind it on the same stream (more
        // than a CUDA stream holds), then a sync: "DEEP <ms>".
        double ms = atof(a[1]);
        int n = atoi(a[2]);
        wait_start(start_at);
        auto t = clk::now();
        spin<<<1, 1, 0, s>>>((long long)(ms * 1e6));
        for (int i = 0; i < n; i++) empty<<<1, 1, 0, s>>>();
        CK(cudaStreamSynchronize(s));
        printf("DEEP %.1f\n", secs_since(t) * 1e3);
    } else if (!strcmp(role, "graph") && a.size() >= 3) {
        // A graph of KERNELS small kernels captured once, then launched + synchronized
        // REPS times: "GRAPH <p50 us> <p99 us>".
        int kernels = atoi(a[1]), reps = atoi(a[2]);
        float *x;
        CK(cudaMalloc(&x, 256 * sizeof(float)));
        cudaGraph_t g;
        cudaGraphExec_t e;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int k = 0; k < kernels; k++) small<<<1, 256, 0, s>>>(x);
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&e, g, 0));
        CK(cudaGraphLaunch(e, s));
        CK(cudaStreamSynchronize(s));
        wait_start(start_at);
        std::vector<double> us;
        for (int r = 0; r < reps; r++) {
            auto t = clk::now();
            CK(cudaGraphLaunch(e, s));
            CK(cudaStreamSynchronize(s));
            us.push_back(std::chrono::duration<double, std::micro>(clk::now() - t).count());
        }
        std::sort(us.begin(), us.end());
        printf("GRAPH %.1f %.1f\n", us[us.size() / 2], us[us.size() * 99 / 100]);
    } else if (!strcmp(role, "fair")) {
        // Fairness among many clients (issue 25): each runs the same short job; the spread
        // of their times is the figure. From the start instant (a client whose start-up
        // ran past it counts that lateness) and from its own first launch.
        int launches = a.size() >= 2 ? atoi(a[1]) : 100;
        int every = a.size() >= 3 ? std::max(1, atoi(a[2])) : 10;
        float *x;
        CK(cudaMalloc(&x, 64 * sizeof(float)));
        CK(cudaMemsetAsync(x, 0, 64 * sizeof(float), s));
        CK(cudaStreamSynchronize(s));
        wait_start(start_at);
        auto t = clk::now();
        long long first_ns = now_ns();
        for (int i = 0; i < launches; i++) {
            small<<<1, 64, 0, s>>>(x);
            if ((i + 1) % every == 0) CK(cudaStreamSynchronize(s));
        }
        CK(cudaStreamSynchronize(s));
        double own = secs_since(t);
        long long from = start_at > 0 ? std::min(start_at, first_ns) : first_ns;
        printf("FAIR %.6f %.6f\n", (now_ns() - from) / 1e9, own);
    } else if (!strcmp(role, "limit")) {
        int sms = 0;
        CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        const int blocks = 264;
        int *d;
        CK(cudaMalloc(&d, blocks * sizeof(int)));
        where<<<blocks, 1024, 0, s>>>(d, 1000);  // warm
        CK(cudaStreamSynchronize(s));
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        float best = 1e9;
        for (int r = 0; r < 5; r++) {
            CK(cudaEventRecord(a, s));
            where<<<blocks, 1024, 0, s>>>(d, 1000000);
            CK(cudaEventRecord(b, s));
            CK(cudaEventSynchronize(b));
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            best = std::min(best, ms);
        }
        std::vector<int> h(blocks);
        CK(cudaMemcpy(h.data(), d, blocks * sizeof(int), cudaMemcpyDeviceToHost));
        std::sort(h.begin(), h.end());
        int distinct = (int)(std::unique(h.begin(), h.end()) - h.begin());
        printf("LIMIT %d %d %.3f\n", sms, distinct, best);
    } else {
        fprintf(stderr, "unknown role or missing arguments: %s\n", role);
        return 2;
    }
    return 0;
}
