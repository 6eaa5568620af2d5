#!/usr/bin/env bash
# What managed memory costs: tests/cuda/rt/bench_managed natively, under NVIDIA MPS and
# under omps, one after another (BENCH lines, prefixed with the mode). Needs nvcc; omps
# binaries in target/release (OMPS_BIN).
# Usage: scripts/probe/managed_bench.sh [OUTDIR]
set -u
R=${OMPS_BIN:-$PWD/target/release}; OUT=${1:-/tmp/managed_bench}; mkdir -p "$OUT"
B=$OUT/bench_managed
nvcc -O2 -arch=sm_90 -Itests/cuda/rt -o "$B" tests/cuda/rt/bench_managed.cu || exit 1
MPSC=${MPS_CONTROL:-/usr/local/nvidia/bin/nvidia-cuda-mps-control}
run() { timeout 60 env "$@" "$B" 2>&1 | sed "s/^/$MODE /"; }
pipe=$(mktemp -d); chmod 700 "$pipe"
MODE=native run X=1
if [ -x "$MPSC" ]; then
    export CUDA_MPS_PIPE_DIRECTORY=$pipe/mps CUDA_MPS_LOG_DIRECTORY=$pipe/mpslog
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    "$MPSC" -d && sleep 1
    MODE=mps run CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY
    echo quit | "$MPSC"; sleep 1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
OMPS_PIPE_DIRECTORY=$pipe OMPS_LOG_DIRECTORY=$pipe "$R/omps-server" >"$OUT/server.out" 2>&1 &
sp=$!
for _ in $(seq 50); do OMPS_PIPE_DIRECTORY=$pipe timeout 5 "$R/omps-ctl" status >/dev/null 2>&1 && break; sleep 0.1; done
MODE=omps run OMPS_PIPE_DIRECTORY=$pipe LD_PRELOAD=$R/libomps_shim.so
OMPS_PIPE_DIRECTORY=$pipe timeout 10 "$R/omps-ctl" quit >/dev/null
timeout 15 tail --pid=$sp -f /dev/null
