// Kernel image for spin_concurrency and hold_memory (built as a cubin for sm_90).
__device__ __forceinline__ unsigned long long global_timer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Every thread spins for ns nanoseconds of %globaltimer; thread 0 of block 0
// then counts the launch in *launches.
extern "C" __global__ void spin(unsigned long long ns, unsigned *launches) {
    unsigned long long t0 = global_timer_ns();
    while (global_timer_ns() - t0 < ns) {
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(launches, 1u);
}

// Touches n words of buf (short kernel for hold_memory's loop).
extern "C" __global__ void touch(unsigned *buf, unsigned long long n, unsigned v) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        buf[i] += v;
}
