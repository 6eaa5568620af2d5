#!/usr/bin/env bash
# Runs scripts/probe/bystander.cu's roles: the probe alone, then the probe beside a 2 s hog
# and a churning client (started 0.5 s in), natively, under NVIDIA MPS and under omps.
# Prints one line per case: PROBE n p50_us p99_us max_us. Needs nvcc; omps binaries in
# target/release (OMPS_BIN), OMPS_ONLY=1 skips native and MPS.
# Usage: scripts/probe/bystander.sh [OUTDIR]
set -u
R=${OMPS_BIN:-$PWD/target/release}; OUT=${1:-/tmp/bystander}; mkdir -p "$OUT"
B=$OUT/bystander
nvcc -O2 -arch=sm_90 -o "$B" scripts/probe/bystander.cu || exit 1
MPSC=${MPS_CONTROL:-/usr/local/nvidia/bin/nvidia-cuda-mps-control}
case_run() { # mode label churn-args...
    local mode=$1 label=$2; shift 2
    timeout 30 env $ENVS "$B" probe 2 >"$OUT/$mode.$label.probe" 2>&1 &
    local pp=$!
    if [ "$label" != alone ]; then
        sleep 0.3
        timeout 30 env $ENVS "$B" hog 2 >/dev/null 2>&1 &
        local hp=$!
        sleep 0.5
        timeout 30 env $ENVS "$B" churn "$@" >/dev/null 2>&1
        wait $hp
    fi
    wait $pp
    echo "$mode $label: $(cat "$OUT/$mode.$label.probe")"
}
cases() { # mode
    case_run "$1" alone
    case_run "$1" churn
    case_run "$1" churn+limit limit
}
pipe=$(mktemp -d); chmod 700 "$pipe"
if [ -z "${OMPS_ONLY:-}" ]; then ENVS=""; cases native; fi
if [ -z "${OMPS_ONLY:-}" ] && [ -x "$MPSC" ]; then
    export CUDA_MPS_PIPE_DIRECTORY=$pipe/mps CUDA_MPS_LOG_DIRECTORY=$pipe/mpslog
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    "$MPSC" -d && sleep 1
    ENVS="CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY"; cases mps
    echo quit | "$MPSC"; sleep 1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
OMPS_PIPE_DIRECTORY=$pipe OMPS_LOG_DIRECTORY=$pipe "$R/omps-server" >"$OUT/server.out" 2>&1 &
sp=$!
for _ in $(seq 50); do OMPS_PIPE_DIRECTORY=$pipe timeout 5 "$R/omps-ctl" status >/dev/null 2>&1 && break; sleep 0.1; done
ENVS="OMPS_PIPE_DIRECTORY=$pipe LD_PRELOAD=$R/libomps_shim.so"; cases omps
OMPS_PIPE_DIRECTORY=$pipe timeout 10 "$R/omps-ctl" stats | grep lane
OMPS_PIPE_DIRECTORY=$pipe timeout 10 "$R/omps-ctl" quit >/dev/null
timeout 15 tail --pid=$sp -f /dev/null
