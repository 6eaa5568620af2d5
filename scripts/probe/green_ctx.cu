// Probe: CUDA green contexts (SM partitions) beside omps's single primary context: Q1-Q10, one "Qn:" line each.
//   nvcc -O2 -arch=sm_90 -o green_ctx scripts/probe/green_ctx.cu -lcuda
//   ./green_ctx [device_ordinal]   (CUDA 12.4+ driver; ~30 s; every GPU wait is bounded, errors are printed, never fatal)
#include <cuda.h>
#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

// probe(smid_out, val_out, v, ns): thread 0 of each block writes %smid / v at [blockIdx.x] (if the pointer
// is non-null) and then spins ns nanoseconds on %globaltimer. Launched with 128 threads.
static const char* PTX = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry probe(.param .u64 p_smid, .param .u64 p_val, .param .u32 p_v, .param .u64 p_ns)
{
  .reg .pred %p<4>;
  .reg .b32 %r<6>;
  .reg .b64 %rd<12>;
  mov.u32 %r1, %tid.x;
  setp.ne.u32 %p1, %r1, 0;
  @%p1 bra DONE;
  ld.param.u64 %rd1, [p_smid];
  ld.param.u64 %rd2, [p_val];
  ld.param.u32 %r2, [p_v];
  ld.param.u64 %rd3, [p_ns];
  mov.u32 %r3, %ctaid.x;
  mul.wide.u32 %rd4, %r3, 4;
  mov.u32 %r4, %smid;
  setp.eq.u64 %p2, %rd1, 0;
  @%p2 bra SKIP1;
  cvta.to.global.u64 %rd5, %rd1;
  add.s64 %rd6, %rd5, %rd4;
  st.global.u32 [%rd6], %r4;
SKIP1:
  setp.eq.u64 %p3, %rd2, 0;
  @%p3 bra SKIP2;
  cvta.to.global.u64 %rd7, %rd2;
  add.s64 %rd8, %rd7, %rd4;
  st.global.u32 [%rd8], %r2;
SKIP2:
  mov.u64 %rd9, %globaltimer;
LOOP:
  mov.u64 %rd10, %globaltimer;
  sub.s64 %rd11, %rd10, %rd9;
  setp.lt.s64 %p1, %rd11, %rd3;
  @%p1 bra LOOP;
DONE:
  ret;
}
)";

static const long long MS = 1000000LL;  // ns
static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static const char* en(CUresult r) {
    const char* s = nullptr;
    return (cuGetErrorName(r, &s) == CUDA_SUCCESS && s) ? s : "UNKNOWN_ERROR";
}
struct Line {  // one output line, printed when it goes out of scope
    int q; std::string s;
    explicit Line(int q) : q(q) {}
    void f(const char* fmt, ...) {
        char b[2048]; va_list a; va_start(a, fmt); vsnprintf(b, sizeof b, fmt, a); va_end(a); s += b;
    }
    bool ok(const char* what, CUresult r) { if (r != CUDA_SUCCESS) f(" %s=%s", what, en(r)); return r == CUDA_SUCCESS; }
    ~Line() { printf("Q%d:%s\n", q, s.c_str()); fflush(stdout); }
};

static CUdevice dev;
static CUcontext pctx;
static int nsm = 0;
static unsigned smemMax = 0;  // dynamic smem per block that forces 1 block per SM (opt-in max)
static CUdeviceptr dSmid = 0, dVal = 0;
static const unsigned NBUF = 4096;

