#!/usr/bin/env python3
"""A PyTorch client driven line by line on stdin, for the memory-limit tests:
`info` prints "info FREE TOTAL" (torch.cuda.mem_get_info), `alloc GIB` allocates and
touches that many GiB and prints "ok" or "oom" (torch.OutOfMemoryError), `free` drops
every tensor and empties the cache (held only in `held`: a name bound to the last one would
keep it alive past `free`), `matmul` prints a checksum of a fixed product."""

import sys

import torch

held = []
torch.cuda.init()
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd:
        continue
    if cmd[0] == "info":
        free, total = torch.cuda.mem_get_info()
        print(f"info {free} {total}", flush=True)
    elif cmd[0] == "alloc":
        n = int(float(cmd[1]) * (1 << 30))
        try:
            held.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
            held[-1].fill_(1)
            torch.cuda.synchronize()
            print("ok", flush=True)
        except torch.OutOfMemoryError:
            print("oom", flush=True)
    elif cmd[0] == "free":
        held.clear()
        torch.cuda.empty_cache()
        print("ok", flush=True)
    elif cmd[0] == "matmul":
        g = torch.Generator(device="cuda").manual_seed(7)
        a = torch.randn(1024, 1024, device="cuda", generator=g)
        print(f"sum {(a @ a).double().abs().sum().item():.6e}", flush=True)
    elif cmd[0] == "quit":
        break
