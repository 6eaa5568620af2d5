"""numba-cuda through omps: kernels compiled from Python (NVVM, then the driver's JIT
linker), device arrays, shared memory, atomics, streams. Prints each result's hash."""

import hashlib

import numpy as np


def show(name, a):
    a = np.asarray(a)
    h = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]
    print(f"{name}: shape={a.shape} dtype={a.dtype} sha={h} head={a.reshape(-1)[:4].tolist()}", flush=True)


def main():
    if not hasattr(np, "row_stack"):
        # numba-cuda 0.30 registers np.row_stack, which NumPy 2.4 removed: an import error
        # natively too, nothing to do with omps.
        np.row_stack = np.vstack
    from numba import cuda, float32, int32

    print("gpus:", len(cuda.gpus), flush=True)

    @cuda.jit
    def saxpy(a, x, y, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = a * x[i] + y[i]

    @cuda.jit
    def block_sum(x, out):
        buf = cuda.shared.array(256, dtype=float32)
        t = cuda.threadIdx.x
        i = cuda.grid(1)
        buf[t] = x[i] if i < x.size else 0.0
        cuda.syncthreads()
        s = 128
        while s > 0:
            if t < s:
                buf[t] += buf[t + s]
            cuda.syncthreads()
            s //= 2
        if t == 0:
            out[cuda.blockIdx.x] = buf[0]

    @cuda.jit
    def histogram(x, bins):
        i = cuda.grid(1)
        if i < x.size:
            cuda.atomic.add(bins, int32(x[i]) % bins.size, 1)

    n = 1 << 16
    x = np.arange(n, dtype=np.float32) / 3
    y = np.ones(n, dtype=np.float32)
    dx, dy = cuda.to_device(x), cuda.to_device(y)
    dout = cuda.device_array_like(dx)
    saxpy[(n + 255) // 256, 256](np.float32(2.5), dx, dy, dout)
    show("saxpy", dout.copy_to_host())
    parts = cuda.device_array((n + 255) // 256, dtype=np.float32)
    block_sum[(n + 255) // 256, 256](dx, parts)
    show("block_sum", parts.copy_to_host())
    bins = cuda.to_device(np.zeros(64, dtype=np.int32))
    histogram[(n + 255) // 256, 256](cuda.to_device(np.arange(n, dtype=np.int32)), bins)
    show("histogram", bins.copy_to_host())
    s = cuda.stream()
    hp = cuda.pinned_array(n, dtype=np.float32)
    hp[:] = x
    d = cuda.to_device(hp, stream=s)
    saxpy[(n + 255) // 256, 256, s](np.float32(-1.0), d, dy, dout)
    out = cuda.pinned_array(n, dtype=np.float32)
    dout.copy_to_host(out, stream=s)
    s.synchronize()
    show("stream", out)
    print("numba done", flush=True)


if __name__ == "__main__":
    main()
