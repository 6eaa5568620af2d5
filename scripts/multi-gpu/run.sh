#!/usr/bin/env bash
# Several GPUs under one omps server (run on the two-GPU machine):
#  1. the server serves every visible GPU: device_query lists them all, and a client that
#     uses all of them at once prints what it prints natively (rt/multi_gpu);
#  2. pinned memory given back while copies ran on both GPUs is fenced on each GPU's
#     worker (rt/pinned, rt/host_register beside multi_gpu clients), outputs exact;
#  3. a client's CUDA_VISIBLE_DEVICES selects and orders the GPUs it sees;
#  4. CUDA_VISIBLE_DEVICES on the server renumbers: with "1" the only device clients see
#     is the machine's second GPU (its UUID), as device_query says.
#   OMPS_BIN=target/release bash scripts/multi-gpu/run.sh
set -u
. "$(dirname "$0")/../common.sh"
B=$(cd "${OMPS_BIN:-target/release}" && pwd)
R=$(cd "$(dirname "$0")/../.." && pwd)
W=${1:-/tmp/omps-multi-gpu}
rm -rf "$W"; mkdir -p "$W/bin"
for p in multi_gpu pinned host_register; do
    timeout 300 nvcc -O2 -arch=sm_90 -I"$R/tests/cuda/rt" -o "$W/bin/$p" "$R/tests/cuda/rt/$p.cu" || exit 1
    timeout 60 "$W/bin/$p" > "$W/$p.native" 2>&1
done
fail=0
serve() { # [CUDA_VISIBLE_DEVICES value]
    mkdir -p "$W/pipe$1"; chmod 700 "$W/pipe$1"
    if [ -n "$1" ]; then
        CUDA_VISIBLE_DEVICES=$1 OMPS_PIPE_DIRECTORY="$W/pipe$1" "$B/omps-server" > "$W/server$1.log" 2>&1 &
    else
        OMPS_PIPE_DIRECTORY="$W/pipe$1" "$B/omps-server" > "$W/server$1.log" 2>&1 &
    fi
    SP=$!
    for _ in $(seq 100); do [ -S "$W/pipe$1/omps.sock" ] && break; sleep 0.1; done
}
ctl() { OMPS_PIPE_DIRECTORY="$W/pipe$1" timeout 10 "$B/omps-ctl" "${@:2}"; }
check() { # name file-native file-omps
    if cmp -s "$2" "$3"; then echo ">>> $1: PASS"; else echo ">>> $1: FAIL"; diff "$2" "$3" | head; fail=1; fi
}

timeout 20 nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader
serve ""
ctl "" device_query
pids=()
for i in 1 2 3; do
    OMPS_PIPE_DIRECTORY="$W/pipe" LD_PRELOAD="$B/libomps_shim.so" timeout 60 "$W/bin/multi_gpu" > "$W/multi_gpu.omps$i" 2>&1 &
    pids+=($!)
done
for p in pinned host_register; do
    OMPS_PIPE_DIRECTORY="$W/pipe" LD_PRELOAD="$B/libomps_shim.so" timeout 60 "$W/bin/$p" > "$W/$p.omps" 2>&1 &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
# A client's own CUDA_VISIBLE_DEVICES: it sees the machine's second GPU only (and first
# when named in the other order), as natively.
for v in 1 1,0; do
    CUDA_VISIBLE_DEVICES=$v timeout 60 "$W/bin/multi_gpu" > "$W/multi_gpu.native-v$v" 2>&1
    CUDA_VISIBLE_DEVICES=$v OMPS_PIPE_DIRECTORY="$W/pipe" LD_PRELOAD="$B/libomps_shim.so" \
        timeout 60 "$W/bin/multi_gpu" > "$W/multi_gpu.omps-v$v" 2>&1
    check "a client with CUDA_VISIBLE_DEVICES=$v" "$W/multi_gpu.native-v$v" "$W/multi_gpu.omps-v$v"
done
ctl "" ps
for i in 1 2 3; do check "multi_gpu client $i on every GPU" "$W/multi_gpu.native" "$W/multi_gpu.omps$i"; done
for p in pinned host_register; do check "$p beside them (unpin fenced on each GPU)" "$W/$p.native" "$W/$p.omps"; done
ctl "" quit > /dev/null; wait_server "$SP"

serve 1
ctl 1 device_query > "$W/dq1.txt"; cat "$W/dq1.txt"
want=$(timeout 20 nvidia-smi --query-gpu=uuid --format=csv,noheader -i 1 | cut -c1-22)
OMPS_PIPE_DIRECTORY="$W/pipe1" LD_PRELOAD="$B/libomps_shim.so" timeout 60 "$W/bin/multi_gpu" > "$W/multi_gpu.visible1" 2>&1
CUDA_VISIBLE_DEVICES=1 timeout 60 "$W/bin/multi_gpu" > "$W/multi_gpu.native1" 2>&1
check "CUDA_VISIBLE_DEVICES=1 on the server: one device, as natively" "$W/multi_gpu.native1" "$W/multi_gpu.visible1"
if grep -q "^0 .*$want" "$W/dq1.txt"; then echo ">>> renumbered: device 0 is the machine's GPU 1 ($want): PASS"
else echo ">>> renumbered: FAIL (want $want as device 0)"; fail=1; fi
ctl 1 quit > /dev/null; wait_server "$SP"
[ $fail = 0 ] && echo "multi-gpu: PASS" || { echo "multi-gpu: FAIL"; tail -n 20 "$W/server.log"; exit 1; }
