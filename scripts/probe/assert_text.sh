#!/usr/bin/env bash
# Where does the text of a device-side assert go, natively and through omps? Builds
# tests/cuda/rt/device_assert.cu and runs a PyTorch index-out-of-bounds assert, each
# natively and through omps (one fresh server per run: an assert ends the context), and
# prints each run's stdout, stderr and the server log's printf lines.
# Usage (GPU machine, omps binaries in target/release): scripts/probe/assert_text.sh [OUTDIR]
set -u
R=$PWD/target/release; OUT=${1:-/tmp/assert-text}; mkdir -p "$OUT"
nvcc -O2 -arch=sm_90 -Itests/cuda/rt -o "$OUT/device_assert" tests/cuda/rt/device_assert.cu || exit 1
cat >"$OUT/torch_assert.py" <<'PY'
import sys, torch
x = torch.zeros(10, device="cuda")
torch.cuda.synchronize()
print("before the assert", flush=True)
try:
    y = x[torch.tensor([20], device="cuda")]
    torch.cuda.synchronize()
    print("no error?!", flush=True)
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0], flush=True)
PY
run() { # tag cmd...
    local tag=$1; shift
    timeout 60 "$@" >"$OUT/$tag.native.out" 2>"$OUT/$tag.native.err"; echo "$tag native rc=$?"
    local pipe; pipe=$(mktemp -d /tmp/assert-pipe.XXXX); chmod 700 "$pipe"
    OMPS_PIPE_DIRECTORY=$pipe OMPS_LOG_DIRECTORY=$pipe "$R/omps-server" >"$pipe/server.out" 2>&1 &
    local spid=$!
    for _ in $(seq 50); do OMPS_PIPE_DIRECTORY=$pipe timeout 5 "$R/omps-ctl" status >/dev/null 2>&1 && break; sleep 0.1; done
    OMPS_PIPE_DIRECTORY=$pipe LD_PRELOAD=$R/libomps_shim.so OMPS_TRACE=${TRACE:-0} timeout 60 "$@" \
        >"$OUT/$tag.omps.out" 2>"$OUT/$tag.omps.err"; echo "$tag omps rc=$?"
    OMPS_PIPE_DIRECTORY=$pipe timeout 10 "$R/omps-ctl" status >"$OUT/$tag.status" 2>&1
    OMPS_PIPE_DIRECTORY=$pipe timeout 10 "$R/omps-ctl" quit >/dev/null 2>&1
    timeout 15 tail --pid=$spid -f /dev/null || kill -9 $spid
    cp "$pipe/server.log" "$OUT/$tag.server.log" 2>/dev/null; cp "$pipe/server.out" "$OUT/$tag.server.out"
    for f in native.out native.err omps.out omps.err; do
        echo "--- $tag.$f"; head -c 3000 "$OUT/$tag.$f"
    done
    echo "--- $tag: server log lines about printf / assert"
    grep -iE 'printf|assert' "$OUT/$tag.server.log" "$OUT/$tag.server.out" 2>/dev/null | head -20
    grep -i printf "$OUT/$tag.status"
}
run c "$OUT/device_assert"
run torch python3 "$OUT/torch_assert.py"
