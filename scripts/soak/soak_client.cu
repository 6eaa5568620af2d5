// A client for the kill soak (scripts/soak/soak.sh). As a victim (--victim) it loops for
// ever over what a client does, each step a different place to be killed: a module
// loaded from PTX (JIT) and unloaded, device allocations, copies both ways, launches,
// synchronizations, frees; a captured graph instantiated, launched and destroyed; VMM
// memory created, reserved, mapped, given access, written, unmapped and released; and,
// where an exporter left its handle in SOAK_IPC_HANDLE, that memory opened, read and
// closed. As a survivor (--survivor N) it runs N rounds of the same but the IPC opening,
// checks every result, then prints a line that depends only on N, and PASS. As an
// exporter (--exporter FILE SECONDS) it exports a buffer of a known pattern to FILE and
// checks, every second for SECONDS, that the victims' openings, reads and deaths left it
// whole.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#define CK(x)                                                                     \
    do {                                                                          \
        CUresult r_ = (x);                                                        \
        if (r_ != CUDA_SUCCESS) {                                                 \
            const char *s_ = "?";                                                 \
            cuGetErrorName(r_, &s_);                                              \
            printf("FAIL: %s returned %s at line %d\n", #x, s_, __LINE__);        \
            return 1;                                                             \
        }                                                                         \
    } while (0)

static const char *PTX = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry scale(.param .u64 p, .param .u32 n, .param .u32 k) {
  .reg .u64 %rd<4>; .reg .u32 %r<8>; .reg .pred %p;
  ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [n]; ld.param.u32 %r2, [k];
  mov.u32 %r3, %ctaid.x; mov.u32 %r4, %ntid.x; mov.u32 %r5, %tid.x;
  mad.lo.u32 %r6, %r3, %r4, %r5;
  setp.ge.u32 %p, %r6, %r1; @%p bra DONE;
  cvta.to.global.u64 %rd2, %rd1; mul.wide.u32 %rd3, %r6, 4; add.u64 %rd2, %rd2, %rd3;
  ld.global.u32 %r7, [%rd2]; mul.lo.u32 %r7, %r7, %r2; add.u32 %r7, %r7, 1; st.global.u32 [%rd2], %r7;
DONE: ret;
}
)";

// One round: n words copied in, scaled by a launch (or, with `graph`, by that launch
// captured into a graph that is instantiated, launched and destroyed), copied back and
// checked.
static int round_(CUfunction f, CUstream s, unsigned n, unsigned k, bool graph, unsigned long long *sum) {
    std::vector<unsigned> h(n), back(n);
    for (unsigned i = 0; i < n; i++) h[i] = i;
    CUdeviceptr d;
    CK(cuMemAlloc(&d, n * 4));
    CK(cuMemcpyHtoDAsync(d, h.data(), n * 4, s));
    void *args[] = {&d, &n, &k};
    CUgraph g = nullptr;
    CUgraphExec e = nullptr;
    if (graph) CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CK(cuLaunchKernel(f, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, args, nullptr));
    if (graph) {
        CK(cuStreamEndCapture(s, &g));
        CK(cuGraphInstantiate(&e, g, 0));
        CK(cuGraphLaunch(e, s));
    }
    CK(cuMemcpyDtoHAsync(back.data(), d, n * 4, s));
    CK(cuStreamSynchronize(s));
    if (graph) {
        CK(cuGraphExecDestroy(e));
        CK(cuGraphDestroy(g));
    }
    CK(cuMemFree(d));
    for (unsigned i = 0; i < n; i++) {
        if (back[i] != i * k + 1) {
            printf("FAIL: %selement %u is %u, want %u\n", graph ? "graph " : "", i, back[i], i * k + 1);
            return 1;
        }
        *sum += back[i];
    }
    return 0;
}

// VMM memory through its whole life: created, reserved, mapped, made accessible, written
// and read back, unmapped, released.
static int vmm_round(CUdevice dev, CUstream s, unsigned v, unsigned long long *sum) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, gran, &prop, 0));
    CUdeviceptr p;
    CK(cuMemAddressReserve(&p, gran, 0, 0, 0));
    CK(cuMemMap(p, gran, 0, h, 0));
    CUmemAccessDesc acc = {};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemSetAccess(p, gran, &acc, 1));
    CK(cuMemsetD32Async(p, v, gran / 4, s));
    unsigned back[16];
    CK(cuMemcpyDtoHAsync(back, p + gran - sizeof back, sizeof back, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemUnmap(p, gran));
    CK(cuMemRelease(h));
    CK(cuMemAddressFree(p, gran));
    for (unsigned w : back) {
        if (w != v) {
            printf("FAIL: VMM word is %u, want %u\n", w, v);
            return 1;
        }
        *sum += w;
    }
    return 0;
}

