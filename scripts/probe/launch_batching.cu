// launch_batching.cu: empty kernels per second that ONE process, in ONE (primary) context, gets
// from T submitting threads (T = 1, 4, 8, 16), each on its own stream; and how much of that
// context's ceiling turning runs of launches into graph launches lifts.
//
// Why it exists (issue 25, item 1): omps's lanes submit every client's work into one context per
// GPU. scripts/probe/launch_scaling.cu found that context's cuLaunchKernel ceiling at about 680k/s
// (301k from 1 thread, 539k from 4, 671k from 8-12; 695k with a green context per thread), while
// MPS, a context per client, reaches ~1M/s. Before the server commits to a way past it, this
// measures each way the issue lists. What each row tells the server, and how a lane would use it:
// docs/benchmarks.md, "launch rate: what one context allows (probe, to be run)".
//
// Variants (every row counts KERNELS, not calls; each thread's streams are synchronized at the end
// of its window and that time is included; "host us per kernel" is the submitting threads' time in
// their loops, summed, per kernel: a thread-time cost, not a latency; the kernel's one pointer
// argument goes as the server passes arguments, a packed buffer through `extra`):
//   a  plain cuLaunchKernel per kernel, as the lanes submit today
//   b  as a, each thread's stream in a green context of its own over every SM; b+wq also gives each
//      green context a balanced work-queue configuration (CUDA 13.1 header and driver, else skipped)
//   c  one cuGraphLaunch per K kernels: a graph of K chained kernel nodes, built and instantiated
//      once per (thread, K) before the window (the cache), launched with the same params
//   d  as c, but every node's argument is changed with cuGraphExecKernelNodeSetParams before each
//      launch (what a lane must do when a client's launches differ in their arguments)
//   e  as c, the K nodes independent (no edges): they may run concurrently, which a stream would
//      not allow, so this row is a ceiling only
//   f  cuLaunchKernelEx (no attributes) from each thread over 4 streams of its own, round robin
//   h  host cost per call, one thread, stream drained between timed rounds: cuLaunchKernel,
//      cuLaunchKernelEx, cuGraphLaunch, cuGraphExecKernelNodeSetParams, build + instantiate
//
//   nvcc -O2 -arch=sm_90 -o launch_batching scripts/probe/launch_batching.cu -lcuda -lpthread
//   ./launch_batching [seconds per cell, default 1] [variant letters, default abcdefh]
//   (scripts/probe/launch_batching.sh builds it and runs everything in ~1.5 min.)
#include <cuda.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

// One pointer argument, never dereferenced: the update in d changes a real parameter.
static const char *PTX = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 p) { ret; }
)";

static const char *en(CUresult r) {
    const char *s = nullptr;
    return (cuGetErrorName(r, &s) == CUDA_SUCCESS && s) ? s : "UNKNOWN_ERROR";
}
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, en(r_)); exit(1); } } while (0)

typedef std::chrono::steady_clock clk;
static double since(clk::time_point a) { return std::chrono::duration<double>(clk::now() - a).count(); }

static CUdevice dev;
static CUcontext prim;
static CUfunction fn;
static double SECS = 1.0;
static const int CHUNK = 1024;  // kernels a thread submits between two looks at the clock

static std::string commas(double v) {
    std::string s = std::to_string((long long)(v + 0.5)), o;
    for (int n = (int)s.size(), i = 0; i < n; i++) o += s[i] + std::string((n - 1 - i) % 3 == 0 && i != n - 1, ',');
    return o;
}

// The kernel's argument, passed as omps-server passes every launch's (gpu/cuda/launch.rs): one
// packed buffer through `extra`, never kernelParams. Not copyable: extra points into itself.
struct Args {
    CUdeviceptr arg = 0;
    size_t size = sizeof(CUdeviceptr);
    void *extra[5] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &arg, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    void *params[1] = {&arg};  // graph nodes fall back to this if they refuse `extra`
    Args() = default;
    Args(const Args &) = delete;
    Args &operator=(const Args &) = delete;
};
struct Thr {  // one submitting thread's own things
    std::vector<CUstream> s;
    CUdeviceptr buf = 0;  // the kernel's argument points into this (4 KiB, never touched)
    Args a;
};

