#!/usr/bin/env bash
# torch.profiler with CUDA activities, natively and through omps (issue 26): a small
# conv net plus matmuls (mode "mix"), run natively twice (the run-to-run spread) and once
# through omps; then two different programs profiled at once through omps (mode "gemm":
# matmuls only; mode "eltwise": elementwise only), each of which must list exactly the
# kernels it lists natively and none of the other's. Compares kernel names and counts;
# prints each kernel's mean device time beside the native runs'.
# Writes $OUT/cupti-torch.txt; exit status 0 when every comparison holds.
#
#   OMPS_BIN=target/release OUT=/tmp/x bash scripts/probe/cupti_torch.sh
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${OMPS_BIN:-target/release}")
OUT=${OUT:-/tmp/omps-cupti-torch}; mkdir -p "$OUT"
W=$(mktemp -d /tmp/omps-cupti-torch.XXXXXX)
report=$OUT/cupti-torch.txt; : > "$report"
cat > "$W/prof.py" <<'PY'
import sys, torch
from torch.profiler import profile, ProfilerActivity
mode = sys.argv[1]
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                        torch.nn.Linear(16 * 30 * 30, 10)).cuda()
x = torch.randn(8, 3, 32, 32, device="cuda")
a = torch.randn(512, 512, device="cuda")
v = torch.randn(1 << 20, device="cuda")
def step():
    if mode == "mix":
        y = m(x); b = a @ a
    elif mode == "gemm":
        for _ in range(4): b = a @ a
    else:
        for _ in range(4): v.mul_(1.0001).add_(1.0)
for _ in range(3): step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    for _ in range(5): step()
    torch.cuda.synchronize()
for e in sorted(p.key_averages(), key=lambda e: e.key):
    if str(e.device_type).endswith("CUDA"):
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        print(f"kernel {e.key} | count {e.count} | avg_us {t / max(e.count, 1):.2f}")
print("done")
PY
prof() { timeout 180 python3 "$W/prof.py" "$1" > "$2" 2>&1; }
prof mix "$W/native1.mix"; prof mix "$W/native2.mix"
prof gemm "$W/native.gemm"; prof eltwise "$W/native.eltwise"
export CUDA_MPS_PIPE_DIRECTORY=$W/pipe CUDA_MPS_LOG_DIRECTORY=$W/log; mkdir -p "$W/log"
timeout 30 "$BIN/omps-ctl" -d
LD_PRELOAD=$BIN/libomps_shim.so prof mix "$W/omps.mix"
LD_PRELOAD=$BIN/libomps_shim.so prof gemm "$W/omps.gemm" & a=$!
LD_PRELOAD=$BIN/libomps_shim.so prof eltwise "$W/omps.eltwise" & b=$!
wait $a $b
timeout 20 "$BIN/omps-ctl" quit > /dev/null 2>&1
names() { grep '^kernel ' "$1" | sed 's/ | avg_us.*//'; }
rc=0
compare() {
    local what=$1 nat=$2 omp=$3
    if [ "$(names "$nat" | grep -c .)" -gt 0 ] && diff <(names "$nat") <(names "$omp") > "$W/diff" 2>&1; then
        echo "$what: the same kernels and counts as natively ($(names "$nat" | grep -c .) kernels)" | tee -a "$report"
    else
        echo "$what: DIFFERENT from native (< native, > omps):" | tee -a "$report"; cat "$W/diff" >> "$report"
        echo "--- omps output:" >> "$report"; tail -20 "$omp" >> "$report"; rc=1
    fi
}
compare "mix, one client" "$W/native1.mix" "$W/omps.mix"
compare "gemm, beside eltwise" "$W/native.gemm" "$W/omps.gemm"
compare "eltwise, beside gemm" "$W/native.eltwise" "$W/omps.eltwise"
{
    echo "--- mean device time per kernel (us): native run 1 | native run 2 | omps"
    paste -d'|' <(grep '^kernel ' "$W/native1.mix" | sed 's/.*avg_us //') \
                <(grep '^kernel ' "$W/native2.mix" | sed 's/.*avg_us //') \
                <(grep '^kernel ' "$W/omps.mix" | sed 's/.*avg_us //') \
                <(grep '^kernel ' "$W/native1.mix" | sed 's/ | count.*//; s/^kernel //' | cut -c1-70)
    echo "--- omps lines of the omps runs:"; grep -h '^omps' "$W"/omps.* | sort | uniq -c
} >> "$report"
cat "$report"
exit $rc
