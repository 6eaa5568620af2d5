#!/usr/bin/env bash
# torch.profiler with CUDA activities, natively and through omps (issue 26): the
# benchmark models (scripts/bench/bench_models.py), natively (ResNet-50 twice, for the
# run-to-run spread), then through omps ResNet-50 and the eager decoder profiled at once
# (each must list exactly its native kernels, none of the other's), then the CUDA-graph
# decoder alone. Compares kernel names and counts; prints ResNet-50's mean device time
# per kernel beside the native runs'.
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
sys.path.insert(0, "scripts/bench")
import bench_models
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
request = bench_models.build(sys.argv[1], torch.device("cuda"))
for _ in range(3):
    request()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    for _ in range(3):
        request()
        torch.cuda.synchronize()
for e in sorted(p.key_averages(), key=lambda e: e.key):
    if str(e.device_type).endswith("CUDA"):
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        print(f"kernel {e.key} | count {e.count} | avg_us {t / max(e.count, 1):.2f}")
print("done")
PY
prof() { timeout 240 python3 "$W/prof.py" "$1" > "$2" 2>&1; }
for m in resnet50 decoder graph_decoder; do prof $m "$W/native.$m"; done
prof resnet50 "$W/native2.resnet50"
export CUDA_MPS_PIPE_DIRECTORY=$W/pipe CUDA_MPS_LOG_DIRECTORY=$W/log; mkdir -p "$W/log"
timeout 30 "$BIN/omps-ctl" -d
# Two clients profiling at once, then the graph decoder alone.
LD_PRELOAD=$BIN/libomps_shim.so prof resnet50 "$W/omps.resnet50" & a=$!
LD_PRELOAD=$BIN/libomps_shim.so prof decoder "$W/omps.decoder" & b=$!
wait $a $b
LD_PRELOAD=$BIN/libomps_shim.so prof graph_decoder "$W/omps.graph_decoder"
timeout 20 "$BIN/omps-ctl" quit > /dev/null 2>&1
names() { grep '^kernel ' "$1" | sed 's/ | avg_us.*//'; }
# A CUDA graph's device-to-device memcpy nodes: natively the driver runs most of them as
# a kernel of its own (`memcpy32_post`, a KERNEL record) and the rest as copies; omps
# records each as the copy the program asked for (its server does not say which way the
# driver ran it). The graph comparison counts them together, as one line.
graph_names() {
    names "$1" | awk -F' [|] count ' '
        $1 ~ /^kernel (memcpy32_post|Memcpy DtoD \(Device -> Device\))$/ { copies += $2; next }
        { print }
        END { if (copies) print "kernel (a graph memcpy node, DtoD) | count " copies }' | sort
}
rc=0
compare() {
    local what=$1 nat=$2 omp=$3 list=${4:-names}
    if [ "$($list "$nat" | grep -c .)" -gt 0 ] && diff <($list "$nat") <($list "$omp") > "$W/diff" 2>&1; then
        echo "$what: the same kernels and counts as natively ($($list "$nat" | grep -c .) kernels)" | tee -a "$report"
    else
        echo "$what: DIFFERENT from native (< native, > omps):" | tee -a "$report"; cat "$W/diff" >> "$report"
        echo "--- omps output:" >> "$report"; tail -20 "$omp" >> "$report"; rc=1
    fi
}
compare "ResNet-50, beside the decoder" "$W/native.resnet50" "$W/omps.resnet50"
compare "decoder, beside ResNet-50" "$W/native.decoder" "$W/omps.decoder"
compare "graph decoder (CUDA graph replays; graph memcpy nodes counted together)" \
    "$W/native.graph_decoder" "$W/omps.graph_decoder" graph_names
{
    echo "--- ResNet-50, mean device time per kernel (us): native run 1 | native run 2 | omps | kernel"
    paste -d'|' <(grep '^kernel ' "$W/native.resnet50" | sed 's/.*avg_us //') \
                <(grep '^kernel ' "$W/native2.resnet50" | sed 's/.*avg_us //') \
                <(grep '^kernel ' "$W/omps.resnet50" | sed 's/.*avg_us //') \
                <(grep '^kernel ' "$W/native.resnet50" | sed 's/ | count.*//; s/^kernel //' | cut -c1-70)
    # Each kernel's omps mean against the two native runs: within their spread, or
    # within 5% of their mean where the spread is narrower.
    paste -d' ' <(grep '^kernel ' "$W/native.resnet50" | sed 's/.*avg_us //') \
                <(grep '^kernel ' "$W/native2.resnet50" | sed 's/.*avg_us //') \
                <(grep '^kernel ' "$W/omps.resnet50" | sed 's/.*avg_us //') |
        awk '{ lo = ($1 < $2 ? $1 : $2); hi = ($1 > $2 ? $1 : $2); m = ($1 + $2) / 2;
               if (m > 0) { r = $3 / m; s += r; n++; if (r > max) max = r; if (min == 0 || r < min) min = r }
               if ($3 >= lo * 0.95 && $3 <= hi * 1.05) ok++ }
             END { if (n) printf "--- ResNet-50 durations: %d of %d kernels within the native spread (5%% slack); omps / native mean %.2f (%.2f-%.2f)\n", ok, n, s / n, min, max }'
    echo "--- omps lines of the omps runs:"; grep -h '^omps' "$W"/omps.* | sort | uniq -c
    echo "--- the server's lines on CUPTI:"
    grep -h "CUPTI\|timed by events" "$W"/log/*.log 2>/dev/null | sed 's/^.*\] //' | sort | uniq -c | head -5
    echo "--- the server's lines on profiling twins:"
    grep -h "profiling twin" "$W"/log/*.log 2>/dev/null | sed 's/^.*no profiling/no profiling/' | sort | uniq -c | head -20
} >> "$report"
cat "$report"
exit $rc
