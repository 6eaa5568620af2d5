// Kernel image for dyn_shared (built as a fatbin: sm_90 SASS + compute_90 PTX).
// Block reduction through dynamic shared memory: each block copies
// per_block words into `extern __shared__` memory (per_block * 4 bytes =
// the launch's sharedMemBytes), sums them and writes one word.
// blockDim.x must be a power of two and <= per_block.
extern "C" __global__ void block_sum(const unsigned *in, unsigned *out, int per_block) {
    extern __shared__ unsigned sdata[];
    const unsigned *src = in + (size_t)blockIdx.x * per_block;
    for (int i = threadIdx.x; i < per_block; i += blockDim.x) sdata[i] = src[i];
    __syncthreads();
    unsigned acc = 0;
    for (int i = per_block - 1 - (int)threadIdx.x; i >= 0; i -= blockDim.x) acc += sdata[i];
    __syncthreads();
    sdata[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sdata[threadIdx.x] += sdata[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = sdata[0];
}
