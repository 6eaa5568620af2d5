#!/usr/bin/env bash
# Start-up (issue 8): N processes (default 8) started at once; for each repetition, the
# time from the start to the slowest one's first cudaMalloc returning, through omps.
# Usage: scripts/probe/startup.sh [N] [REPS]   (OMPS_BIN: the omps binaries)
set -u
N=${1:-8}; REPS=${2:-5}
R=${OMPS_BIN:-$PWD/target/release}; OUT=$(mktemp -d)
nvcc -O2 -arch=sm_90 -o "$OUT/startup" scripts/probe/startup.cu || exit 1
pipe=$(mktemp -d); chmod 700 "$pipe"
OMPS_PIPE_DIRECTORY=$pipe OMPS_LOG_DIRECTORY=$pipe "$R/omps-server" >"$OUT/server.out" 2>&1 &
sp=$!
for _ in $(seq 50); do OMPS_PIPE_DIRECTORY=$pipe timeout 5 "$R/omps-ctl" status >/dev/null 2>&1 && break; sleep 0.1; done
sleep 1 # let the server make its spare segments, as it would have long before
for r in $(seq "$REPS"); do
    t0=$(date +%s%N)
    for i in $(seq "$N"); do
        OMPS_PIPE_DIRECTORY=$pipe LD_PRELOAD=$R/libomps_shim.so timeout 30 "$OUT/startup" >"$OUT/t$i" 2>/dev/null &
    done
    wait $(jobs -p | grep -v "^$sp$") 2>/dev/null
    ms=$(for i in $(seq "$N"); do echo $(( ($(cat "$OUT/t$i" 2>/dev/null || echo 0) - t0) / 1000 )); done | sort -n | awk '{a[NR]=$1} END {printf "fastest %.1f ms, slowest %.1f ms", a[1]/1000, a[NR]/1000}')
    echo "rep $r: $N processes: $ms"
    sleep 1
done
OMPS_PIPE_DIRECTORY=$pipe timeout 10 "$R/omps-ctl" quit >/dev/null
timeout 15 tail --pid=$sp -f /dev/null
