"""Workloads: PyTorch's CUDA semantics that programs rely on beyond plain kernels, each
one a behaviour that failed through omps once (issue 22): grad scaling with every
optimizer, optimizer steps and random sampling captured into CUDA graphs (graph-safe RNG
asks the capture status from inside the capture), allocations in the middle of a capture,
host memory pinned by registration while graphs are captured, torch.cuda.MemPool with
empty_cache, the allocator's reuse of memory freed during captures on several streams,
and green contexts."""

import torch

from registry import DEV, SkipWorkload, cpu, gen, randn, workload


def _case(out, prefix, fn):
    """One case's results under `prefix`; an exception becomes a result of its own (its
    text), so that one failing case names itself and the others still compare."""
    try:
        for key, v in fn().items():
            out[f"{prefix}.{key}"] = v
    except Exception as e:  # noqa: BLE001  (compared with the native run's: none)
        out[f"{prefix}.error"] = f"{type(e).__name__}: {e}"[:300]
        torch.cuda.synchronize()


# ------------------------------------------------------------------ grad scaling, eagerly

_OPTIMS = {
    "sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 0.05}),
    "adamw": (torch.optim.AdamW, {"lr": 0.05}),
    "adamax": (torch.optim.Adamax, {"lr": 0.05}),
    "nadam": (torch.optim.NAdam, {"lr": 0.05}),
    "radam": (torch.optim.RAdam, {"lr": 0.05}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 0.01}),
    "rprop": (torch.optim.Rprop, {"lr": 0.01}),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.1}),
}


