#!/usr/bin/env python3
"""One inference client of scripts/bench/infer-bench.sh.

    python3 infer_worker.py --model resnet50|decoder|fake --requests R --warmup W \
        --start-file PATH --out JSON

Builds the model on CUDA with seeded random weights (nothing is downloaded), runs W
untimed warm-up requests, prints READY (flushed) and waits until the start file exists,
so that N workers start together. Then it runs R requests, each timed with
time.perf_counter() around the request and the torch.cuda.synchronize() that ends it,
and writes {model, requests, wall_s, per_request_ms, ...} to --out.

Models:
  resnet50  torchvision ResNet-50, fp16, eval, channels-last, batch 1, 224x224.
  decoder   a GPT-2-small-shaped decoder built from torch.nn (12 layers, d_model 768,
            12 heads, vocab 50257, 1024 positions, tied LM head), fp16, with a KV cache
            kept by hand. One request = prefill of a 16-token prompt, then greedy decoding
            until 32 tokens are generated (the tokens stay on the GPU: no host sync per
            token, one at the end of the request).
  fake      no torch at all: a request sleeps --fake-ms (to test the orchestration).
"""
import argparse
import json
import os
import sys
import time

PROMPT_LEN = 16
GEN_TOKENS = 32


def build_resnet50(torch, dev):
    import torchvision

    model = torchvision.models.resnet50(weights=None)
    model = model.to(device=dev, memory_format=torch.channels_last).half().eval()
    x = torch.randn(1, 3, 224, 224, device=dev).half().contiguous(memory_format=torch.channels_last)
    return lambda: model(x)


def build_decoder(torch, dev):
    import torch.nn as nn
    import torch.nn.functional as F

    layers, d, heads, vocab, ctx = 12, 768, 12, 50257, 1024
    hd = d // heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x, kc, vc, pos):
            t = x.shape[1]
            # (1, t, 3d) -> 3 x (1, heads, t, hd)
            q, k, v = self.qkv(self.ln1(x)).view(1, t, 3, heads, hd).permute(2, 0, 3, 1, 4)
            kc[:, :, pos:pos + t] = k
            vc[:, :, pos:pos + t] = v
            # prefill (pos == 0): causal over the prompt; decode (t == 1): all cached keys
            a = F.scaled_dot_product_attention(q, kc[:, :, :pos + t], vc[:, :, :pos + t], is_causal=t > 1)
            x = x + self.proj(a.transpose(1, 2).reshape(1, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(d)
            for m in self.modules():  # GPT-2's initialisation
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, 0.0, 0.02)
                if isinstance(m, nn.Linear):
                    nn.init.zeros_(m.bias)

        def forward(self, idx, pos, positions, caches):
            t = idx.shape[1]
            assert t == 1 or pos == 0
            x = self.wte(idx) + self.wpe(positions[pos:pos + t])
            for block, (kc, vc) in zip(self.blocks, caches):
                x = block(x, kc, vc, pos)
            return F.linear(self.ln_f(x[:, -1]), self.wte.weight)  # logits of the last position, tied head

    model = Decoder().to(dev).half().eval()
    positions = torch.arange(ctx, device=dev)
    prompt = torch.randint(0, vocab, (1, PROMPT_LEN), device=dev)
    total = PROMPT_LEN + GEN_TOKENS
    caches = [(torch.empty(1, heads, total, hd, device=dev, dtype=torch.half),
               torch.empty(1, heads, total, hd, device=dev, dtype=torch.half)) for _ in range(layers)]
    out = torch.empty(1, GEN_TOKENS, dtype=torch.long, device=dev)

    def request():
        logits = model(prompt, 0, positions, caches)
        for i in range(GEN_TOKENS):
            tok = logits.argmax(-1, keepdim=True)  # (1, 1), greedy
            out[:, i:i + 1] = tok
            if i + 1 < GEN_TOKENS:
                logits = model(tok, PROMPT_LEN + i, positions, caches)
        return logits

    return request


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, choices=["resnet50", "decoder", "fake"])
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--start-file", required=True)
    ap.add_argument("--start-timeout", type=float, default=600.0, help="seconds to wait for the start file")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", help="cuda (the benchmark); cpu only to test the code")
    ap.add_argument("--fake-ms", type=float, default=5.0, help="--model fake: milliseconds per request")
    args = ap.parse_args()

    info = {}
    if args.model == "fake":
        request = lambda: time.sleep(args.fake_ms / 1e3)  # noqa: E731
        sync = lambda: None  # noqa: E731
    else:
        import torch

        torch.manual_seed(args.seed)
        guard = torch.inference_mode()  # kept referenced: inference mode for the rest of main()
        guard.__enter__()
        request = (build_resnet50 if args.model == "resnet50" else build_decoder)(torch, args.device)
        if args.device == "cuda":
            sync = torch.cuda.synchronize
            info = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
        else:  # only to check the models' code on a machine without a GPU
            sync = lambda: None  # noqa: E731
            info = {"torch": torch.__version__, "device": args.device}

    y = None
    for _ in range(args.warmup):
        y = request()
    sync()
    if y is not None:
        info["finite"] = bool(y.isfinite().all().item())
        if not info["finite"]:
            print("warning: the warm-up output is not finite", file=sys.stderr)

    print("READY", flush=True)
    deadline = time.monotonic() + args.start_timeout
    while not os.path.exists(args.start_file):
        if time.monotonic() > deadline:
            sys.exit(f"start file {args.start_file} did not appear within {args.start_timeout} s")
        time.sleep(0.0005)

    lat = []
    t_start = time.time()
    w0 = time.perf_counter()
    for _ in range(args.requests):
        t0 = time.perf_counter()
        request()
        sync()
        lat.append((time.perf_counter() - t0) * 1e3)
    wall = time.perf_counter() - w0
    t_end = time.time()

    res = {"model": args.model, "requests": args.requests, "wall_s": wall, "per_request_ms": lat,
           "warmup": args.warmup, "t_start_unix": t_start, "t_end_unix": t_end, "pid": os.getpid(), **info}
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f)
    os.replace(tmp, args.out)
    print(f"DONE {args.requests} requests in {wall:.3f} s", flush=True)


if __name__ == "__main__":
    main()
