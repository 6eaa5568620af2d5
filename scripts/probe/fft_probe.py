"""Tiny cuFFT driver, to be run under darktrace (scripts/probe/darktrace.c) to see what
cuFFT does with the tools-table enumerator 6e163fbe[7] and the functions it reports:

  gcc -shared -fPIC -O2 -o /tmp/darktrace.so scripts/probe/darktrace.c -ldl -lpthread
  mkdir -p /tmp/dk && DARKTRACE_DIR=/tmp/dk DARKTRACE_DUMPFN=1 \
      LD_PRELOAD=/tmp/darktrace.so python3 scripts/probe/fft_probe.py
  -> /tmp/dk/dark.<pid>.log

Three plans (c2c 1D, r2c 1D, c2c 2D), so three enumerator calls are expected. Prints one
number per transform (seeded), so a traced run can be compared with a plain one.
"""

import torch

torch.manual_seed(0)
x = torch.randn(1024, device="cuda")
print("fft ", torch.fft.fft(x).abs().sum().item())
print("rfft", torch.fft.rfft(x).abs().sum().item())
y = torch.randn(64, 64, device="cuda")
print("fft2", torch.fft.fft2(y).abs().sum().item())
torch.cuda.synchronize()
