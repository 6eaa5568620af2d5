#!/usr/bin/env bash
# Records what NVIDIA MPS's control daemon prints, byte for byte (cat -A), for every
# query command, with two clients connected: the reference omps-ctl's formats follow.
#   bash scripts/mps-compat/capture.sh [WORKDIR]    (GPU machine; prints to stdout)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
W=${1:-/tmp/omps-mps-capture}
MPS=${MPS_BIN:-/usr/local/nvidia/bin}/nvidia-cuda-mps-control
rm -rf "$W"; mkdir -p "$W/pipe" "$W/log"
export CUDA_MPS_PIPE_DIRECTORY=$W/pipe CUDA_MPS_LOG_DIRECTORY=$W/log
nvcc -O2 -o "$W/limit_client" "$HERE/limit_client.cu" || exit 1
timeout 10 "$MPS" -d
"$W/limit_client" hold > /dev/null 2>&1 & c1=$!
"$W/limit_client" hold > /dev/null 2>&1 & c2=$!
sleep 2.5
s=$(echo get_server_list | timeout 10 "$MPS")
ask() { echo "### $* (clients $c1 $c2, server $s)"; echo "$*" | timeout 10 "$MPS" | cat -A; echo "### rc ${PIPESTATUS[1]}"; }
for cmd in "ps" "ps -p $c1" "get_client_list $s" "get_device_client_list" \
    "get_device_client_list $s" "device_query" "get_server_status $s" \
    "get_default_device_pinned_mem_limit 0" "get_device_pinned_mem_limit $s 0" \
    "get_active_thread_percentage $s" "get_default_active_thread_percentage" \
    "get_default_client_priority" "get_server_status 1" "frobnicate" "ps -p 1"; do
    ask "$cmd"
done
wait $c1 $c2
echo quit | timeout 10 "$MPS"
sleep 1
echo "### control.log"; cat -A "$W/log/control.log" | tail -n 40
