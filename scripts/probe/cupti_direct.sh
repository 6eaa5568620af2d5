#!/usr/bin/env bash
# CUPTI's activity API used directly, natively and through omps (issue 26): builds
# scripts/probe/cupti_direct.cu against the machine's CUPTI, runs it natively twice (the
# run-to-run spread) and once through omps, and compares what does not depend on the run
# (kernel names, grids, external ids, links to API records, copies, memsets, waits).
# Writes $OUT/cupti-direct.txt; exit status 0 when the records match.
#
#   OMPS_BIN=target/release OUT=/tmp/x bash scripts/probe/cupti_direct.sh
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${OMPS_BIN:-target/release}")
OUT=${OUT:-/tmp/omps-cupti-direct}; mkdir -p "$OUT"
W=$(mktemp -d /tmp/omps-cupti-direct.XXXXXX)
report=$OUT/cupti-direct.txt; : > "$report"
. scripts/probe/cupti_paths.sh
inc=$CUPTI_INC; lib=$CUPTI_LIB
echo "CUPTI headers: ${inc:-none}, library: ${lib:-none}" | tee -a "$report"
[ -n "$inc" ] && [ -n "$lib" ] || exit 1
# The wheel ships only libcupti.so.13, which nvcc will not take as an input: linked
# through a libcupti.so of our own that points at it.
so=$(ls "$lib"/libcupti.so* | head -1)
ln -sf "$so" "$W/libcupti.so"
timeout 120 nvcc -arch=sm_90 -O2 -I"$inc" -o "$W/direct" scripts/probe/cupti_direct.cu -L"$W" -lcupti \
    -Xlinker -rpath -Xlinker "$lib" >> "$report" 2>&1 || { echo "build failed" | tee -a "$report"; exit 1; }
run() { LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 60 "$@"; }
run "$W/direct" > "$W/native1.txt" 2>&1
run "$W/direct" > "$W/native2.txt" 2>&1
export CUDA_MPS_PIPE_DIRECTORY=$W/pipe CUDA_MPS_LOG_DIRECTORY=$W/log; mkdir -p "$W/log"
timeout 30 "$BIN/omps-ctl" -d
LD_PRELOAD=$BIN/libomps_shim.so run "$W/direct" > "$W/omps.txt" 2>&1
timeout 20 "$BIN/omps-ctl" quit > /dev/null 2>&1
for f in native1 native2 omps; do grep -v '^duration ' "$W/$f.txt" | grep -v '^omps: CUPTI RUNTIME' > "$W/$f.records"; done
{
    echo "--- native records"; cat "$W/native1.records"
    echo "--- omps records"; cat "$W/omps.records"
    echo "--- omps stderr lines beginning omps:"; grep '^omps:' "$W/omps.txt"
    echo "--- durations (us): native run 1 | native run 2 | omps"
    paste <(grep '^duration' "$W/native1.txt") <(grep '^duration' "$W/native2.txt" | awk '{print $3}') \
          <(grep '^duration' "$W/omps.txt" | awk '{print $3}')
} >> "$report"
if diff "$W/native1.records" "$W/omps.records" >> "$report"; then
    echo "records: the same as natively" | tee -a "$report"
else
    echo "records: DIFFER from native (diff above: < native, > omps)" | tee -a "$report"
    exit 1
fi
