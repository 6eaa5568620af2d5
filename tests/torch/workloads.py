"""Workload registry: each workload runs on CUDA and returns {name: tensor on CPU | number | str}.

    python3 workloads.py NAME OUTFILE     runs one workload and torch.saves its dict

The harness (harness.py) runs every workload in a fresh process, natively and as an omps
client, and compares the dicts. A workload is declared `exact` when the same deterministic
algorithms run in both (bit-identical results expected), else it is compared with a
tolerance measured from two native runs. Keys starting with "__" are metadata, not compared.
"""

import copy
import os
import sys
import time
from dataclasses import dataclass, field

# Before torch: cuBLAS reads this at its first handle (deterministic workspace use).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from models import GPTDecoder, SmallConvNet  # noqa: E402

# TORCH_SUITE_DEVICE=cpu only serves to check this file's Python without a GPU.
DEV = os.environ.get("TORCH_SUITE_DEVICE", "cuda")


class SkipWorkload(Exception):
    """Raised when the GPU cannot run the workload (saved as {"__skip__": reason})."""


@dataclass
class Workload:
    name: str
    fn: object
    exact: bool
    env: dict = field(default_factory=dict)  # set in the process env before torch is imported
    known_broken: str = ""  # under omps, for now: the tests mark it xfail (not strict)


REGISTRY = {}


def workload(name, exact, env=None, known_broken=""):
    def deco(fn):
        REGISTRY[name] = Workload(name, fn, exact, dict(env or {}), known_broken)
        return fn
    return deco


def setup_determinism():
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)


def gen(seed):
    """A CPU generator: inputs are made on the CPU and copied, so they never depend on
    GPU random kernels (cuRAND-style generation has its own workload)."""
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=gen(seed)).to(DEV, dtype)


def cpu(t):
    return t.detach().cpu()


# ------------------------------------------------------------------ vision models

def _vision(model_fn, batch, channels_last_key):
    """fp32, fp16, bf16 and fp16 channels-last inference of one randomly initialised model."""
    torch.manual_seed(0)
    base = model_fn().eval()
    x = torch.randn(batch, 3, 224, 224, generator=gen(1))
    out = {}
    variants = [("fp32", torch.float32, False), ("fp16", torch.float16, False),
                ("bf16", torch.bfloat16, False), (channels_last_key, torch.float16, True)]
    with torch.no_grad():
        for key, dtype, cl in variants:
            m = copy.deepcopy(base).to(DEV, dtype)
            inp = x.to(DEV, dtype)
            if cl:
                m = m.to(memory_format=torch.channels_last)
                inp = inp.contiguous(memory_format=torch.channels_last)
            out[key] = cpu(m(inp))
            del m
    return out


@workload("resnet50", exact=True)
def resnet50():
    import torchvision
    return _vision(torchvision.models.resnet50, 2, "fp16_channels_last")


@workload("vit_b_16", exact=True)
def vit_b_16():
    import torchvision
    return _vision(torchvision.models.vit_b_16, 1, "fp16_channels_last")


@workload("gpt2_generate", exact=True)
def gpt2_generate():
    torch.manual_seed(0)
    model = GPTDecoder().to(DEV, torch.float16).eval()
    prompt = torch.randint(0, 50257, (1, 8), generator=gen(2)).to(DEV)
    ids, logits = model.generate(prompt, steps=64)
    return {"token_ids": cpu(ids), "final_logits": cpu(logits)}


# ------------------------------------------------------------------ attention, BLAS

