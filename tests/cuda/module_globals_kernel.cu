// Kernel image for module_globals (built as PTX for compute_90, JIT-compiled
// at load time).
__device__ int counter;
__device__ float table[256];
__device__ int magic = 0x1234567;
__constant__ float scale;

// One block of 256 threads: table[t] = table[t] * scale + 1, counter += delta
// per thread, magic ^= 0x0F0F0F0F once.
extern "C" __global__ void update(int delta) {
    int t = threadIdx.x;
    table[t] = table[t] * scale + 1.0f;
    atomicAdd(&counter, delta);
    if (t == 0) magic ^= 0x0F0F0F0F;
}