// ---- one timed cell: T threads, each running step() until the common deadline -------------------
struct Res { long long kernels = 0; double rate = 0, host_us = 0; CUresult err = CUDA_SUCCESS; };
typedef std::function<CUresult(int, long long &)> Step;  // (thread, kernels so far) -> error

static Res run_cell(const std::vector<CUcontext> &ctx, const std::vector<Thr> &own, Step step) {
    int t = (int)ctx.size();
    std::vector<long long> n(t, 0);
    std::vector<double> loop(t, 0), done(t, 0);  // seconds from t0 to a thread's loop end, its sync end
    std::vector<CUresult> err(t, CUDA_SUCCESS);
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    clk::time_point t0, end;  // written before go is set, read after
    std::vector<std::thread> th;
    for (int i = 0; i < t; i++)
        th.emplace_back([&, i] {
            CUresult r = cuCtxSetCurrent(ctx[i]);
            if (r != CUDA_SUCCESS) err[i] = r;
            ready.fetch_add(1);
            while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
            while (err[i] == CUDA_SUCCESS && clk::now() < end)
                if ((r = step(i, n[i])) != CUDA_SUCCESS) err[i] = r;
            loop[i] = since(t0);
            for (CUstream s : own[i].s)
                if ((r = cuStreamSynchronize(s)) != CUDA_SUCCESS && err[i] == CUDA_SUCCESS) err[i] = r;
            done[i] = since(t0);
        });
    while (ready.load() < t) std::this_thread::yield();
    t0 = clk::now();
    end = t0 + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(SECS));
    go.store(true, std::memory_order_release);
    for (auto &x : th) x.join();
    Res res;
    double el = 0, busy = 0;
    for (int i = 0; i < t; i++) {
        res.kernels += n[i];
        el = std::max(el, done[i]);
        busy += loop[i];
        if (res.err == CUDA_SUCCESS) res.err = err[i];
    }
    res.rate = el > 0 ? res.kernels / el : 0;
    res.host_us = res.kernels ? busy / res.kernels * 1e6 : 0;
    return res;
}

static void row(const char *variant, int t, const std::string &k, const Res &r) {
    if (r.err != CUDA_SUCCESS)
        printf("| %s | %d | %s | error %s after %lld kernels | - |\n", variant, t, k.c_str(), en(r.err), r.kernels);
    else
        printf("| %s | %d | %s | %s | %.3f |\n", variant, t, k.c_str(), commas(r.rate).c_str(), r.host_us);
    fflush(stdout);
}
static void skip(const char *variant, const std::string &why) {
    printf("| %s | - | - | skipped: %s | - |\n", variant, why.c_str()), fflush(stdout);
}

// ---- streams, arguments, graphs ----------------------------------------------------------------
static std::vector<Thr> make_threads(int t, int streams) {
    std::vector<Thr> v(t);
    for (auto &x : v) {
        x.s.resize(streams);
        for (auto &s : x.s) CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CK(cuMemAlloc(&x.buf, 4096));
        x.a.arg = x.buf;
    }
    return v;
}
static void free_threads(std::vector<Thr> &v) {
    for (auto &x : v) { for (auto s : x.s) cuStreamDestroy(s); cuMemFree(x.buf); }
    v.clear();
}

static bool node_extra = true;  // graph kernel nodes take the packed buffer (until refused once)
static CUDA_KERNEL_NODE_PARAMS node_params(Args &a) {
    CUDA_KERNEL_NODE_PARAMS kp = {};  // kern and ctx null: fn, in the current (primary) context
    kp.func = fn;
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
    if (node_extra) kp.extra = a.extra; else kp.kernelParams = a.params;
    return kp;
}

struct Graph { CUgraph g = nullptr; CUgraphExec e = nullptr; std::vector<CUgraphNode> nodes; };

