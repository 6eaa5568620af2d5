// Prints the wall-clock time (ns since the epoch) at which this process's first
// cudaMalloc returned; scripts/probe/startup.sh starts several at once and subtracts.
#include <cstdio>
#include <ctime>

int main() {
    void *p;
    if (cudaMalloc(&p, 1 << 20) != cudaSuccess) { fprintf(stderr, "cudaMalloc failed\n"); return 1; }
    timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    printf("%lld\n", (long long)t.tv_sec * 1000000000LL + t.tv_nsec);
    return 0;
}
