#!/usr/bin/env bash
# Direct peer access on two GPUs (run on the two-GPU machine):
#  1. rt/peer_access prints under omps what it prints natively (capabilities, enable and
#     disable errors, kernels on one GPU reaching the other's memory, peer copies, memory
#     freed on one GPU while the other's kernels read it), 3 clients at once;
#  2. the copy bandwidth between the GPUs, native / NVIDIA MPS / omps, in one run;
#  3. what an allocation costs under omps before any client enabled peer access and after
#     (the server enables it when a client first asks: every allocation is then mapped on
#     the peer too), beside native.
#   OMPS_BIN=target/release bash scripts/multi-gpu/peer.sh
set -u
. "$(dirname "$0")/../common.sh"
B=$(cd "${OMPS_BIN:-target/release}" && pwd)
R=$(cd "$(dirname "$0")/../.." && pwd)
W=${1:-/tmp/omps-peer}
MPS_BIN=${MPS_BIN:-/usr/local/nvidia/bin}
rm -rf "$W"; mkdir -p "$W/bin" "$W/pipe" "$W/mps"; chmod 700 "$W/pipe" "$W/mps"
timeout 300 nvcc -O2 -arch=sm_90 -I"$R/tests/cuda/rt" -o "$W/bin/peer_access" "$R/tests/cuda/rt/peer_access.cu" || exit 1
timeout 300 nvcc -O2 -arch=sm_90 -o "$W/bin/peer_bw" "$R/scripts/multi-gpu/peer_bw.cu" || exit 1
timeout 300 nvcc -O2 -arch=sm_90 -I"$R/tests/cuda/rt" -o "$W/bin/bench" "$R/tests/cuda/rt/bench_overhead.cu" || exit 1
malloc_us() { awk '$1=="BENCH" && $2=="malloc_free_1mib" {print $3}' "$1"; }
timeout 20 nvidia-smi topo -m 2>/dev/null | head -4
fail=0
check() { # name file-native file-omps
    if cmp -s "$2" "$3"; then echo ">>> $1: PASS"; else echo ">>> $1: FAIL"; diff "$2" "$3" | head -20; fail=1; fi
}
timeout 60 "$W/bin/peer_access" > "$W/peer_access.native" 2>&1
cat "$W/peer_access.native"
timeout 60 "$W/bin/peer_bw" > "$W/bw.native" 2>&1
timeout 120 "$W/bin/bench" > "$W/bench.native" 2>&1

# NVIDIA MPS, both GPUs.
export CUDA_MPS_PIPE_DIRECTORY="$W/mps" CUDA_MPS_LOG_DIRECTORY="$W/mps"
timeout 10 "$MPS_BIN/nvidia-cuda-mps-control" -d
timeout 60 "$W/bin/peer_bw" > "$W/bw.mps" 2>&1
timeout 60 "$W/bin/peer_access" > "$W/peer_access.mps" 2>&1
echo quit | timeout 10 "$MPS_BIN/nvidia-cuda-mps-control"
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
sleep 1

OMPS_PIPE_DIRECTORY="$W/pipe" "$B/omps-server" > "$W/server.log" 2>&1 &
SP=$!
for _ in $(seq 100); do [ -S "$W/pipe/omps.sock" ] && break; sleep 0.1; done
omps() { OMPS_PIPE_DIRECTORY="$W/pipe" LD_PRELOAD="$B/libomps_shim.so" timeout 120 "$@"; }
omps "$W/bin/bench" > "$W/bench.omps-before" 2>&1
pids=()
for i in 1 2 3; do omps "$W/bin/peer_access" > "$W/peer_access.omps$i" 2>&1 & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done
omps "$W/bin/peer_bw" > "$W/bw.omps" 2>&1
omps "$W/bin/bench" > "$W/bench.omps-after" 2>&1
OMPS_PIPE_DIRECTORY="$W/pipe" timeout 10 "$B/omps-ctl" quit > /dev/null; wait_server "$SP"

check "peer_access under MPS (for reference)" "$W/peer_access.native" "$W/peer_access.mps"
for i in 1 2 3; do check "peer_access client $i" "$W/peer_access.native" "$W/peer_access.omps$i"; done
echo "copy bandwidth between GPUs, GB/s (native / MPS / omps; omps/MPS):"
for k in memcpy_peer_0to1 memcpy_peer_1to0 memcpy_peer_0to1_enabled memcpy_peer_1to0_enabled kernel_reads_peer; do
    n=$(awk -v k=$k '$2==k{print $3}' "$W/bw.native"); m=$(awk -v k=$k '$2==k{print $3}' "$W/bw.mps")
    o=$(awk -v k=$k '$2==k{print $3}' "$W/bw.omps")
    r=$(awk -v a="$o" -v b="$m" 'BEGIN{if (b+0>0 && a+0>0) printf "%.2f", a/b; else print "-"}')
    echo "  $k: ${n:-?} / ${m:-?} / ${o:-?}; $r"
done
echo "cudaMalloc + cudaFree 1 MiB, us: native $(malloc_us "$W/bench.native"); omps $(malloc_us "$W/bench.omps-before") before a client enabled peer access, $(malloc_us "$W/bench.omps-after") after"
grep -h FAIL "$W"/bw.* "$W"/bench.* 2>/dev/null
grep -i -E "warn|error|panic" "$W/server.log" | head -10
[ $fail = 0 ] && echo "peer: PASS" || { echo "peer: FAIL"; exit 1; }
