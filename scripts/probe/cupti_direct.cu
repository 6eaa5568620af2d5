// CUPTI's activity API used directly (issue 26): a program that enables kernel, memcpy,
// memset, synchronization, API and external-correlation records, runs a known mix of
// work, flushes, and prints what it got in a form that does not depend on the run
// (names, sizes, kinds, counts, which records are linked by correlation id), then the
// kernels' durations apart. Run natively and through omps, the first part must be the
// same; scripts/probe/cupti_direct.sh compares them.
#include <cuda_runtime.h>
#include <cupti.h>
#include <map>
#include <set>
#include <stdio.h>
#include <stdlib.h>
#include <string>
#include <vector>

#define CK(x) do { auto r_ = (x); if (r_ != 0) { printf("FAIL %s = %d at line %d\n", #x, (int)r_, __LINE__); exit(1); } } while (0)

__global__ void add_one(int *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1;
}
__global__ void scale(float *p, int n, float f) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= f;
}

struct Kernel { std::string name; unsigned gx, bx; uint32_t corr; uint64_t start, end; uint32_t stream; };
static std::vector<Kernel> kernels;
static std::vector<std::string> others;
static std::map<uint32_t, uint64_t> ext;   // correlation id -> external id
static std::set<uint32_t> api_corr;        // correlation ids of API records
static std::map<uint32_t, std::string> copy_corr;

static void CUPTIAPI request(uint8_t **buf, size_t *size, size_t *max) {
    *size = 1 << 20;
    *buf = (uint8_t *)aligned_alloc(8, *size);
    *max = 0;
}

static void CUPTIAPI complete(CUcontext, uint32_t, uint8_t *buf, size_t, size_t valid) {
    CUpti_Activity *r = NULL;
    char line[256];
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        switch (r->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            auto *k = (CUpti_ActivityKernel9 *)r;
            kernels.push_back({k->name, (unsigned)k->gridX, (unsigned)k->blockX, k->correlationId,
                               k->start, k->end, k->streamId});
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            auto *m = (CUpti_ActivityMemcpy5 *)r;
            snprintf(line, sizeof line, "memcpy kind %u src %u dst %u bytes %llu", m->copyKind,
                     m->srcKind, m->dstKind, (unsigned long long)m->bytes);
            others.push_back(line);
            copy_corr[m->correlationId] = line;
            if (m->end < m->start) others.push_back("memcpy ends before it starts");
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            auto *m = (CUpti_ActivityMemset4 *)r;
            snprintf(line, sizeof line, "memset value %u bytes %llu", m->value,
                     (unsigned long long)m->bytes);
            others.push_back(line);
            copy_corr[m->correlationId] = line;
            break;
        }
        case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
            auto *s = (CUpti_ActivitySynchronization *)r;
            snprintf(line, sizeof line, "synchronization type %u", (unsigned)s->type);
            others.push_back(line);
            break;
        }
        case CUPTI_ACTIVITY_KIND_DRIVER:
        case CUPTI_ACTIVITY_KIND_RUNTIME: {
            auto *a = (CUpti_ActivityAPI *)r;
            api_corr.insert(a->correlationId);
            break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
            auto *e = (CUpti_ActivityExternalCorrelation *)r;
            if (e->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
                ext[e->correlationId] = e->externalId;
            break;
        }
        default:
            break;
        }
    }
    free(buf);
}

int main() {
    CK(cuptiActivityRegisterCallbacks(request, complete));
    CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                  CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
                                  CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_ACTIVITY_KIND_RUNTIME,
                                  CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};
    for (auto k : kinds) CK(cuptiActivityEnable(k));
    const int n = 1 << 20;
    int *d;
    float *f;
    CK(cudaMalloc(&d, n * sizeof(int)));
    CK(cudaMalloc(&f, n * sizeof(float)));
    std::vector<int> host(n, 1);
    int *pinned;
    CK(cudaMallocHost(&pinned, n * sizeof(int)));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t ev;
    CK(cudaEventCreate(&ev));

    CK(cudaMemset(d, 0, n * sizeof(int)));
    CK(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, 100));
    for (int i = 0; i < 3; i++) add_one<<<n / 256, 256>>>(d, n);
    uint64_t last;
    CK(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last));
    CK(cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, 200));
    scale<<<n / 512, 512, 0, s>>>(f, n, 2.0f);
    CK(cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last));
    // A CUDA graph of two kernels, its graph destroyed once instantiated (as PyTorch
    // does), replayed three times: natively each node of each replay is a record.
    cudaGraph_t g;
    cudaGraphExec_t gx;
    CK(cudaDeviceSynchronize());  // the legacy stream's kernels first: s does not wait
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    add_one<<<n / 1024, 1024, 0, s>>>(d + n / 2, n / 2);
    scale<<<n / 2048, 1024, 0, s>>>(f, n / 2, 0.5f);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&gx, g, 0));
    CK(cudaGraphDestroy(g));
    for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(gx, s));
    CK(cudaEventRecord(ev, s));
    CK(cudaStreamSynchronize(s));  // before the legacy stream's copies read d
    CK(cudaMemcpy(host.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(d, host.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpyAsync(pinned, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CK(cudaMemsetAsync(f, 0, n * sizeof(float), s));
    CK(cudaStreamSynchronize(s));
    CK(cudaEventSynchronize(ev));
    CK(cudaDeviceSynchronize());
    int bad = 0;
    for (int i = 0; i < n; i++) bad += host[i] != (i < n / 2 ? 3 : 6);
    CK(cuptiActivityFlushAll(1));

    printf("result: %s\n", bad ? "WRONG" : "3 and 6 where expected");
    std::map<std::string, int> counts;
    for (auto &k : kernels) {
        char line[512];
        auto e = ext.find(k.corr);
        snprintf(line, sizeof line, "kernel %s grid %u block %u external %llu linked-to-api %s%s",
                 k.name.c_str(), k.gx, k.bx, e == ext.end() ? 0ULL : (unsigned long long)e->second,
                 api_corr.count(k.corr) ? "yes" : "no", k.end < k.start ? " ENDS-BEFORE-START" : "");
        counts[line]++;
    }
    for (auto &o : others) counts[o]++;
    for (auto &c : counts) printf("%s x%d\n", c.first.c_str(), c.second);
    // Same-stream kernels in order: each starts after the one before ends.
    int ordered = 1;
    for (size_t i = 1; i < kernels.size(); i++)
        if (kernels[i].stream == kernels[i - 1].stream && kernels[i].start < kernels[i - 1].end) ordered = 0;
    printf("same-stream kernels in order: %s\n", ordered ? "yes" : "no");
    for (auto &k : kernels)
        printf("duration %s %.2f us\n", k.name.c_str(), (k.end - k.start) / 1e3);
    return 0;
}
