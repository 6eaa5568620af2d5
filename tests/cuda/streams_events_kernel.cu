// Kernel image for streams_events (built as a cubin for sm_90).
__device__ __forceinline__ unsigned long long global_timer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void spin_for(unsigned long long ns) {
    unsigned long long t0 = global_timer_ns();
    while (global_timer_ns() - t0 < ns) {
    }
}

// Spins, then writes x[i] = 3*i + 1 + round.
extern "C" __global__ void slow_write(int *x, int n, unsigned long long spin_ns, int round) {
    spin_for(spin_ns);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = 3 * i + 1 + round;
}

// y[i] = 2 * x[i].
extern "C" __global__ void read_copy(const int *x, int *y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = 2 * x[i];
}

extern "C" __global__ void spin(unsigned long long ns) { spin_for(ns); }