@workload("sdpa", exact=True)  # forward passes only: every backend's forward is deterministic
def sdpa():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    out = {}
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = (randn(2, 8, 256, 64, seed=s, dtype=dtype) for s in (10, 11, 12))
        for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                   SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION):
            with sdpa_kernel(be):
                for causal in (False, True):
                    key = f"{str(dtype)[6:]}_{be.name}_{'causal' if causal else 'full'}"
                    out[key] = cpu(F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    return out


@workload("matmul", exact=True)
def matmul():
    out = {}
    prev = torch.backends.cuda.matmul.allow_tf32
    try:
        for key, dtype, tf32 in [("fp32", torch.float32, False), ("tf32", torch.float32, True),
                                 ("fp16", torch.float16, False), ("bf16", torch.bfloat16, False),
                                 ("fp64", torch.float64, False)]:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a, b = randn(512, 384, seed=20, dtype=dtype), randn(384, 256, seed=21, dtype=dtype)
            out[f"{key}_mm"] = cpu(a @ b)
            out[f"{key}_mm_tn"] = cpu(a.t().contiguous().t() @ b.t().contiguous().t())
            bias = randn(256, seed=22, dtype=dtype)
            out[f"{key}_addmm"] = cpu(torch.addmm(bias, a, b, beta=0.5, alpha=2.0))
            # Long K, small M and N: the shape where cuBLAS picks split-K kernels.
            out[f"{key}_splitk"] = cpu(randn(64, 8192, seed=23, dtype=dtype) @ randn(8192, 64, seed=24, dtype=dtype))
            out[f"{key}_bmm"] = cpu(torch.bmm(randn(8, 64, 96, seed=25, dtype=dtype),
                                              randn(8, 96, 48, seed=26, dtype=dtype)))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return out


@workload("matmul_fp8", exact=True)
def matmul_fp8():
    if DEV != "cuda" or torch.cuda.get_device_capability() < (8, 9):
        raise SkipWorkload("fp8 torch._scaled_mm needs compute capability 8.9 or newer")
    a = randn(64, 128, seed=30).to(torch.float8_e4m3fn)
    b = randn(96, 128, seed=31).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
    sa, sb = torch.tensor(0.5, device=DEV), torch.tensor(2.0, device=DEV)
    out = {}
    for dt in (torch.bfloat16, torch.float32):
        out[str(dt)[6:]] = cpu(torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=dt))
    return out


@workload("conv", exact=True)  # cudnn.deterministic: deterministic forward and backward algos
def conv():
    out = {}
    for key, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.Conv2d(16, 32, 3, stride=2)).to(DEV, dtype)
        x = randn(4, 3, 32, 32, seed=40, dtype=dtype).requires_grad_()
        y = net(x)
        y.backward(randn(*y.shape, seed=41, dtype=dtype))
        out[f"{key}_y"] = cpu(y)
        out[f"{key}_dx"] = cpu(x.grad)
        for i in (0, 2):
            out[f"{key}_dw{i}"] = cpu(net[i].weight.grad)
            out[f"{key}_db{i}"] = cpu(net[i].bias.grad)
    return out