// K kernel nodes, each after the one before (chain) or with no edges; instantiated once.
static void destroy(Graph &G) { if (G.e) cuGraphExecDestroy(G.e); if (G.g) cuGraphDestroy(G.g); G = Graph(); }
static void build(Graph &G, int k, bool chain, Args &a) {
    CUDA_KERNEL_NODE_PARAMS kp = node_params(a);
    CK(cuGraphCreate(&G.g, 0));
    G.nodes.resize(k);
    for (int j = 0; j < k; j++) {
        bool dep = chain && j > 0;
        CUresult r = cuGraphAddKernelNode(&G.nodes[j], G.g, dep ? &G.nodes[j - 1] : nullptr, dep ? 1 : 0, &kp);
        if (r != CUDA_SUCCESS && node_extra) {  // said once; every graph row from here uses kernelParams
            printf("(graph kernel nodes refused the packed `extra` buffer: %s; they take kernelParams)\n", en(r));
            node_extra = false;
            destroy(G);
            return build(G, k, chain, a);
        }
        CK(r);
    }
    CK(cuGraphInstantiateWithFlags(&G.e, G.g, 0));
}

// ---- green contexts ----------------------------------------------------------------------------
// One green context per thread over every SM, its stream the thread's; with wq, also a work-queue
// configuration of scope GREEN_CTX_BALANCED and concurrency 1 (one stream each), so that the driver
// gives the green contexts non-overlapping queues where it can.
static bool make_green(int t, bool wq, std::vector<CUgreenCtx> &g, std::vector<CUcontext> &ctx,
                       std::vector<std::vector<CUstream>> &ss, std::string &why) {
    auto fail = [&](const char *what, CUresult r) { why = std::string(what) + ": " + en(r); return false; };
    CUdevResource res[2] = {};
    unsigned nres = 1;
    CUresult r;
    if ((r = cuDeviceGetDevResource(dev, &res[0], CU_DEV_RESOURCE_TYPE_SM))) return fail("cuDeviceGetDevResource(SM)", r);
    if (wq) {
#if CUDA_VERSION >= 13010
        int drv = 0;
        cuDriverGetVersion(&drv);
        if (drv < 13010) { why = "driver is CUDA " + std::to_string(drv) + ", work-queue resources need 13010"; return false; }
        if ((r = cuDeviceGetDevResource(dev, &res[1], CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG)))
            return fail("cuDeviceGetDevResource(WORKQUEUE_CONFIG)", r);
        res[1].wqConfig.sharingScope = CU_WORKQUEUE_SCOPE_GREEN_CTX_BALANCED;
        res[1].wqConfig.wqConcurrencyLimit = 1;
        nres = 2;
#else
        why = "built against CUDA_VERSION " + std::to_string(CUDA_VERSION) + ": CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG"
              " and CU_WORKQUEUE_SCOPE_GREEN_CTX_BALANCED need the CUDA 13.1 header (and a 13.1 driver)";
        return false;
#endif
    }
    g.assign(t, nullptr), ctx.assign(t, nullptr), ss.assign(t, std::vector<CUstream>(1));
    for (int i = 0; i < t; i++) {
        CUdevResourceDesc desc;
        if ((r = cuDevResourceGenerateDesc(&desc, res, nres))) return fail("cuDevResourceGenerateDesc", r);
        if ((r = cuGreenCtxCreate(&g[i], desc, dev, CU_GREEN_CTX_DEFAULT_STREAM))) return fail("cuGreenCtxCreate", r);
        if ((r = cuGreenCtxStreamCreate(&ss[i][0], g[i], CU_STREAM_NON_BLOCKING, 0))) return fail("cuGreenCtxStreamCreate", r);
        if ((r = cuCtxFromGreenCtx(&ctx[i], g[i]))) return fail("cuCtxFromGreenCtx", r);
    }
    return true;
}
static void free_green(std::vector<CUgreenCtx> &g, std::vector<std::vector<CUstream>> &ss) {
    for (auto &v : ss) for (auto s : v) if (s) cuStreamDestroy(s);
    for (auto x : g) if (x) cuGreenCtxDestroy(x);
    CK(cuCtxSetCurrent(prim));
}

// ---- the variants ------------------------------------------------------------------------------
static const int TS[] = {1, 4, 8, 16};
static const int KS[] = {8, 32, 128};

static CUresult plain_step(Thr &x, long long &n) {
    for (int j = 0; j < CHUNK; j++) {
        CUresult r = cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, x.s[0], nullptr, x.a.extra);
        if (r != CUDA_SUCCESS) return r;
        n++;
    }
    return CUDA_SUCCESS;
}

static void variant_a() {
    for (int t : TS) {
        auto th = make_threads(t, 1);
        row("a plain cuLaunchKernel", t, "1",
            run_cell(std::vector<CUcontext>(t, prim), th, [&](int i, long long &n) { return plain_step(th[i], n); }));
        free_threads(th);
    }
}

