#!/usr/bin/env python3
"""PyTorch client roles of the torch_qos measure (scripts/sched/measures/torch_qos.py).

    python3 torch_roles.py lc SECONDS --start-at NS   # ResNet-50 fp16 batch 1 inferences
    python3 torch_roles.py be SECONDS --start-at NS   # bf16 8192^3 matmuls, queue kept full

Each warms up, waits until time.time_ns() >= NS, runs its timed part for SECONDS and
prints one final line: `LC <count> <p50_us> <p99_us> <max_us>` or
`BE <matmuls done> <TFLOP/s>`.
"""
import argparse
import sys
import time

import torch

N = 8192


def wait_until(start_at):
    late = time.time_ns() - start_at
    if late > 0:
        print(f"warm-up ended {late / 1e9:.1f} s after the start time", file=sys.stderr, flush=True)
    while time.time_ns() < start_at:
        time.sleep(min(0.005, max(0.0, (start_at - time.time_ns()) / 1e9)))


def pct(sorted_us, q):
    return sorted_us[min(len(sorted_us) - 1, int(q * len(sorted_us)))]


def lc(seconds, start_at):
    from torchvision.models import resnet50
    torch.backends.cudnn.benchmark = False
    model = resnet50(weights=None).half().eval().cuda()
    x = torch.randn(1, 3, 224, 224, device="cuda", dtype=torch.half)
    with torch.inference_mode():
        for _ in range(20):
            model(x)
        torch.cuda.synchronize()
        wait_until(start_at)
        lat, end = [], time.perf_counter() + seconds
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                break
            model(x)
            torch.cuda.synchronize()
            lat.append((time.perf_counter() - t0) * 1e6)
    lat.sort()
    print(f"LC {len(lat)} {pct(lat, 0.50):.1f} {pct(lat, 0.99):.1f} {lat[-1]:.1f}", flush=True)


def be(seconds, start_at):
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(N, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(8):
        torch.matmul(a, b, out=out)
    torch.cuda.synchronize()
    wait_until(start_at)
    done, t0 = 0, time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        for _ in range(4):
            torch.matmul(a, b, out=out)
        torch.cuda.synchronize()
        done += 4
    elapsed = time.perf_counter() - t0
    print(f"BE {done} {done * 2 * N ** 3 / elapsed / 1e12:.1f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=("lc", "be"))
    ap.add_argument("seconds", type=float)
    ap.add_argument("--start-at", type=int, required=True)
    args = ap.parse_args()
    (lc if args.role == "lc" else be)(args.seconds, args.start_at)


if __name__ == "__main__":
    main()
