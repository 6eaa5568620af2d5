// Kernel image for vector_add (built as a fatbin: sm_90 SASS + compute_90 PTX).
extern "C" __global__ void vector_add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