static void variant_b(bool wq) {
    const char *name = wq ? "b+wq green ctx per thread, balanced work queues" : "b green ctx per thread";
    for (int t : TS) {
        std::vector<CUgreenCtx> g;
        std::vector<CUcontext> ctx;
        std::vector<std::vector<CUstream>> ss;
        std::string why;
        if (!make_green(t, wq, g, ctx, ss, why)) { skip(name, why); free_green(g, ss); return; }
        auto th = make_threads(t, 0);  // only the argument buffers
        for (int i = 0; i < t; i++) th[i].s = ss[i];
        row(name, t, "1", run_cell(ctx, th, [&](int i, long long &n) { return plain_step(th[i], n); }));
        for (auto &x : th) x.s.clear();
        free_threads(th);
        free_green(g, ss);
    }
}

// c (chain, same params), d (chain, every node updated before each launch), e (independent)
static void variant_graph(char v) {
    const char *name = v == 'c' ? "c graph of K chained nodes" : v == 'd' ? "d as c, every node's params set before each launch"
                                                               : "e graph of K independent nodes (ceiling)";
    for (int t : TS)
        for (int k : KS) {
            auto th = make_threads(t, 1);
            std::vector<Graph> G(t);
            for (int i = 0; i < t; i++) {  // the cache: built once per (thread, K), warmed by one launch
                build(G[i], k, v != 'e', th[i].a);
                CK(cuGraphLaunch(G[i].e, th[i].s[0]));
                CK(cuStreamSynchronize(th[i].s[0]));
            }
            std::vector<unsigned> seq(t, 0);
            int reps = std::max(1, CHUNK / k);
            Res r = run_cell(std::vector<CUcontext>(t, prim), th, [&](int i, long long &n) {
                Thr &x = th[i];
                for (int b = 0; b < reps; b++) {
                    if (v == 'd') {
                        Args a;
                        CUDA_KERNEL_NODE_PARAMS kp = node_params(a);
                        for (int j = 0; j < k; j++) {
                            a.arg = x.buf + 8 * (seq[i]++ & 511);  // a different pointer every time
                            CUresult e = cuGraphExecKernelNodeSetParams(G[i].e, G[i].nodes[j], &kp);
                            if (e != CUDA_SUCCESS) return e;
                        }
                    }
                    CUresult e = cuGraphLaunch(G[i].e, x.s[0]);
                    if (e != CUDA_SUCCESS) return e;
                    n += k;
                }
                return CUDA_SUCCESS;
            });
            row(name, t, std::to_string(k), r);
            for (auto &g : G) destroy(g);
            free_threads(th);
        }
}

static void variant_f() {
    const int S = 4;
    for (int t : {1, 8}) {
        auto th = make_threads(t, S);
        std::vector<std::vector<CUlaunchConfig>> cfg(t, std::vector<CUlaunchConfig>(S));
        for (int i = 0; i < t; i++)
            for (int s = 0; s < S; s++) {
                CUlaunchConfig &c = cfg[i][s] = CUlaunchConfig{};
                c.gridDimX = c.gridDimY = c.gridDimZ = c.blockDimX = c.blockDimY = c.blockDimZ = 1;
                c.hStream = th[i].s[s];
            }
        Res r = run_cell(std::vector<CUcontext>(t, prim), th, [&](int i, long long &n) {
            for (int j = 0; j < CHUNK; j++) {
                CUresult e = cuLaunchKernelEx(&cfg[i][j % S], fn, nullptr, th[i].a.extra);
                if (e != CUDA_SUCCESS) return e;
                n++;
            }
            return CUDA_SUCCESS;
        });
        row("f cuLaunchKernelEx, 4 streams per thread round robin", t, "1", r);
        free_threads(th);
    }
}

// h: us per call, one thread; round() is timed, after() (draining the stream) is not. ~0.2 s each.
static double per_call(int calls, std::function<void()> round, std::function<void()> after) {
    double tot = 0;
    long long n = 0;
    for (auto start = clk::now(); since(start) < 0.2; n += calls, after()) {
        auto a = clk::now();
        round();
        tot += since(a);
    }
    return tot / n * 1e6;
}
static void cost_row(const char *call, int k, double us, int kernels_per_call) {
    printf("| %s | %d | %.3f | %.3f |\n", call, k, us, us / kernels_per_call), fflush(stdout);
}