static const unsigned IPC_WORDS = 1 << 16;
static unsigned ipc_pattern(unsigned i) { return i * 2654435761u + 17; }

// The exporter's memory, where its handle is in `path`: opened, read, checked, closed.
static int ipc_round(const char *path, CUstream s) {
    FILE *fh = fopen(path, "rb");
    if (!fh) return 0;  // no exporter (yet): nothing to open
    CUipcMemHandle handle;
    size_t got = fread(&handle, sizeof handle, 1, fh);
    fclose(fh);
    if (got != 1) return 0;
    CUdeviceptr p;
    CK(cuIpcOpenMemHandle(&p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    std::vector<unsigned> back(IPC_WORDS);
    CK(cuMemcpyDtoHAsync(back.data(), p, IPC_WORDS * 4, s));
    CK(cuStreamSynchronize(s));
    CK(cuIpcCloseMemHandle(p));
    for (unsigned i = 0; i < IPC_WORDS; i++) {
        if (back[i] != ipc_pattern(i)) {
            printf("FAIL: IPC word %u is %u, want %u\n", i, back[i], ipc_pattern(i));
            return 1;
        }
    }
    return 0;
}

// --exporter FILE SECONDS: exports a buffer of ipc_pattern words to FILE, then checks it
// every second; PASS if it stayed whole.
static int exporter(const char *path, long seconds) {
    std::vector<unsigned> h(IPC_WORDS), back(IPC_WORDS);
    for (unsigned i = 0; i < IPC_WORDS; i++) h[i] = ipc_pattern(i);
    CUdeviceptr d;
    CK(cuMemAlloc(&d, IPC_WORDS * 4));
    CK(cuMemcpyHtoD(d, h.data(), IPC_WORDS * 4));
    CUipcMemHandle handle;
    CK(cuIpcGetMemHandle(&handle, d));
    std::string tmp = std::string(path) + ".tmp";
    FILE *fh = fopen(tmp.c_str(), "wb");
    if (!fh || fwrite(&handle, sizeof handle, 1, fh) != 1) {
        printf("FAIL: cannot write %s\n", tmp.c_str());
        return 1;
    }
    fclose(fh);
    rename(tmp.c_str(), path);  // whole, or not there
    for (long t = 0; t < seconds; t++) {
        sleep(1);
        CK(cuMemcpyDtoH(back.data(), d, IPC_WORDS * 4));
        if (back != h) {
            printf("FAIL: the exported buffer changed after %ld s\n", t + 1);
            return 1;
        }
    }
    unlink(path);
    CK(cuMemFree(d));
    printf("exporter: buffer whole for %ld s\nPASS\n", seconds);
    return 0;
}

int main(int argc, char **argv) {
    bool victim = argc > 1 && !strcmp(argv[1], "--victim");
    bool exporting = argc > 3 && !strcmp(argv[1], "--exporter");
    long rounds = argc > 2 ? atol(argv[2]) : 100;
    const char *ipc = getenv("SOAK_IPC_HANDLE");
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    if (exporting) return exporter(argv[2], atol(argv[3]));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    unsigned long long sum = 0;
    for (long r = 0; victim || r < rounds; r++) {
        CUmodule m;
        CK(cuModuleLoadData(&m, PTX));
        CUfunction f;
        CK(cuModuleGetFunction(&f, m, "scale"));
        unsigned n = 1024 + (unsigned)(r % 7) * 4096;
        if (round_(f, s, n, 3 + (unsigned)(r % 5), false, &sum)) return 1;
        if (round_(f, s, n, 2 + (unsigned)(r % 3), true, &sum)) return 1;
        CK(cuModuleUnload(m));
        if (vmm_round(dev, s, 7 + (unsigned)(r % 11), &sum)) return 1;
        if (victim && ipc && ipc_round(ipc, s)) return 1;
    }
    printf("survivor: %ld rounds, checksum %llu\n", rounds, sum);
    printf("PASS\n");
    return 0;
}
