#!/usr/bin/env bash
# Builds scripts/probe/launch_batching.cu and runs every variant on GPU 0 (issue 25, item 1):
# first with CUDA_DEVICE_MAX_CONNECTIONS=32, as omps-server sets it, then plain launches and green
# contexts again with the driver's default (8 queues), as launch_scaling.cu measured them.
# Prints markdown tables. About 1.5 min; each run is bounded by `timeout` (at most ~4.5 min in all).
# Usage: scripts/probe/launch_batching.sh [OUTDIR] (default /tmp/launch_batching); SECS=1 per cell.
set -u
OUT=${1:-/tmp/launch_batching}; mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 1
B=$OUT/launch_batching
SECS=${SECS:-1}
cd "$(dirname "$0")/../.." || exit 1
timeout 60 nvcc -O2 -arch=sm_90 -o "$B" scripts/probe/launch_batching.cu -lcuda -lpthread || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>/dev/null | head -1
echo
echo "## CUDA_DEVICE_MAX_CONNECTIONS=32 (the server's setting): every variant"
echo
CUDA_DEVICE_MAX_CONNECTIONS=32 timeout -k 5 150 "$B" "$SECS" abcdefh || echo "(exit $?: 124 means the 150 s bound)"
echo
echo "## driver default connections (8), as launch_scaling.cu ran: a and b"
echo
env -u CUDA_DEVICE_MAX_CONNECTIONS timeout -k 5 45 "$B" "$SECS" ab || echo "(exit $?: 124 means the 45 s bound)"