def _scaled_steps(ctor, kwargs, steps=6):
    """A small two-layer model trained with autocast and a GradScaler whose scale starts
    too high, so that the first steps find inf gradients and are skipped (the scaler reads
    found_inf back to the host) and the later ones apply: the parameters after each step
    depend on every read of found_inf being ordered after the kernels that wrote it."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.ReLU(), torch.nn.Linear(5, 5)).to(DEV)
    opt = ctor(net.parameters(), **kwargs)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 60, growth_interval=2)
    out = {}
    for i in range(steps):
        x = randn(16, 5, seed=300 + i)
        t = randn(16, 5, seed=320 + i)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(net(x), t)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        out[f"scale{i}"] = scaler.get_scale()
        out[f"w{i}"] = cpu(net[0].weight)
    out.update({f"p.{k}": cpu(v) for k, v in net.state_dict().items()})
    return out


@workload("grad_scaling", exact=True)
def grad_scaling():
    out = {}
    for name, (ctor, kw) in _OPTIMS.items():
        for variant in ("single", "foreach", "fused"):
            k = dict(kw)
            if variant == "foreach":
                k["foreach"] = True
            elif variant == "fused":
                if name not in ("sgd", "adam", "adamw", "adagrad"):
                    continue
                k["fused"] = True
            else:
                k["foreach"] = False
            _case(out, f"{name}.{variant}", lambda: _scaled_steps(ctor, k))
    return out


# ------------------------------------------------------------------ captured optimizer steps

def _graphed_steps(ctor, kwargs, scaled, steps_warmup=3, steps_train=4):
    """An optimizer step captured into a CUDA graph and replayed, against the same steps
    run eagerly (PyTorch's own test of graphed optimizers does this): parameters 5x5, 6x6
    and a scalar, gradients from the seeded CPU generator. With `scaled`, a GradScaler's
    unscale and step are captured too (the fused and capturable optimizers take found_inf
    as a tensor, so nothing is read back during the capture)."""
    shapes = [(5, 5), (6, 6), ()]
    params = [torch.randn(s, generator=gen(400 + i)).to(DEV) for i, s in enumerate(shapes)]
    grads = [[torch.randn(s, generator=gen(500 + 10 * j + i)).to(DEV) for i, s in enumerate(shapes)]
             for j in range(steps_warmup + steps_train)]
    result = {}
    for graphed in (False, True):
        ps = [p.clone().requires_grad_() for p in params]
        opt = ctor(ps, **kwargs)
        scaler = torch.amp.GradScaler("cuda", init_scale=128.0) if scaled else None

        def step(j):
            for p, gr in zip(ps, grads[j]):
                p.grad = gr * (128.0 if scaled else 1.0)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()

        for j in range(steps_warmup):
            step(j)
        if graphed:
            static = [torch.empty_like(p) for p in ps]
            for p, st in zip(ps, static):
                p.grad = st
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                if scaler is not None:
                    scaler.step(opt)
                else:
                    opt.step()
            for j in range(steps_warmup, steps_warmup + steps_train):
                for st, gr in zip(static, grads[j]):
                    st.copy_(gr * (128.0 if scaled else 1.0))
                g.replay()
        else:
            for j in range(steps_warmup, steps_warmup + steps_train):
                if scaler is not None:
                    for p, gr in zip(ps, grads[j]):
                        p.grad = gr * 128.0
                    scaler.step(opt)  # no update: the graphed run replays a fixed scale
                else:
                    step(j)
        for i, p in enumerate(ps):
            result[f"{'graphed' if graphed else 'eager'}.p{i}"] = cpu(p)
    return result


_GRAPHED = {
    "adam_fused": (torch.optim.Adam, {"lr": 0.1, "fused": True, "capturable": True}, True),
    "adamw_fused": (torch.optim.AdamW, {"lr": 0.1, "fused": True, "capturable": True}, True),
    "sgd_fused": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "fused": True}, True),
    "adamw_foreach": (torch.optim.AdamW, {"lr": 0.1, "foreach": True, "capturable": True}, False),
    "sgd_foreach": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "foreach": True}, False),
    "adam_foreach": (torch.optim.Adam, {"lr": 0.1, "foreach": True, "capturable": True}, False),
    "adamax": (torch.optim.Adamax, {"lr": 0.1, "capturable": True}, False),
    "nadam": (torch.optim.NAdam, {"lr": 0.1, "capturable": True}, False),
    "radam": (torch.optim.RAdam, {"lr": 0.1, "capturable": True}, False),
    "rmsprop": (torch.optim.RMSprop, {"lr": 0.01, "capturable": True}, False),
    "rprop": (torch.optim.Rprop, {"lr": 0.01, "capturable": True}, False),
}


@workload("graphed_optimizers", exact=True)
def graphed_optimizers():
    out = {}
    for name, (ctor, kw, scaled) in _GRAPHED.items():
        _case(out, name, lambda: _graphed_steps(ctor, kw, scaled))
        if scaled:
            _case(out, f"{name}.unscaled", lambda: _graphed_steps(ctor, kw, False))
    return out


# ------------------------------------------------------------------ RNG in captures

@workload("graph_rng", exact=True)
def graph_rng():
    """torch.multinomial, dropout and rand captured in a CUDA graph (an LLM's sampling
    step): the graph-safe generator asks whether the stream is capturing from inside the
    capture, and each replay advances the Philox offset."""
    torch.manual_seed(7)
    probs = torch.softmax(randn(4, 1000, seed=600), dim=-1)
    x = randn(64, 64, seed=601)
    out = {}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            torch.multinomial(probs, 8, replacement=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tokens = torch.multinomial(probs, 8, replacement=True)
        drop = torch.nn.functional.dropout(x, p=0.5)
        r = torch.rand(32, device=DEV)
    for i in range(3):
        g.replay()
        out[f"tokens{i}"] = cpu(tokens)
        out[f"drop{i}"] = cpu(drop)
        out[f"rand{i}"] = cpu(r)
    out["after"] = cpu(torch.rand(8, device=DEV))  # eager again, after the captures
    return out


@workload("graph_alloc_midcapture", exact=True)
def graph_alloc_midcapture():
    """Blocks the caching allocator must get from the driver in the middle of a capture
    (sizes it has never cached), on the capture's private pool, then the graph replayed."""
    torch.manual_seed(0)
    x = randn(1024, seed=610)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g.capture_begin()
        big = torch.empty(48 << 20, dtype=torch.uint8, device=DEV)  # a new 48 MiB segment
        big.fill_(3)
        y = x * 2 + big[:1024].float()
        z = torch.zeros(3 << 20, device=DEV)  # and another large one
        z[:1024] = y
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    out = {}
    for i in range(2):
        x.add_(1)
        g.replay()
        out[f"y{i}"] = cpu(y)
        out[f"z{i}"] = cpu(z[:2048])
    return out


# ------------------------------------------------------------------ pinned memory and pools

@workload("pinned_register_capture", exact=True,
          env={"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True,pinned_num_register_threads:4"})
def pinned_register_capture():
    """The pinned-memory allocator registering host memory (cudaHostRegister) while a CUDA
    graph is captured on another stream, and the copies from that memory."""
    x = randn(256, 256, seed=620)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x @ x
    torch.cuda.current_stream().wait_stream(s)
    out = {}
    with torch.cuda.graph(g):
        y = x @ x
        pinned = torch.arange(1 << 20, dtype=torch.float32).pin_memory()  # registered now
        y2 = y + 1
    g.replay()
    out["y"] = cpu(y2)
    host = [torch.full((1 << 18,), float(i)).pin_memory() for i in range(4)]
    dev = [h.to(DEV, non_blocking=True) for h in host]
    out["pinned_sum"] = cpu(pinned.sum())
    out["copies"] = cpu(torch.stack([d.sum() for d in dev]))
    return out


@workload("mempool_empty_cache", exact=True)
def mempool_empty_cache():
    """torch.cuda.MemPool: allocations routed to a pool of the program's own, the pool
    released, then empty_cache, from one thread and from several. PyTorch itself asserts
    (natively too) if a pool is destroyed or the cache emptied while any thread still
    routes allocations to a pool, so the threads meet at a barrier between the two."""
    import threading
    if not hasattr(torch.cuda, "MemPool"):
        raise SkipWorkload("this PyTorch has no torch.cuda.MemPool")
    out = {}

    def one(tag, results, barrier=None):
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            a = torch.arange(1 << 20, device=DEV, dtype=torch.float32)
            b = a * 2
        results[f"{tag}.b"] = cpu(b[:16])
        results[f"{tag}.segments"] = len(pool.snapshot())
        if barrier is not None:
            barrier.wait()
        del a, b
        torch.cuda.synchronize()
        del pool
        if barrier is not None:
            barrier.wait()
        torch.cuda.empty_cache()

    one("single", out)
    results = {}
    barrier = threading.Barrier(4)
    threads = [threading.Thread(target=one, args=(f"t{i}", results, barrier)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.update(results)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    out["reserved_after"] = torch.cuda.memory_reserved()
    return out


def _reclaim(nstreams):
    """Memory a capture frees on one of several streams: with
    graph_capture_record_stream_reuse the allocator asks the capture's dependencies
    (cudaStreamGetCaptureInfo) to reuse a block before the capture ends."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    streams = [torch.cuda.Stream() for _ in range(nstreams)]
    g = torch.cuda.CUDAGraph()
    x = randn(1 << 18, seed=630 + nstreams)
    out = {}
    with torch.cuda.graph(g):
        cur = torch.cuda.current_stream()
        parts = []
        for i, s in enumerate(streams):
            s.wait_stream(cur)
            with torch.cuda.stream(s):
                t = x * (i + 1)
                parts.append(t)
        for s in streams:
            cur.wait_stream(s)
        acc = sum(parts)
        for p in parts:
            p.record_stream(cur)
        del parts
        more = [acc + i for i in range(nstreams)]
        y = torch.stack(more).sum(0)
    g.replay()
    st = torch.cuda.memory_stats()
    out[f"y{nstreams}"] = cpu(y)
    for k in ("segment.all.current", "active.all.current", "reserved_bytes.all.current",
              "active_bytes.all.current", "num_alloc_retries"):
        out[f"{k}.{nstreams}"] = st.get(k, -1)
    return out


@workload("graph_reclaim_streams", exact=True,
          env={"PYTORCH_CUDA_ALLOC_CONF": "graph_capture_record_stream_reuse:True"})
def graph_reclaim_streams():
    out = {}
    for n in (2, 4):
        out.update(_reclaim(n))
    return out


# ------------------------------------------------------------------ green contexts

@workload("green_context", exact=True)
def green_context():
    """torch.cuda.green_contexts: a context on a subset of the SMs, work run in it."""
    try:
        from torch.cuda.green_contexts import GreenContext
    except ImportError as e:
        raise SkipWorkload(f"no torch.cuda.green_contexts: {e}")
    a = randn(512, 512, seed=640)
    gctx = GreenContext.create(num_sms=16, device_id=0)
    gctx.set_context()
    try:
        y = torch.relu(a @ a)
        torch.cuda.synchronize()
    finally:
        gctx.pop_context()
    return {"y": cpu(y), "after": cpu(a.sum())}


@workload("graph_after_failed_capture", exact=True)
def graph_after_failed_capture():
    """A capture that fails the way PyTorch's own tests make it fail (a synchronize inside
    it), then what the process can still do: the same call must fail or succeed as
    natively at every step (PyTorch runs its own such test in a subprocess, as the failed
    capture may leave the context unusable, so each step records its outcome rather than
    stopping the workload)."""
    out = {}

    def step(name, fn):
        try:
            r = fn()
            out[name] = "ok"
            return r
        except RuntimeError as e:
            # The error's kind, not its text: the text names the API call.
            msg = str(e)
            out[name] = ("capture-unsupported" if "not permitted when stream is capturing" in msg
                         else "invalidated" if "previous error during capture" in msg or "invalidated" in msg
                         else "error")
            return None

    x = randn(64, 64, seed=650)
    s = torch.cuda.Stream()
    # cuBLAS makes its handle on first use, which a capture forbids: warm it up first, on
    # the stream the capture uses, as torch.cuda.graph's users do.
    with torch.cuda.stream(s):
        x @ x
    torch.cuda.synchronize()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        g.capture_begin()
        y = x @ x
        step("sync_in_capture", torch.cuda.synchronize)
        step("capture_end", g.capture_end)
    step("sync_after", torch.cuda.synchronize)
    out["capturing_after"] = torch.cuda.is_current_stream_capturing()
    z = step("eager_after", lambda: cpu(torch.relu(x @ x)))
    if z is not None:
        out["eager"] = z
    torch.manual_seed(3)
    probs = torch.softmax(randn(2, 100, seed=651), dim=-1)
    g2 = torch.cuda.CUDAGraph()

    def capture_again():
        with torch.cuda.graph(g2):
            out_t = torch.multinomial(probs, 4, replacement=True)
        g2.replay()
        return cpu(out_t)

    t = step("capture_again", capture_again)
    if t is not None:
        out["tokens"] = t
    del y
    return out