static void variant_h() {
    printf("\n| host call (1 thread, stream drained between timed rounds) | K | us per call | us per kernel |\n|---|---|---|---|\n");
    auto th = make_threads(1, 1);
    Thr &x = th[0];
    CUstream s = x.s[0];
    auto drain = [&] { CK(cuStreamSynchronize(s)); };
    cost_row("cuLaunchKernel", 1, per_call(256, [&] {
        for (int j = 0; j < 256; j++) CK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, nullptr, x.a.extra));
    }, drain), 1);
    CUlaunchConfig c = {};
    c.gridDimX = c.gridDimY = c.gridDimZ = c.blockDimX = c.blockDimY = c.blockDimZ = 1;
    c.hStream = s;
    cost_row("cuLaunchKernelEx, no attributes", 1, per_call(256, [&] {
        for (int j = 0; j < 256; j++) CK(cuLaunchKernelEx(&c, fn, nullptr, x.a.extra));
    }, drain), 1);
    for (int chain = 1; chain >= 0; chain--)
        for (int k : KS) {
            if (!chain && k != 128) continue;
            Graph G;
            build(G, k, chain, x.a);
            CK(cuGraphLaunch(G.e, s));
            drain();
            cost_row(chain ? "cuGraphLaunch, K chained nodes" : "cuGraphLaunch, K independent nodes", k,
                     per_call(16, [&] { for (int j = 0; j < 16; j++) CK(cuGraphLaunch(G.e, s)); }, drain), k);
            if (chain && k == 128) {
                Args a;
                CUDA_KERNEL_NODE_PARAMS kp = node_params(a);
                unsigned seq = 0;
                cost_row("cuGraphExecKernelNodeSetParams, one node (new pointer)", k, per_call(k, [&] {
                    for (int j = 0; j < k; j++) {
                        a.arg = x.buf + 8 * (seq++ & 511);
                        CK(cuGraphExecKernelNodeSetParams(G.e, G.nodes[j], &kp));
                    }
                }, [&] { CK(cuGraphLaunch(G.e, s)); drain(); }), 1);
            }
            destroy(G);
        }
    for (int k : KS) {  // what a cache miss costs: build the graph and instantiate it
        Graph G;
        double us = per_call(1, [&] { build(G, k, true, x.a); }, [&] { destroy(G); });
        cost_row("build K chained nodes + cuGraphInstantiateWithFlags (a cache miss)", k, us, k);
    }
    free_threads(th);
}

int main(int argc, char **argv) {
    if (argc > 1) SECS = atof(argv[1]);
    std::string which = argc > 2 ? argv[2] : "abcdefh";
    if (SECS <= 0 || SECS > 5) { fprintf(stderr, "seconds per cell: (0, 5]\n"); return 2; }
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&prim, dev));
    CK(cuCtxSetCurrent(prim));
    CUmodule mod;
    CK(cuModuleLoadData(&mod, PTX));
    CK(cuModuleGetFunction(&fn, mod, "k"));
    char name[256] = {0};
    int drv = 0;
    cuDeviceGetName(name, sizeof name, dev), cuDriverGetVersion(&drv);
    const char *conn = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    printf("%s, driver CUDA %d, header CUDA %d, CUDA_DEVICE_MAX_CONNECTIONS=%s, %.2f s per cell, %u CPUs\n\n",
           name, drv, CUDA_VERSION, conn ? conn : "(unset: 8)", SECS, std::thread::hardware_concurrency());
    printf("| variant | T | K | kernels/s | host us per kernel |\n|---|---|---|---|---|\n");
    fflush(stdout);
    for (char v : which) {
        switch (v) {
        case 'a': variant_a(); break;
        case 'b': variant_b(false); variant_b(true); break;
        case 'c': case 'd': case 'e': variant_graph(v); break;
        case 'f': variant_f(); break;
        case 'h': break;  // printed last, as a second table
        default: fprintf(stderr, "unknown variant %c\n", v); return 2;
        }
    }
    if (which.find('h') != std::string::npos) variant_h();
    CK(cuModuleUnload(mod));
    cuDevicePrimaryCtxRelease(dev);
    return 0;
}
