#!/usr/bin/env bash
# torch.profiler's CUPTI calls and records, natively and (OMPS=1) through omps: builds
# scripts/probe/cupti_trace.c, profiles a few matmuls and a small conv net with CUDA
# activities, and writes the call log, the record counts and torch's own kernel table to
# $OUT/cupti-trace-{native,omps}.txt (issue 26, docs/design.md section 12b). ~30 s each way.
#
#   OMPS_BIN=target/release OUT=/tmp/x bash scripts/probe/cupti_trace.sh [omps]
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${OMPS_BIN:-target/release}")
OUT=${OUT:-/tmp/omps-cupti}; mkdir -p "$OUT"
W=$(mktemp -d /tmp/omps-cupti.XXXXXX)
gcc -shared -fPIC -O2 -o "$W/cupti_trace.so" scripts/probe/cupti_trace.c -ldl || exit 1
cat > "$W/prof.py" <<'PY'
import torch
from torch.profiler import profile, ProfilerActivity
m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                        torch.nn.Linear(16 * 30 * 30, 10)).cuda()
x = torch.randn(8, 3, 32, 32, device="cuda")
a = torch.randn(256, 256, device="cuda")
m(x); torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    for _ in range(3):
        y = m(x); b = a @ a
    torch.cuda.synchronize()
rows = [e for e in p.key_averages() if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0) > 0]
print("kernels seen by torch.profiler:", len(rows))
for e in sorted(p.key_averages(), key=lambda e: e.key):
    if getattr(e, "device_time_total", 0) > 0 or getattr(e, "cuda_time_total", 0) > 0:
        print(f"  {e.key[:70]:70s} count {e.count}")
print("cupti mapped:", sorted({l.split()[-1] for l in open("/proc/self/maps") if "cupti" in l}))
PY
for way in native ${1:-}; do
    log=$OUT/cupti-trace-$way.txt; : > "$log"
    pre=$W/cupti_trace.so
    if [ "$way" = omps ]; then
        export CUDA_MPS_PIPE_DIRECTORY=$W/pipe CUDA_MPS_LOG_DIRECTORY=$W/log; mkdir -p "$W/log"
        timeout 30 "$BIN/omps-ctl" -d
        pre="$BIN/libomps_shim.so $pre"
    fi
    CUPTI_TRACE_LOG=$log LD_PRELOAD="$pre" timeout 120 python3 "$W/prof.py" >> "$log" 2>&1
    echo "exit $?" >> "$log"
    [ "$way" = omps ] && timeout 30 "$BIN/omps-ctl" quit > /dev/null 2>&1
    echo "=== $way"; cat "$log"
done
rm -rf "$W"
