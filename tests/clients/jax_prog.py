"""JAX through omps: jit, grad, vmap, fft, a scan and random numbers; prints every result
as text (hex of the bytes' hash and a few values), so a run through omps compares with a
native run line for line."""

import hashlib
import os

import numpy as np


def show(name, x):
    a = np.asarray(x)
    h = hashlib.sha256(a.tobytes()).hexdigest()[:16]
    flat = a.reshape(-1)
    print(f"{name}: shape={a.shape} dtype={a.dtype} sha={h} head={flat[:4].tolist()}", flush=True)


def main():
    # XLA's autotuner times candidate kernels and keeps the fastest: timings vary from run
    # to run (natively too), and with them the chosen kernels and the results' last bits.
    # Without it each run picks the same kernels, so outputs compare bit for bit.
    os.environ.setdefault("XLA_FLAGS", "--xla_gpu_autotune_level=0")
    import jax
    import jax.numpy as jnp

    print("devices:", [d.platform for d in jax.devices()], flush=True)
    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    x = jax.random.normal(k1, (256, 256), dtype=jnp.float32)
    w = jax.random.normal(k2, (256, 64), dtype=jnp.float32)
    show("rand", x)

    @jax.jit
    def mlp(w, x):
        return jnp.tanh(x @ w).sum()

    show("mlp", mlp(w, x))
    show("grad", jax.grad(mlp)(w, x))
    show("vmap", jax.vmap(lambda r: jnp.dot(r, r))(x))
    show("fft", jnp.fft.fft(x[0]))
    show("rfft2", jnp.fft.rfft2(x[:64, :64]))

    def body(c, v):
        c = c * 0.9 + v
        return c, c.sum()

    show("scan", jax.lax.scan(body, jnp.zeros(256), x)[1])
    y = jnp.linalg.solve(x[:32, :32] + 32 * jnp.eye(32), jnp.ones(32))
    show("solve", y)
    show("bf16", (x.astype(jnp.bfloat16) @ x.astype(jnp.bfloat16)).astype(jnp.float32))
    show("uniform", jax.random.uniform(k3, (1000,)))
    host = np.arange(1 << 20, dtype=np.float32)
    show("roundtrip", jax.device_put(host) * 2)
    print("jax done", flush=True)


if __name__ == "__main__":
    main()
