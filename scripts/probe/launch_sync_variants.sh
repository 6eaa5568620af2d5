#!/usr/bin/env bash
# Probe: launch + sync latency through omps under server settings that might matter
# (hardware queues, worker pinning, spin window), beside native and MPS in one run.
#   bash scripts/probe/launch_sync_variants.sh   (on the GPU machine, release binaries built)
set -u
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
B=/tmp/lsv; mkdir -p $B
nvcc -arch=sm_90 -o $B/bench "$ROOT/tests/cuda/rt/bench_overhead.cu" -I"$ROOT/tests/cuda/rt" || exit 1
fig() { "$@" --reps 4000 --launches 2000 2>/dev/null | awk '$2=="launch_sync"||$2=="sync_idle"{printf "%s=%s ", $2, $3}'; echo; }
for i in 1 2 3; do echo -n "native:            "; fig $B/bench; done
export CUDA_MPS_PIPE_DIRECTORY=$B/mps CUDA_MPS_LOG_DIRECTORY=$B/mpslog; mkdir -p $B/mps $B/mpslog
/usr/local/nvidia/bin/nvidia-cuda-mps-control -d && sleep 1
for i in 1 2 3; do echo -n "mps:               "; fig $B/bench; done
echo quit | /usr/local/nvidia/bin/nvidia-cuda-mps-control; sleep 2
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
variant() { # label, env...
    local label=$1; shift
    local dir; dir=$(mktemp -d /tmp/lsv-pipe.XXXX)
    env "$@" OMPS_PIPE_DIRECTORY=$dir "$ROOT/target/release/omps-server" >/dev/null 2>&1 &
    local pid=$!; sleep 1.5
    local pre=""; [ "$label" = "client on cpu 8  " ] && pre="taskset -c 8"
    for i in 1 2 3; do echo -n "omps $label: "; OMPS_PIPE_DIRECTORY=$dir LD_PRELOAD="$ROOT/target/release/libomps_shim.so" fig $pre $B/bench; done
    OMPS_PIPE_DIRECTORY=$dir "$ROOT/target/release/omps-ctl" quit >/dev/null 2>&1; wait $pid
}
variant "default (32 conn)" X=1
variant "8 connections    " CUDA_DEVICE_MAX_CONNECTIONS=8
variant "no pinning       " OMPS_NO_PIN=1
variant "client on cpu 8  " X=1