@workload("train_adamw", exact=True)
def train_adamw():
    torch.manual_seed(0)
    net = SmallConvNet().to(DEV)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    out = {}
    for step in range(3):
        x = randn(8, 3, 32, 32, seed=50 + step)
        labels = torch.randint(0, 10, (8,), generator=gen(60 + step)).to(DEV)
        loss = F.cross_entropy(net(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out[f"loss{step}"] = cpu(loss)
    out.update({f"w.{k}": cpu(v) for k, v in net.state_dict().items()})
    return out


# ------------------------------------------------------------------ CUDA libraries

@workload("fft", exact=True, known_broken="cuFFT fails under omps (scripts/probe/torch_smoke.py)")
def fft():
    x = randn(4096, seed=70)
    z = torch.complex(randn(64, 64, seed=71), randn(64, 64, seed=72))
    return {"fft": cpu(torch.view_as_real(torch.fft.fft(x))),
            "rfft": cpu(torch.view_as_real(torch.fft.rfft(x))),
            "ifft2": cpu(torch.view_as_real(torch.fft.ifft2(z)))}


@workload("rand", exact=True)  # Philox with a seeded CUDA generator: fixed sequence
def rand():
    g = torch.Generator(device=DEV).manual_seed(1234)
    p = torch.full((4096,), 0.3, device=DEV)
    return {"rand": cpu(torch.rand(10000, device=DEV, generator=g)),
            "randn": cpu(torch.randn(10000, device=DEV, generator=g)),
            "bernoulli": cpu(torch.bernoulli(p, generator=g)),
            "randint": cpu(torch.randint(0, 1000, (4096,), device=DEV, generator=g)),
            "normal_fp16": cpu(torch.empty(4096, device=DEV, dtype=torch.float16).normal_(generator=g))}


def _sign_fix(vecs):
    """Eigen/singular vectors are defined up to sign: make each column's largest entry positive."""
    idx = vecs.abs().argmax(dim=-2, keepdim=True)
    return vecs * torch.gather(vecs, -2, idx).sign()


# Tolerance: PyTorch picks cuSOLVER or MAGMA by size, and MAGMA's hybrid routines run part
# of the work in host LAPACK, whose threading need not give the same bits every run.
@workload("linalg", exact=False)
def linalg():
    out = {}
    for key, dtype in (("fp64", torch.float64), ("fp32", torch.float32)):
        a = randn(64, 64, seed=80, dtype=dtype)
        spd = a @ a.t() + 64 * torch.eye(64, device=DEV, dtype=dtype)
        rhs = randn(64, 8, seed=81, dtype=dtype)
        out[f"{key}_cholesky"] = cpu(torch.linalg.cholesky(spd))
        out[f"{key}_inv"] = cpu(torch.linalg.inv(spd))
        out[f"{key}_solve"] = cpu(torch.linalg.solve(a, rhs))
        q, r = torch.linalg.qr(a)
        out[f"{key}_qr_q"], out[f"{key}_qr_r"] = cpu(q), cpu(r)
        w, v = torch.linalg.eigh(spd)
        out[f"{key}_eigh_w"], out[f"{key}_eigh_v"] = cpu(w), cpu(_sign_fix(v))
        u, s, vh = torch.linalg.svd(randn(48, 32, seed=82, dtype=dtype), full_matrices=False)
        out[f"{key}_svd_s"] = cpu(s)
        # Flip u and v together so the product stays the same matrix.
        sign = torch.gather(u, 0, u.abs().argmax(dim=0, keepdim=True)).sign()
        out[f"{key}_svd_u"], out[f"{key}_svd_vh"] = cpu(u * sign), cpu(vh * sign.t())
    return out


# Tolerance: cuSPARSE's default SpMM algorithms do not promise the same bits run to run.
@workload("sparse", exact=False)
def sparse():
    d = randn(128, 96, seed=90)
    d[d.abs() < 1.2] = 0
    dense = randn(96, 16, seed=91)
    idx = torch.randint(0, 64, (2, 500), generator=gen(92)).to(DEV)  # many duplicates
    coo = torch.sparse_coo_tensor(idx, randn(500, seed=93), (64, 64)).coalesce()
    return {"csr_mm": cpu(d.to_sparse_csr() @ dense),
            "coo_indices": cpu(coo.indices()), "coo_values": cpu(coo.values()),
            "coo_spmm": cpu(torch.sparse.mm(coo, randn(64, 16, seed=94)))}


@workload("jiterator", exact=True)  # NVRTC compiles the kernel at run time
def jiterator():
    fma = torch.cuda.jiterator._create_jit_fn(
        "template <typename T> T fma_like(T x, T y, T alpha) { return x * y + alpha; }", alpha=1.0)
    wave = torch.cuda.jiterator._create_jit_fn(
        "template <typename T> T wave(T x) { return sin(x) * exp(-x * x / T(8)); }")
    x32, y32 = randn(4096, seed=100), randn(4096, seed=101)
    return {"fma_fp32": cpu(fma(x32, y32, alpha=0.25)), "wave_fp32": cpu(wave(x32)),
            "fma_fp16": cpu(fma(x32.half(), y32.half()))}


# Exact because the harness gives every run of a session one inductor/Triton cache: the
# omps runs reuse the kernels (and any autotuning choice) that the native run made.
@workload("compile", exact=True, env={"TORCHINDUCTOR_COMPILE_THREADS": "1"})
def compile_():
    @torch.compile
    def f(x, y):
        return torch.sin(x) * y + (x * y).sum(dim=-1, keepdim=True).cos()

    torch.manual_seed(0)
    mod = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32),
                              torch.nn.LayerNorm(32)).to(DEV)
    cmod = torch.compile(mod)
    x = randn(16, 64, seed=110)
    with torch.no_grad():
        return {"fn": cpu(f(randn(32, 256, seed=111), randn(32, 256, seed=112))), "module": cpu(cmod(x))}


