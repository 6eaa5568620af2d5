"""Workloads: the other CUDA libraries (cuFFT, cuSOLVER, cuSPARSE, NVRTC), random
numbers, torch.compile, allocator variants, memory queries, CUDA graphs."""

import torch

from models import SmallConvNet
from registry import DEV, SkipWorkload, cpu, gen, randn, workload


# ------------------------------------------------------------------ CUDA libraries

@workload("fft", exact=True)
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


# Expandable segments: PyTorch maps physical memory into a reservation (cuMemCreate, cuMemMap).
@workload("alloc_expandable", exact=True, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
def alloc_expandable():
    return _alloc_churn()


# cudaMallocAsync: stream-ordered allocation from memory pools (cuMemAllocAsync, cuMemPool*).
@workload("alloc_async", exact=True, env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
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


@workload("cuda_graph", exact=True)
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


def _capture(fn, warmups=3):
    """torch.cuda.CUDAGraph of fn(), after warm-up runs on a side stream as PyTorch asks.
    Returns the graph and fn's output tensor inside the graph's memory."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fn()
    return g, y


@workload("cuda_graph_alloc_async", exact=True,
          env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
def cuda_graph_alloc_async():
    """A CUDA graph captured with the cudaMallocAsync allocator: the temporaries the capture
    allocates and frees are graph memory (cuMemAllocAsync / cuMemFreeAsync in a capture)."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                              torch.nn.Linear(1024, 256)).to(DEV)
    x = randn(16, 256, seed=150)
    static = x.clone()
    out = {}
    with torch.no_grad():
        g, y = _capture(lambda: mlp(static) * 2 + 1)
        for i in range(3):
            static.copy_(x * (i + 1))
            g.replay()
            out[f"replay{i}"] = cpu(y)
        out["eager"] = cpu(mlp(static) * 2 + 1)
    return out


@workload("cuda_graph_resnet50", exact=True)
def cuda_graph_resnet50():
    """ResNet-50 fp16 batch 1 captured once and replayed on new inputs, as a serving loop does."""
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval().to(DEV, torch.float16)
    x = torch.randn(1, 3, 224, 224, generator=gen(1)).to(DEV, torch.float16)
    static = x.clone()
    out = {}
    with torch.no_grad():
        g, y = _capture(lambda: model(static))
        for i in range(3):
            static.copy_(x * (i + 1))
            g.replay()
            out[f"replay{i}"] = cpu(y)
        out["eager"] = cpu(model(static))
    return out


@workload("cuda_graph_decode", exact=True)
def cuda_graph_decode():
    """The decoder's decode step (one token, key/value cache at a fixed position) captured
    once and replayed for several tokens, as LLM servers replay their decode steps."""
    from models import GPTDecoder
    torch.manual_seed(0)
    model = GPTDecoder().to(DEV, torch.float16).eval()
    prompt = torch.randint(0, 50257, (1, 8), generator=gen(2)).to(DEV)
    tok = torch.zeros(1, 1, dtype=torch.long, device=DEV)
    out = {}
    with torch.no_grad():
        cache = model.new_cache(1, 16, DEV, torch.float16)
        model(prompt, cache, 0)
        g, logits = _capture(lambda: model(tok, cache, 8)[:, -1])
        for i, t in enumerate((11, 2024, 50000)):
            tok.fill_(t)
            g.replay()
            out[f"logits{i}"] = cpu(logits)
        out["eager"] = cpu(model(tok, cache, 8)[:, -1])
    return out


# Exact for the reason `compile` is: one inductor/Triton cache per session.
@workload("compile_reduce_overhead", exact=True, env={"TORCHINDUCTOR_COMPILE_THREADS": "1"})
def compile_reduce_overhead():
    """torch.compile(mode="reduce-overhead"): inductor's kernels replayed through CUDA graphs
    (cudagraph trees record after the first calls)."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                              torch.nn.Linear(512, 256)).to(DEV)
    f = torch.compile(mlp, mode="reduce-overhead")
    out = {}
    with torch.no_grad():
        for i in range(6):
            out[f"call{i}"] = cpu(f(randn(32, 256, seed=140 + i)))
    return out


# ------------------------------------------------------------------ sharing across processes

def _ipc_child(q_in, q_out):
    t, ev = q_in.get()  # a CUDA tensor and an interprocess event from the parent
    torch.cuda.current_stream().wait_event(ev)
    t.mul_(3).add_(1)
    done = torch.cuda.Event(interprocess=True)
    done.record()
    q_out.put((done, cpu(t[:8])))
    q_in.get()  # keep the tensor alive until the parent has read it


@workload("ipc_share_expandable", exact=True,
          env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
def ipc_share_expandable():
    """ipc_share with expandable segments: the tensor's memory is VMM memory, shared as a
    POSIX descriptor (cuMemExportToShareableHandle / cuMemImportFromShareableHandle)."""
    return ipc_share()


@workload("ipc_share", exact=True)
def ipc_share():
    """torch.multiprocessing shares a CUDA tensor and events with a spawned process
    (cudaIpcGetMemHandle / OpenMemHandle and their event counterparts)."""
    mp = torch.multiprocessing.get_context("spawn")
    q_in, q_out = mp.Queue(), mp.Queue()
    p = mp.Process(target=_ipc_child, args=(q_in, q_out))
    p.start()
    t = torch.arange(4096, device=DEV, dtype=torch.float32)
    ev = torch.cuda.Event(interprocess=True)
    ev.record()
    q_in.put((t, ev))
    done, child_saw = q_out.get(timeout=60)
    torch.cuda.current_stream().wait_event(done)
    out = {"parent_sees": cpu(t[:8]), "child_saw": child_saw, "sum": cpu(t.sum())}
    q_in.put(None)
    p.join(timeout=60)
    return out


# ------------------------------------------------------------------ several GPUs

@workload("two_gpus", exact=True)
def two_gpus():
    """Two GPUs from one process: whether they reach each other, a matmul on each, tensors
    moved between them (contiguous: a peer copy; transposed: PyTorch's copy kernel, which
    reads the other GPU's memory directly where peer access is on), and a model's layer run
    on the second GPU with weights copied from the first."""
    if DEV != "cuda" or torch.cuda.device_count() < 2:
        raise SkipWorkload("needs two GPUs")
    torch.manual_seed(0)  # the layer's initial weights
    d0, d1 = torch.device("cuda:0"), torch.device("cuda:1")
    a = torch.randn(512, 512, generator=gen(7)).to(d0)
    b = torch.randn(512, 512, generator=gen(8)).to(d1)
    on0 = a @ a
    moved = on0.to(d1)
    on1 = moved @ b
    back = on1.to(d0)
    transposed = on0.t().to(d1)  # not contiguous: a kernel on one GPU reads the other
    strided = on1[::2, 1::3].to(d0)
    layer = torch.nn.Linear(512, 256).to(d0)
    layer1 = torch.nn.Linear(512, 256).to(d1)
    layer1.load_state_dict(layer.state_dict())  # weights copied across GPUs
    with torch.no_grad():
        y0, y1 = layer(a), layer1(a.to(d1))
    torch.cuda.synchronize(d0)
    torch.cuda.synchronize(d1)
    return {
        "peer_0_1": int(torch.cuda.can_device_access_peer(0, 1)),
        "peer_1_0": int(torch.cuda.can_device_access_peer(1, 0)),
        "on0": cpu(on0), "on1": cpu(on1), "back": cpu(back),
        "transposed": cpu(transposed), "strided": cpu(strided),
        "y0": cpu(y0), "y1": cpu(y1),
        "devices": f"{moved.device} {back.device} {transposed.device} {strided.device}",
    }
