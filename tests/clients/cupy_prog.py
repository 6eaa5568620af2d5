"""CuPy through omps: elementwise and reduction kernels, a raw kernel compiled by NVRTC,
linalg (cuBLAS, cuSOLVER), FFT (cuFFT), random numbers (cuRAND), streams and events,
pinned memory. Prints each result's hash so outputs compare line for line."""

import hashlib

import numpy as np


def show(name, x):
    import cupy as cp
    a = cp.asnumpy(x) if isinstance(x, cp.ndarray) else np.asarray(x)
    h = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]
    print(f"{name}: shape={a.shape} dtype={a.dtype} sha={h} head={a.reshape(-1)[:4].tolist()}", flush=True)


def main():
    import cupy as cp
    print("devices:", cp.cuda.runtime.getDeviceCount(), flush=True)
    x = cp.arange(1 << 16, dtype=cp.float32) / 7
    show("elementwise", cp.sin(x) * 2 + x)
    show("reduce", x.sum())
    square = cp.RawKernel(r'''
    extern "C" __global__ void sq(const float* a, float* b, int n) {
        int i = blockDim.x * blockIdx.x + threadIdx.x;
        if (i < n) b[i] = a[i] * a[i] + 1.0f;
    }''', "sq")
    y = cp.empty_like(x)
    square(((x.size + 255) // 256,), (256,), (x, y, cp.int32(x.size)))
    show("rawkernel", y)
    rs = cp.random.RandomState(seed=5)
    m = rs.standard_normal((128, 128), dtype=cp.float64)
    show("curand", m)
    show("matmul", m @ m)
    show("inv", cp.linalg.inv(m + 128 * cp.eye(128)))
    show("svd", cp.linalg.svd(m[:32, :32], compute_uv=False))
    show("fft", cp.fft.fft(m[0]))
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        z = cp.ones(1 << 20, dtype=cp.float32) * 3
        ev = s.record()
    cp.cuda.get_current_stream().wait_event(ev)
    show("stream", z.sum())
    pinned = cp.cuda.alloc_pinned_memory(1 << 20)
    host = np.frombuffer(pinned, dtype=np.float32, count=1 << 18)
    host[:] = np.arange(1 << 18, dtype=np.float32)
    d = cp.asarray(host)
    show("pinned", d * 2)
    print("cupy done", flush=True)


if __name__ == "__main__":
    main()
