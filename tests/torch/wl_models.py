"""Workloads: whole models, attention, cuBLAS, cuDNN, a training step."""

import copy

import torch
from torch.nn import functional as F

from models import GPTDecoder, SmallConvNet
from registry import DEV, SkipWorkload, cpu, gen, randn, workload


# ------------------------------------------------------------------ vision models

def _vision(model_fn, batch, channels_last_key):
    """fp32, fp16, bf16 and fp16 channels-last inference of one randomly initialised model."""
    torch.manual_seed(0)
    base = model_fn().eval()
    for m in base.modules():
        # torchvision zero-initialises ViT's classifier: all-zero logits would compare nothing.
        if isinstance(m, torch.nn.Linear) and not m.weight.any():
            torch.nn.init.normal_(m.weight, std=0.02)
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
