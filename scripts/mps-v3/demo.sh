#!/usr/bin/env bash
# An MPS v3 operator's script, run against omps (issue 26): start with a TOML file, make a
# namespace, run clients in two namespaces, list them, show the server's status, quit.
# Every line of it is what NVIDIA's v3 documentation shows with nvidia-cuda-mps-control;
# the outputs go to $OUT/mps-v3-demo.txt beside the shapes NVIDIA documents (PIDs, UUIDs
# and paths differ). The GPU machines' driver (580) predates MPS v3, so there is no live
# MPS v3 to run it against.
#
#   OMPS_BIN=target/release OUT=/tmp/x bash scripts/mps-v3/demo.sh
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${OMPS_BIN:-target/release}")
OUT=${OUT:-/tmp/omps-v3-demo}; mkdir -p "$OUT"
W=$(mktemp -d /tmp/omps-v3.XXXXXX)
export CUDA_MPS_PIPE_DIRECTORY=$W/pipe CUDA_MPS_LOG_DIRECTORY=$W/log
unset OMPS_PIPE_DIRECTORY OMPS_LOG_DIRECTORY
mkdir -p "$W/log"
ctl="timeout 20 $BIN/omps-ctl"
log=$OUT/mps-v3-demo.txt; : > "$log"
say() { echo "\$ $*" >> "$log"; "$@" >> "$log" 2>&1; echo "[exit $?]" >> "$log"; }
cat > "$W/mps.toml" <<'TOML'
schema_version = "1.0"

[compute_policy]
timeslice = "long"

[servers.training]
pinned_memory_limit      = "10G"
active_thread_percentage = "50"
client_priority          = "0"

[servers.training.namespaces.high_priority]
pinned_memory_limit      = "4G"
active_thread_percentage = "25"
TOML
say $ctl -d -p 3 -a "$W/mps.toml"
say $ctl server list --format=csv,noheader
say $ctl namespace create low_priority --server=training
say $ctl namespace set low_priority --server=training --pinned-memory-limit=2G --client-priority=1
say $ctl namespace list --server=training
# Two clients, one per namespace; each prints what cudaMemGetInfo tells it.
client='import time
import torch
f, t = torch.cuda.mem_get_info()
print("mem_get_info total %.1f GiB" % (t / 2**30), flush=True)
x = torch.ones(1 << 20, device="cuda"); torch.cuda.synchronize(); time.sleep(6)'
for ns in high_priority low_priority; do
    CUDA_MPS_PIPE_DIRECTORY=$W/pipe/training/$ns LD_PRELOAD=$BIN/libomps_shim.so \
        timeout 40 python3 -c "$client" > "$W/client-$ns.txt" 2>&1 &
done
# List once both have connected (their first CUDA call), within 25 s.
for _ in $(seq 50); do
    [ "$($ctl client list --format=csv,noheader 2>/dev/null | grep -c .)" -ge 2 ] && break
    sleep 0.5
done
say $ctl client list --all
say $ctl client list --format=csv
say $ctl get_server_status "$($ctl get_server_list)"
say $ctl config save "$W/saved.toml"
echo "--- saved:" >> "$log"; cat "$W/saved.toml" >> "$log" 2>&1
for j in $(jobs -p); do wait "$j"; done
for ns in high_priority low_priority; do echo "--- client in $ns:" >> "$log"; cat "$W/client-$ns.txt" >> "$log"; done
say $ctl -q
cat "$log"
rm -rf "$W"
