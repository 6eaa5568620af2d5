"""Discovery probe: runs a wide PyTorch workload section by section, each in its own
try block, so one failure does not hide the next. Prints one line per section and a
digest of each result, so a native run and an omps run can be compared line by line.

Usage: python3 torch_smoke.py [section ...]   (default: every section)
"""

import hashlib
import os
import sys
import time
import traceback

import torch


def digest(t):
    t = t.detach().float().cpu().contiguous()
    return hashlib.sha1(t.numpy().tobytes()).hexdigest()[:12] + f" sum={t.sum().item():.6g}"


def sec_basic():
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    return digest(x * 2 + 1)


def sec_matmul():
    g = torch.Generator().manual_seed(0)
    out = []
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        a = torch.randn(256, 256, generator=g).to("cuda", dt)
        out.append(digest(a @ a))
    torch.backends.cuda.matmul.allow_tf32 = True
    a = torch.randn(256, 256, generator=g).cuda()
    out.append(digest(a @ a))
    torch.backends.cuda.matmul.allow_tf32 = False
    return " ".join(out)


def sec_fp8():
    a = torch.randn(64, 64, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(64, 64, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0, device="cuda")
    return digest(torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))


def sec_conv():
    torch.backends.cudnn.deterministic = True
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 3).cuda()
    x = torch.randn(2, 3, 32, 32, device="cuda", requires_grad=True)
    y = conv(x)
    y.sum().backward()
    return digest(y) + " " + digest(x.grad)


def sec_resnet():
    import torchvision

    torch.manual_seed(0)
    m = torchvision.models.resnet18().cuda().eval().half()
    x = torch.randn(1, 3, 224, 224, device="cuda").half()
    with torch.no_grad():
        return digest(m(x))


def sec_sdpa():
    torch.manual_seed(0)
    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.float16)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH,
               SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel(be):
                out.append(digest(torch.nn.functional.scaled_dot_product_attention(q, q, q)))
        except Exception as e:  # noqa: BLE001
            out.append(f"{be.name}:ERR({type(e).__name__}: {str(e)[:80]})")
    return " ".join(out)


def sec_fft():
    x = torch.randn(1024, device="cuda")
    return digest(torch.fft.fft(x).abs())


def sec_rand():
    g = torch.Generator(device="cuda").manual_seed(1)
    return digest(torch.rand(1000, device="cuda", generator=g))


def sec_linalg():
    torch.manual_seed(0)
    a = torch.randn(64, 64, device="cuda", dtype=torch.float64)
    a = a @ a.T + 64 * torch.eye(64, device="cuda", dtype=torch.float64)
    return digest(torch.linalg.cholesky(a)) + " " + digest(torch.linalg.inv(a))


def sec_sparse():
    torch.manual_seed(0)
    d = torch.randn(64, 64, device="cuda")
    d[d.abs() < 1] = 0
    s = d.to_sparse_csr()
    return digest(s @ torch.randn(64, 8, device="cuda"))


def sec_jiterator():
    f = torch.cuda.jiterator._create_jit_fn("template <typename T> T f(T x, T y) { return x * y + 1; }")
    x = torch.arange(100, device="cuda", dtype=torch.float32)
    return digest(f(x, x))


def sec_compile():
    @torch.compile
    def f(x):
        return torch.sin(x) * 2 + x.cos()

    x = torch.arange(4096, device="cuda", dtype=torch.float32) / 100
    return digest(f(x))


def sec_train():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
    opt = torch.optim.AdamW(m.parameters())
    for _ in range(3):
        loss = m(torch.randn(16, 64, device="cuda")).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return digest(m[0].weight)


def sec_meminfo():
    free, total = torch.cuda.mem_get_info()
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    st = torch.cuda.memory_stats()
    del x
    return f"total={total} allocated_peak={st['allocated_bytes.all.peak']}"


def sec_graph():
    s = torch.cuda.Stream()
    x = torch.ones(16, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            y = x * 3
    g.replay()
    return digest(y)


SECTIONS = {k[4:]: v for k, v in list(globals().items()) if k.startswith("sec_")}


def main():
    names = sys.argv[1:] or list(SECTIONS)
    for name in names:
        t0 = time.time()
        try:
            r = SECTIONS[name]()
            torch.cuda.synchronize()
            print(f"[{name}] OK {r} ({time.time() - t0:.2f}s)", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"[{name}] FAIL {type(e).__name__}: {str(e)[:300]}", flush=True)
            if os.environ.get("SMOKE_TB"):
                traceback.print_exc()


if __name__ == "__main__":
    main()