static CUresult launch(CUfunction f, CUstream s, unsigned grid, unsigned smem, long long ns,
                       CUdeviceptr smid = 0, CUdeviceptr val = 0, unsigned v = 0) {
    void* args[] = {&smid, &val, &v, &ns};
    return cuLaunchKernel(f, grid, 1, 1, 128, 1, 1, smem, s, args, nullptr);
}
static CUresult wait_stream(CUstream s, double limit_ms = 5000) {
    double t = now_ms(); CUresult r;
    while ((r = cuStreamQuery(s)) == CUDA_ERROR_NOT_READY) {
        if (now_ms() - t > limit_ms) return CUDA_ERROR_TIMEOUT;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return r;
}
static CUresult wait_event(CUevent e, double limit_ms = 5000) {
    double t = now_ms(); CUresult r;
    while ((r = cuEventQuery(e)) == CUDA_ERROR_NOT_READY) {
        if (now_ms() - t > limit_ms) return CUDA_ERROR_TIMEOUT;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return r;
}

struct Green { CUgreenCtx g = nullptr; CUcontext c = nullptr; CUstream s = nullptr; unsigned sms = 0; };
static CUresult make_green(Line& L, const CUdevResource& res, Green& G, int prio = 0) {
    CUdevResourceDesc d = nullptr; CUdevResource r = res;
    CUresult e = cuDevResourceGenerateDesc(&d, &r, 1);
    if (!L.ok("GenerateDesc", e)) return e;
    e = cuGreenCtxCreate(&G.g, d, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (!L.ok("GreenCtxCreate", e)) { G.g = nullptr; return e; }
    L.ok("CtxFromGreenCtx", cuCtxFromGreenCtx(&G.c, G.g));
    CUdevResource gr; memset(&gr, 0, sizeof gr);
    if (L.ok("GreenCtxGetDevResource", cuGreenCtxGetDevResource(G.g, &gr, CU_DEV_RESOURCE_TYPE_SM))) G.sms = gr.sm.smCount;
    e = cuGreenCtxStreamCreate(&G.s, G.g, CU_STREAM_NON_BLOCKING, prio);
    if (!L.ok("GreenCtxStreamCreate", e)) G.s = nullptr;
    return e;
}
static std::vector<CUdevResource> split(Line& L, const CUdevResource& in, unsigned minCount, unsigned flags, CUdevResource* rem) {
    unsigned nb = 0;
    if (!L.ok("SplitQuery", cuDevSmResourceSplitByCount(nullptr, &nb, &in, nullptr, flags, minCount))) return {};
    std::vector<CUdevResource> v(nb);
    if (nb == 0) return v;
    if (!L.ok("Split", cuDevSmResourceSplitByCount(v.data(), &nb, &in, rem, flags, minCount))) return {};
    v.resize(nb);
    return v;
}
// SM ids used by `grid` blocks (1 per SM at a time through smemMax), each spinning ns.
static std::set<unsigned> smset(Line& L, const char* tag, CUfunction f, CUstream s, unsigned grid, long long ns) {
    std::set<unsigned> out;
    std::vector<unsigned> h(grid, 0xFFFFFFFFu);
    if (!L.ok(tag, cuMemcpyHtoD(dSmid, h.data(), grid * 4))) return out;
    if (!L.ok(tag, launch(f, s, grid, smemMax, ns, dSmid))) return out;
    if (!L.ok(tag, wait_stream(s))) return out;
    if (!L.ok(tag, cuMemcpyDtoH(h.data(), dSmid, grid * 4))) return out;
    for (unsigned x : h) if (x != 0xFFFFFFFFu) out.insert(x);
    return out;
}
static std::string setstr(const std::set<unsigned>& s, bool list) {
    char b[64]; std::string r;
    if (s.empty()) return "distinct=0";
    snprintf(b, sizeof b, "distinct=%zu min=%u max=%u", s.size(), *s.begin(), *s.rbegin()); r = b;
    if (list) { r += " ids="; for (unsigned x : s) { snprintf(b, sizeof b, "%u,", x); r += b; } }
    return r;
}

int main(int argc, char** argv) {
    int ord = argc > 1 ? atoi(argv[1]) : 0;
    CUresult e = cuInit(0);
    if (e != CUDA_SUCCESS) { printf("Q0: cuInit=%s\n", en(e)); return 1; }
    int drv = 0; char name[128] = "?";
    cuDriverGetVersion(&drv);
    if ((e = cuDeviceGet(&dev, ord)) || (e = cuDevicePrimaryCtxRetain(&pctx, dev)) || (e = cuCtxSetCurrent(pctx))) {
        printf("Q0: device/primary ctx setup=%s\n", en(e)); return 1;
    }
    cuDeviceGetName(name, sizeof name, dev);
    int optin = 0;
    cuDeviceGetAttribute(&nsm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
    smemMax = (unsigned)optin;
    CUmodule mod = nullptr; CUfunction fmod = nullptr; CUstream P = nullptr;
    CUevent ev0 = nullptr, ev1 = nullptr, ev2 = nullptr;
    {
        Line L(0);
        L.f(" device=%d %s driver=%d header=%d smemOptin=%u", ord, name, drv, CUDA_VERSION, smemMax);
        L.ok("ModuleLoadData", cuModuleLoadData(&mod, PTX));
        if (mod) L.ok("ModuleGetFunction", cuModuleGetFunction(&fmod, mod, "probe"));
        if (fmod) L.ok("FuncSetAttribute(smem)", cuFuncSetAttribute(fmod, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin));
        L.ok("MemAlloc", cuMemAlloc(&dSmid, NBUF * 4)); L.ok("MemAlloc", cuMemAlloc(&dVal, NBUF * 4));
        L.ok("StreamCreateWithPriority", cuStreamCreateWithPriority(&P, CU_STREAM_NON_BLOCKING, 0));
        L.ok("EventCreate", cuEventCreate(&ev0, CU_EVENT_DEFAULT)); L.ok("EventCreate", cuEventCreate(&ev1, CU_EVENT_DEFAULT));
        L.ok("EventCreate", cuEventCreate(&ev2, CU_EVENT_DEFAULT));
        if (fmod && P) { L.ok("warmup", launch(fmod, P, 1, 0, 0)); L.ok("warmup wait", wait_stream(P)); }
    }
    // ---- Q1: SM resource and splits
    CUdevResource devres; memset(&devres, 0, sizeof devres);
    bool haveRes = false;
    {
        Line L(1);
        haveRes = L.ok("DeviceGetDevResource", cuDeviceGetDevResource(dev, &devres, CU_DEV_RESOURCE_TYPE_SM));
        L.f(" MULTIPROCESSOR_COUNT=%d devres.smCount=%u minSmPartitionSize=%u smCoscheduledAlignment=%u", nsm,
            devres.sm.smCount, devres.sm.minSmPartitionSize, devres.sm.smCoscheduledAlignment);
        for (unsigned mc : {8u, 16u, 33u})
            for (unsigned fl : {0u, (unsigned)CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING}) {
                if (!haveRes) break;
                L.f(" | min=%u%s:", mc, fl ? "/IGNORE_COSCHED" : "");
                CUdevResource rem; memset(&rem, 0, sizeof rem);
                auto v = split(L, devres, mc, fl, &rem);
                L.f(" groups=%zu sizes=", v.size());
                for (size_t i = 0; i < v.size(); i++) L.f("%u%s", v[i].sm.smCount, i + 1 < v.size() ? "," : "");
                L.f(" remaining=%u(type %d)", rem.sm.smCount, (int)rem.type);
            }
    }
    // ---- Q2: a green context of 16 SMs, streams at priority 0 and greatest
    Green G;
    std::vector<CUdevResource> g16;
    {
        Line L(2);
        if (haveRes) g16 = split(L, devres, 16, 0, nullptr);
        if (g16.empty()) L.f(" no 16-SM group");
        else {
            double t = now_ms();
            e = make_green(L, g16[0], G, 0);
            L.f(" group.smCount=%u green: create+stream=%s in %.2f ms, green smCount=%u", g16[0].sm.smCount,
                e == CUDA_SUCCESS ? "OK" : en(e), now_ms() - t, G.sms);
            int least = 0, greatest = 0, got = 99;
            L.ok("CtxGetStreamPriorityRange", cuCtxGetStreamPriorityRange(&least, &greatest));
            CUstream hi = nullptr;
            if (G.g) {
                e = cuGreenCtxStreamCreate(&hi, G.g, CU_STREAM_NON_BLOCKING, greatest);
                if (e == CUDA_SUCCESS) cuStreamGetPriority(hi, &got);
                L.f("; range least=%d greatest=%d, green stream prio %d: %s (got %d)", least, greatest, greatest,
                    e == CUDA_SUCCESS ? "OK" : en(e), got);
                if (hi) cuStreamDestroy(hi);
            }
        }
    }
    // ---- Q3/Q4: which function handles launch on the green stream (memory from the primary ctx)
    CUfunction gfunc = nullptr; const char* gname = "none";
    std::string q4;
    CUlibrary lib = nullptr; CUkernel kern = nullptr; CUfunction fk = nullptr;
    {
        Line L3(3);
        auto test = [&](const char* tag, CUfunction f, unsigned v) -> bool {
            char b[256];
            CUresult r = cuMemsetD32Async(dVal, 0, NBUF, P);
            if (r == CUDA_SUCCESS) r = wait_stream(P);
            if (r == CUDA_SUCCESS) r = launch(f, G.s, 264, 0, 0, 0, dVal, v);
            if (r != CUDA_SUCCESS) { snprintf(b, sizeof b, " %s: launch=%s;", tag, en(r)); q4 += b; return false; }
            r = wait_stream(G.s);
            std::vector<unsigned> h(264, 0);
            if (r == CUDA_SUCCESS) r = cuMemcpyDtoH(h.data(), dVal, 264 * 4);
            int good = (int)std::count(h.begin(), h.end(), v);
            snprintf(b, sizeof b, " %s: launch=OK sync=%s values %d/264 correct;", tag, en(r), good); q4 += b;
            return r == CUDA_SUCCESS && good == 264;
        };
        if (!G.s || !fmod) L3.f(" SKIP (no green stream or no module)");
        else {
            bool okMod = test("primary-ctx CUmodule fn on green stream", fmod, 0x1111);
            L3.ok("LibraryLoadData", cuLibraryLoadData(&lib, PTX, nullptr, nullptr, 0, nullptr, nullptr, 0));
            if (lib) L3.ok("LibraryGetKernel", cuLibraryGetKernel(&kern, lib, "probe"));
            bool okKern = kern && test("CUkernel(cast) on green stream, primary current", (CUfunction)kern, 0x2222);
            bool okFk = false;
            if (kern && L3.ok("CtxSetCurrent(green)", cuCtxSetCurrent(G.c))) {
                CUresult r = cuKernelGetFunction(&fk, kern);
                if (r != CUDA_SUCCESS) q4 += std::string(" KernelGetFunction(green current)=") + en(r) + ";";
                else okFk = test("KernelGetFunction with green current, on green stream", fk, 0x3333);
                cuCtxSetCurrent(pctx);
            }
            if (okMod) { gfunc = fmod; gname = "module fn"; }
            else if (okFk) {
                gfunc = fk; gname = "KernelGetFunction(green)";
                L3.ok("FuncSetAttribute(fk)", cuFuncSetAttribute(fk, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin));
            } else if (okKern) {
                gfunc = (CUfunction)kern; gname = "CUkernel";
                L3.ok("KernelSetAttribute", cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin, kern, dev));
            }
            L3.f(" primary cuMemAlloc buffer written by a kernel on the green stream: %s (function used: %s)",
                 gfunc ? "WORKS" : "FAILED", gname);
        }
    }
    { Line L(4); L.f("%s", q4.empty() ? " SKIP" : q4.c_str()); }
    // ---- Q5: SM ids used on the green stream vs a primary stream
    {
        Line L(5);
        if (!gfunc) L.f(" SKIP (no function launches on the green stream)");
        else {
            auto gs = smset(L, "green", gfunc, G.s, 264, MS / 5);
            auto ps = smset(L, "primary", fmod, P, 264, MS / 5);
            L.f(" green(%u SMs): %s | primary: %s | confined to %u SMs: %s", G.sms, setstr(gs, true).c_str(),
                setstr(ps, false).c_str(), G.sms, (!gs.empty() && gs.size() <= G.sms) ? "YES" : "NO");
        }
    }
    // ---- Q6: cross-context events, stream memops to host memory
    {
        Line L(6);
        if (!gfunc) L.f(" SKIP");
        else {
            CUgreenCtx gg = G.g;
            auto dep = [&](const char* tag, CUstream prod, CUstream cons, int mode) {
                CUfunction fp = prod == P ? fmod : gfunc;
                CUresult rl = launch(fp, prod, 1, 0, 50 * MS);
                CUresult rr = mode == 2 ? cuGreenCtxRecordEvent(gg, ev0) : cuEventRecord(ev0, prod);
                CUresult rw = mode == 1 ? cuGreenCtxWaitEvent(gg, ev0) : cuStreamWaitEvent(cons, ev0, 0);
                CUresult rm = cuEventRecord(ev1, cons);
                double t = now_ms();
                CUresult q0 = cuEventQuery(ev1);
                CUresult rw2 = wait_event(ev1, 3000);
                double dt = now_ms() - t;
                L.f(" %s: launch=%s record=%s wait=%s mark=%s query_at_once=%s consumer_done_after=%.1fms(expect~50) %s;",
                    tag, en(rl), en(rr), en(rw), en(rm), en(q0), dt, en(rw2));
                wait_stream(prod, 3000);
            };
            dep("EventRecord(green)->StreamWaitEvent(primary)", G.s, P, 0);
            dep("EventRecord(primary)->StreamWaitEvent(green)", P, G.s, 0);
            dep("EventRecord(primary)->GreenCtxWaitEvent", P, G.s, 1);
            dep("GreenCtxRecordEvent->StreamWaitEvent(primary)", G.s, P, 2);
            void* h = nullptr; CUdeviceptr dh = 0;
            if (L.ok("MemHostAlloc", cuMemHostAlloc(&h, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE)) &&
                L.ok("MemHostGetDevicePointer", cuMemHostGetDevicePointer(&dh, h, 0))) {
                volatile unsigned* hv = (volatile unsigned*)h; hv[0] = 0;
                CUresult rl = launch(gfunc, G.s, 1, 0, 30 * MS);
                CUresult rw = cuStreamWriteValue32(G.s, dh, 0xC0FFEEu, CU_STREAM_WRITE_VALUE_DEFAULT);
                CUresult re = cuEventRecord(ev2, G.s);
                unsigned early = hv[0];
                CUresult sq = cuStreamQuery(G.s), eq = cuEventQuery(ev2);
                double t = now_ms();
                while (hv[0] != 0xC0FFEEu && now_ms() - t < 3000) std::this_thread::sleep_for(std::chrono::microseconds(20));
                double dt = now_ms() - t;
                CUresult ws = wait_stream(G.s, 3000);
                L.f(" WriteValue32(green->pinned host): launch=%s write=%s eventRecord=%s value_at_once=%#x"
                    " StreamQuery_at_once=%s EventQuery_at_once=%s value=%#x after %.1fms(expect~30) StreamQuery_after=%s EventQuery_after=%s",
                    en(rl), en(rw), en(re), early, en(sq), en(eq), hv[0], dt, en(ws), en(cuEventQuery(ev2)));
                cuMemFreeHost(h);
            }
        }
    }
    // ---- Q7: compute-bound kernel, green (16 SMs) vs full device
    {
        Line L(7);
        if (!gfunc) L.f(" SKIP");
        else {
            unsigned grid = 4 * nsm;
            auto timeit = [&](CUfunction f, CUstream s, double& wall) -> double {
                launch(f, s, 1, 0, 0); wait_stream(s);  // warm-up
                float ms = -1;
                double t = now_ms();
                CUresult r0 = cuEventRecord(ev0, s), rl = launch(f, s, grid, smemMax, 2 * MS), r1 = cuEventRecord(ev1, s);
                CUresult rw = wait_stream(s, 10000);
                wall = now_ms() - t;
                CUresult re = (r0 || r1 || rw) ? CUDA_ERROR_NOT_READY : cuEventElapsedTime(&ms, ev0, ev1);
                if (rl || rw || re) L.f(" [launch=%s wait=%s elapsed=%s]", en(rl), en(rw), en(re));
                return ms;
            };
            double wg = 0, wp = 0;
            double mg = timeit(gfunc, G.s, wg), mp = timeit(fmod, P, wp);
            L.f(" grid=%u blocks x 2ms (1 block/SM): green(%u SMs) event=%.2fms wall=%.2fms | primary(%d SMs) event=%.2fms wall=%.2fms"
                " | ratio event=%.2f wall=%.2f (expect %.2f if confined)",
                grid, G.sms, mg, wg, nsm, mp, wp, mp > 0 ? mg / mp : -1.0, wp > 0 ? wg / wp : -1.0,
                G.sms ? (double)nsm / G.sms : -1.0);
        }
    }
    // ---- Q8: two disjoint green contexts (+ a primary stream) at once
    {
        Line L(8);
        Green A, B;
        if (!gfunc || g16.size() < 2) L.f(" SKIP (%zu groups of 16)", g16.size());
        else if (make_green(L, g16[0], A) == CUDA_SUCCESS && make_green(L, g16[1], B) == CUDA_SUCCESS) {
            auto sa = smset(L, "A", gfunc, A.s, 64, MS / 10), sb = smset(L, "B", gfunc, B.s, 64, MS / 10);
            size_t inter = 0; for (unsigned x : sa) inter += sb.count(x);
            L.f(" A %s | B %s | shared SMs=%zu |", setstr(sa, false).c_str(), setstr(sb, false).c_str(), inter);
            // each entry: stream, function, grid; every block spins 5 ms, 1 block/SM
            auto run = [&](std::vector<std::pair<CUstream, CUfunction>> w, unsigned grid) -> double {
                double t = now_ms();
                for (auto& x : w) { CUresult r = launch(x.second, x.first, grid, smemMax, 5 * MS); if (r) L.f(" launch=%s", en(r)); }
                for (auto& x : w) { CUresult r = wait_stream(x.first, 10000); if (r) L.f(" wait=%s", en(r)); }
                return now_ms() - t;
            };
            double a = run({{A.s, gfunc}}, 64), b = run({{B.s, gfunc}}, 64), ab = run({{A.s, gfunc}, {B.s, gfunc}}, 64);
            double p = run({{P, fmod}}, 64), abp = run({{A.s, gfunc}, {B.s, gfunc}, {P, fmod}}, 64);
            L.f(" wall ms, 64 blocks x 5ms each: A=%.1f B=%.1f A+B=%.1f (overlap: %s) P(full device)=%.1f A+B+P=%.1f",
                a, b, ab, ab < 1.3 * std::max(a, b) ? "YES" : "NO", p, abp);
        }
        for (Green* x : {&A, &B}) { if (x->s) cuStreamDestroy(x->s); if (x->g) cuGreenCtxDestroy(x->g); }
    }
    // ---- Q9: do module loads / green ctx management wait for a running 1 s kernel?
    {
        Line L(9);
        CUdevResourceDesc d9 = nullptr;
        if (!gfunc || g16.empty()) L.f(" SKIP");
        else if (L.ok("GenerateDesc", cuDevResourceGenerateDesc(&d9, &g16[1 % g16.size()], 1))) {
            for (int pass = 0; pass < 2; pass++) {
                CUstream ss = pass == 0 ? P : G.s;
                CUfunction sf = pass == 0 ? fmod : gfunc;
                L.f(" | 1s kernel on %s stream:", pass == 0 ? "PRIMARY" : "GREEN");
                CUmodule m1 = nullptr, m2 = nullptr; CUgreenCtx tg = nullptr; CUstream ts = nullptr;
                std::vector<std::pair<const char*, std::function<CUresult()>>> ops = {
                    {"ModuleLoadData(primary)", [&] { return cuModuleLoadData(&m1, PTX); }},
                    {"ModuleUnload(primary)", [&] { return m1 ? cuModuleUnload(m1) : CUDA_ERROR_INVALID_HANDLE; }},
                    {"ModuleLoadData(green current)", [&] {
                         cuCtxSetCurrent(G.c); CUresult r = cuModuleLoadData(&m2, PTX); cuCtxSetCurrent(pctx); return r; }},
                    {"ModuleUnload(green)", [&] {
                         if (!m2) return CUDA_ERROR_INVALID_HANDLE;
                         cuCtxSetCurrent(G.c); CUresult r = cuModuleUnload(m2); cuCtxSetCurrent(pctx); return r; }},
                    {"GreenCtxCreate", [&] { return cuGreenCtxCreate(&tg, d9, dev, CU_GREEN_CTX_DEFAULT_STREAM); }},
                    {"GreenCtxStreamCreate", [&] {
                         return tg ? cuGreenCtxStreamCreate(&ts, tg, CU_STREAM_NON_BLOCKING, 0) : CUDA_ERROR_INVALID_HANDLE; }},
                    {"StreamDestroy(green)", [&] { return ts ? cuStreamDestroy(ts) : CUDA_ERROR_INVALID_HANDLE; }},
                    {"GreenCtxDestroy", [&] { return tg ? cuGreenCtxDestroy(tg) : CUDA_ERROR_INVALID_HANDLE; }},
                };
                for (auto& op : ops) {
                    CUresult rl = launch(sf, ss, 1, 0, 1000 * MS);
                    std::this_thread::sleep_for(std::chrono::milliseconds(30));
                    double t = now_ms();
                    CUresult r = op.second();
                    double dt = now_ms() - t;
                    CUresult q = cuStreamQuery(ss);
                    L.f(" %s=%.2fms%s%s%s", op.first, dt, r ? "(" : "", r ? en(r) : "", r ? ")" : "");
                    L.f("[kernel %s]", rl ? en(rl) : q == CUDA_ERROR_NOT_READY ? "still running" : q == CUDA_SUCCESS ? "done" : en(q));
                    CUresult w = wait_stream(ss, 3000);
                    if (w) L.f("[wait=%s]", en(w));
                }
            }
        }
    }
    // ---- Q10: cost of green ctx + stream creation, and how many can exist at once
    {
        Line L(10);
        std::vector<CUdevResource> g8;
        if (haveRes) g8 = split(L, devres, 8, 0, nullptr);
        if (g8.empty()) L.f(" SKIP (no 8-SM group)");
        else {
            std::vector<double> tc, ts;
            for (int i = 0; i < 10; i++) {
                CUdevResourceDesc d = nullptr; CUgreenCtx g = nullptr; CUstream s = nullptr;
                if (!L.ok("GenerateDesc", cuDevResourceGenerateDesc(&d, &g8[0], 1))) break;
                double t = now_ms();
                if (!L.ok("GreenCtxCreate", cuGreenCtxCreate(&g, d, dev, CU_GREEN_CTX_DEFAULT_STREAM))) break;
                double t1 = now_ms();
                CUresult r = cuGreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, 0);
                double t2 = now_ms();
                tc.push_back((t1 - t) * 1000); if (r == CUDA_SUCCESS) { ts.push_back((t2 - t1) * 1000); cuStreamDestroy(s); }
                cuGreenCtxDestroy(g);
            }
            std::sort(tc.begin(), tc.end()); std::sort(ts.begin(), ts.end());
            if (!tc.empty()) L.f(" GreenCtxCreate(8 SMs) us min=%.0f median=%.0f max=%.0f;", tc[0], tc[tc.size() / 2], tc.back());
            if (!ts.empty()) L.f(" GreenCtxStreamCreate us min=%.0f median=%.0f max=%.0f;", ts[0], ts[ts.size() / 2], ts.back());
            std::vector<Green> all;
            int nctx = 0, nstr = 0; const char* firstErr = "none";
            double t = now_ms();
            for (int i = 0; i < 64; i++) {
                Green x; CUdevResourceDesc d = nullptr;
                CUresult r = cuDevResourceGenerateDesc(&d, &g8[0], 1);
                if (r == CUDA_SUCCESS) r = cuGreenCtxCreate(&x.g, d, dev, CU_GREEN_CTX_DEFAULT_STREAM);
                if (r != CUDA_SUCCESS) { if (!strcmp(firstErr, "none")) firstErr = en(r); continue; }
                nctx++;
                r = cuGreenCtxStreamCreate(&x.s, x.g, CU_STREAM_NON_BLOCKING, 0);
                if (r == CUDA_SUCCESS) nstr++; else { x.s = nullptr; if (!strcmp(firstErr, "none")) firstErr = en(r); }
                all.push_back(x);
            }
            double dt = now_ms() - t;
            L.f(" 64 x 8-SM green ctxs at once: ctx ok=%d streams ok=%d first error=%s total %.1fms", nctx, nstr, firstErr, dt);
            if (!all.empty() && all.back().s) {
                CUresult r = launch(gfunc ? gfunc : fmod, all.back().s, 16, 0, MS / 10);
                L.f("; launch on the last one=%s sync=%s", en(r), r ? "-" : en(wait_stream(all.back().s)));
            }
            for (auto& x : all) { if (x.s) cuStreamDestroy(x.s); cuGreenCtxDestroy(x.g); }
        }
    }
    if (G.s) cuStreamDestroy(G.s);
    if (G.g) cuGreenCtxDestroy(G.g);
    if (lib) cuLibraryUnload(lib);
    if (mod) cuModuleUnload(mod);
    cuDevicePrimaryCtxRelease(dev);
    return 0;
}
