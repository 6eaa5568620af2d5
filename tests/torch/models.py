"""Models built from torch.nn inside the suite: nothing is downloaded (the GPU machine has
no network), every weight comes from a seeded generator.

GPTDecoder is GPT-2-small shaped (12 layers, d=768, 12 heads, vocab 50257) with its own
key/value cache, so greedy generation runs the same kernels in every mode and no library
beyond torch is needed.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x, cache_k, cache_v, pos):
        """x: [B, T, d] for positions pos..pos+T-1; cache_k/v: [B, H, Tmax, Dh], written in place."""
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        cache_k[:, :, pos:pos + t] = k
        cache_v[:, :, pos:pos + t] = v
        keys = cache_k[:, :, :pos + t]
        vals = cache_v[:, :, :pos + t]
        # Plain attention math (no SDPA), so this workload tests matmuls + softmax on its own.
        att = (q @ keys.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        # Query i (absolute position pos+i) sees keys 0..pos+i.
        qpos = torch.arange(pos, pos + t, device=x.device).view(t, 1)
        kpos = torch.arange(pos + t, device=x.device).view(1, pos + t)
        att = att.masked_fill(kpos > qpos, float("-inf")).softmax(dim=-1)
        y = (att @ vals).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPTDecoder(nn.Module):
    def __init__(self, vocab=50257, d=768, layers=12, heads=12, max_pos=1024):
        super().__init__()
        self.d, self.heads = d, heads
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_pos, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for name, p in self.named_parameters():
            # GPT-2's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm.
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("ln_"):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=0.02)

    def new_cache(self, batch, tmax, device, dtype):
        shape = (batch, self.heads, tmax, self.d // self.heads)
        return [(torch.zeros(shape, device=device, dtype=dtype),
                 torch.zeros(shape, device=device, dtype=dtype)) for _ in self.blocks]

    def forward(self, ids, cache, pos):
        t = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(pos, pos + t, device=ids.device))
        for blk, (ck, cv) in zip(self.blocks, cache):
            x = blk(x, ck, cv, pos)
        return self.ln_f(x) @ self.wte.weight.t()  # tied output head, as GPT-2

    @torch.no_grad()
    def generate(self, prompt, steps):
        """Greedy decoding with the cache. No .item() per step: the next token stays on the
        GPU, so the loop queues work without waiting on it."""
        dtype = self.wte.weight.dtype
        cache = self.new_cache(prompt.shape[0], prompt.shape[1] + steps, prompt.device, dtype)
        logits = self(prompt, cache, 0)[:, -1]
        ids = [prompt]
        pos = prompt.shape[1]
        for _ in range(steps):
            nxt = logits.argmax(dim=-1, keepdim=True)
            ids.append(nxt)
            logits = self(nxt, cache, pos)[:, -1]
            pos += 1
        return torch.cat(ids, dim=1), logits


class SmallConvNet(nn.Module):
    """Conv + linear net for the training and allocator workloads. Only ops with
    deterministic CUDA backward passes (no adaptive pooling, no index_add)."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2), nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 15 * 15, 64), nn.ReLU(),
                                  nn.Linear(64, classes))

    def forward(self, x):  # x: [B, 3, 32, 32]
        return self.head(self.features(x))