# ------------------------------------------------------------------ allocator, memory

def _alloc_churn():
    """Inference of a small model plus allocations of odd sizes freed out of order, so the
    allocator grows, splits and reuses segments. Returns results and the backend's name."""
    torch.manual_seed(0)
    net = SmallConvNet().to(DEV).eval()
    out = {"backend": torch.cuda.get_allocator_backend() if DEV == "cuda" else "cpu"}
    keep = []
    for i in range(12):
        keep.append(torch.full(((i * 7919) % 50000 + 1000,), float(i), device=DEV))
        if i % 3 == 2:
            keep.pop(0)
        big = torch.ones(((i + 1) << 20,), device=DEV)  # 4..48 MiB, freed at once
        keep[-1] += big[: keep[-1].numel()]
    with torch.no_grad():
        out["logits"] = cpu(net(randn(16, 3, 32, 32, seed=120)))
    out["churn_sum"] = cpu(torch.stack([k.sum() for k in keep]))
    return out


@workload("alloc_expandable", exact=True, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
          known_broken="expandable segments need cuMemCreate/cuMemMap, which the shim does not implement")
def alloc_expandable():
    return _alloc_churn()


@workload("alloc_async", exact=True, env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
          known_broken="cudaMallocAsync needs memory pools, not implemented (docs/design.md section 12)")
def alloc_async():
    return _alloc_churn()


@workload("meminfo", exact=True)
def meminfo():
    free, total = torch.cuda.mem_get_info()
    if not 0 < free <= total:
        raise AssertionError(f"mem_get_info: free {free} not in (0, total {total}]")
    a = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)
    b = torch.empty((3 << 20) + 7, dtype=torch.uint8, device=DEV)
    del a
    st = torch.cuda.memory_stats()
    # Free memory differs from run to run (other processes, the server): not returned.
    return {"total": total, "allocated_peak": st["allocated_bytes.all.peak"],
            "allocated_current": st["allocated_bytes.all.current"],
            "reserved_current": st["reserved_bytes.all.current"], "b_numel": b.numel()}


@workload("cuda_graph", exact=True, known_broken="CUDA graphs and stream capture are not implemented")
def cuda_graph():
    x, w = randn(64, 64, seed=130), randn(64, 64, seed=131)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = torch.relu(x @ w) * 3  # warm-up outside capture, as PyTorch asks
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = torch.relu(x @ w) * 3
    outs = {}
    for i in range(2):
        x.add_(1.0)  # replay must see the new input
        g.replay()
        outs[f"replay{i}"] = cpu(y)
    return outs


def run(name):
    wl = REGISTRY[name]
    for k, v in wl.env.items():
        if os.environ.get(k) != v:  # must be set before torch was imported: too late here
            raise SystemExit(f"workload {name} needs {k}={v} in its environment")
    setup_determinism()
    t0 = time.time()
    try:
        res = wl.fn()
    except SkipWorkload as e:
        return {"__skip__": str(e)}
    if DEV == "cuda":
        torch.cuda.synchronize()
    res["__seconds__"] = time.time() - t0
    res["__torch__"] = torch.__version__
    return res


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in REGISTRY:
        raise SystemExit(f"usage: {sys.argv[0]} NAME OUTFILE; NAME one of: {' '.join(REGISTRY)}")
    result = run(sys.argv[1])
    torch.save(result, sys.argv[2])
    print(f"{sys.argv[1]}: {len(result)} entries saved to {sys.argv[2]}", flush=True)
