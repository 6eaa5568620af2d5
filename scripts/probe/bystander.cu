// Probe (issue 8, "blocking"): does one client's housekeeping make another wait? Three
// roles, one process each:
//   bystander hog SECONDS     one single-block kernel that spins SECONDS (keeps the GPU busy)
//   bystander probe SECONDS   empty kernel + cudaStreamSynchronize in a loop for SECONDS;
//                             prints "PROBE n p50_us p99_us max_us"
//   bystander churn [limit]   frees 4 x 64 MiB it allocated, queues 10,000 launches and exits
//                             (its modules are unloaded at exit); with "limit", also raises
//                             the stack limit (the driver makes that wait for the GPU)
// scripts/probe/bystander.sh runs probe alone, then beside hog + churn, natively, under
// NVIDIA MPS and under omps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorName(e_)); exit(1); } } while (0)

__global__ void spin(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
__global__ void empty() {}

using clk = std::chrono::steady_clock;

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: bystander hog|probe SECONDS | churn [limit]\n"); return 2; }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (!strcmp(argv[1], "hog")) {
        double sec = argc > 2 ? atof(argv[2]) : 2.0;
        spin<<<1, 1, 0, s>>>((long long)(sec * 1e9));
        CK(cudaStreamSynchronize(s));
        printf("HOG done\n");
    } else if (!strcmp(argv[1], "probe")) {
        double sec = argc > 2 ? atof(argv[2]) : 2.0;
        for (int i = 0; i < 100; i++) { empty<<<1, 1, 0, s>>>(); CK(cudaStreamSynchronize(s)); }
        std::vector<double> us;
        auto end = clk::now() + std::chrono::duration<double>(sec);
        while (clk::now() < end) {
            auto t = clk::now();
            empty<<<1, 1, 0, s>>>();
            CK(cudaStreamSynchronize(s));
            us.push_back(std::chrono::duration<double, std::micro>(clk::now() - t).count());
        }
        std::sort(us.begin(), us.end());
        printf("PROBE %zu %.1f %.1f %.1f\n", us.size(), us[us.size() / 2], us[us.size() * 99 / 100], us.back());
    } else if (!strcmp(argv[1], "churn")) {
        void *p[4];
        for (auto &q : p) CK(cudaMalloc(&q, 64 << 20));
        CK(cudaStreamSynchronize(s));
        for (auto q : p) CK(cudaFree(q));
        if (argc > 2 && !strcmp(argv[2], "limit")) CK(cudaDeviceSetLimit(cudaLimitStackSize, 8192));
        for (int i = 0; i < 10000; i++) empty<<<1, 1, 0, s>>>();
        printf("CHURN done\n");
    }
    return 0;
}
