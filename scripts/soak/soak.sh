#!/bin/bash
# Kill soak (issues 10, 23): KILLS clients are SIGKILLed at random moments (mid module
# load, allocation, copy, launch, synchronization, graph instantiation and launch, VMM
# create/map/unmap, IPC open and close of an exporter's buffer; some inside PyTorch
# inference) while SURVIVORS clients keep working. Then: did the server survive, are its
# memory, descriptors and the GPU's memory back at their baseline, did every survivor
# print exactly what it prints natively, and did the exporter's buffer stay whole?
# Usage, from the repository root on the GPU machine (omps binaries in $OMPS_BIN):
#   scripts/soak/soak.sh [KILLS] [TORCH_KILLS]   (results on stdout; logs in $W)
set -u
KILLS=${1:-1000}
TORCH_KILLS=${2:-20}
B=${OMPS_BIN:-$PWD/target/release}
W=${SOAK_DIR:-/tmp/omps-soak}
PAR=${SOAK_PARALLEL:-6}
rm -rf "$W"; mkdir -p "$W/pipe"
export PATH=/usr/local/cuda/bin:$PATH
nvcc -O2 -arch=sm_90 -o "$W/client" scripts/soak/soak_client.cu -lcuda || exit 1
SURV_ROUNDS=${SOAK_SURVIVOR_ROUNDS:-4000}
"$W/client" --survivor "$SURV_ROUNDS" > "$W/native.txt" || { echo "native survivor failed"; exit 1; }

export OMPS_PIPE_DIRECTORY=$W/pipe
OMPS_LOG=warn "$B/omps-server" > "$W/server.log" 2>&1 &
SP=$!
for _ in $(seq 100); do [ -e "$W/pipe/omps.sock" ] && break; sleep 0.1; done
ctl() { timeout 10 "$B/omps-ctl" "$@"; }
shim="$B/libomps_shim.so"
rss() { awk '/VmRSS/ {print $2}' /proc/$SP/status; }
fds() { ls /proc/$SP/fd | wc -l; }
gpumem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }

kill_one() { # a victim, killed after a random 5-200 ms
    SOAK_IPC_HANDLE=$W/ipc-handle LD_PRELOAD=$shim "$W/client" --victim > /dev/null 2>&1 &
    local p=$!
    sleep "0.$(printf '%03d' $((5 + RANDOM % 195)))"
    kill -9 $p 2>/dev/null; wait $p 2>/dev/null
}
torch_script='
import sys, torch
m = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda().half()
x = torch.randn(64, 512, device="cuda", dtype=torch.half)
for _ in range(int(sys.argv[1])):
    with torch.no_grad(): y = m(x)
    torch.cuda.synchronize()
'
torch_kill() { # PyTorch inference, killed 2-8 s in (after its start: mid-inference)
    LD_PRELOAD=$shim python3 -c "$torch_script" 1000000000 > /dev/null 2>&1 &
    local p=$!
    sleep $((2 + RANDOM % 7))
    kill -9 $p 2>/dev/null; wait $p 2>/dev/null
}

# Warm-up: a round of victims and one PyTorch client that runs its inference to the end
# fill the module cache (and the driver's copies of what it loads), so the baseline holds
# what the cache keeps by design.
for _ in $(seq 20); do kill_one; done
LD_PRELOAD=$shim timeout 120 python3 -c "$torch_script" 100 > /dev/null 2>&1
torch_kill
sleep 2
base_rss=$(rss); base_fds=$(fds); base_gpu=$(gpumem)
# Where the server's memory lies (heap, files, shared segments) and what its module cache
# keeps, at each phase: growth that a phase leaves shows up in the line after it.
phase() {
    echo "$1: rss $(rss) KiB ($(awk '/^(Rss(Anon|File|Shmem)|Threads):/ {printf "%s %s ", $1, $2}' /proc/$SP/status)) fds $(fds) gpu $(gpumem) MiB; $(ctl stats | grep -E '^(cache|heap)' | tr '\n' ' ')" >> "$W/phases.txt"
}
phase baseline

# Survivors, started now: they must run through the whole soak and print what they do natively.
SURV=${SOAK_SURVIVORS:-4}
spids=()
for i in $(seq "$SURV"); do
    LD_PRELOAD=$shim "$W/client" --survivor "$SURV_ROUNDS" > "$W/survivor$i.txt" 2>&1 &
    spids+=($!)
done

# An exporter whose buffer the victims open, read and close (and die holding open).
LD_PRELOAD=$shim "$W/client" --exporter "$W/ipc-handle" "${SOAK_EXPORT_SECONDS:-240}" > "$W/exporter.txt" 2>&1 &
xp=$!
t0=$(date +%s)
done_kills=0
while [ $done_kills -lt "$KILLS" ]; do
    kp=()
    for _ in $(seq "$PAR"); do kill_one & kp+=($!); done
    for j in "${kp[@]}"; do wait "$j" 2>/dev/null; done
    done_kills=$((done_kills + PAR))
    kill -0 $SP 2>/dev/null || break
done
phase "after $done_kills kills"
# A phase line every 4 PyTorch kills: whether what they leave grows with their number.
for k in $(seq "$TORCH_KILLS"); do
    torch_kill; kill -0 $SP 2>/dev/null || break
    [ $((k % 4)) -eq 0 ] && [ "$k" -lt "$TORCH_KILLS" ] && phase "after $k PyTorch kills (survivors running)"
done
t1=$(date +%s)
for p in "${spids[@]}"; do wait "$p"; done
kill -TERM "$xp" 2>/dev/null && wait "$xp" 2>/dev/null
phase "after $TORCH_KILLS PyTorch kills"
# Dead clients' segments stay registered (and resident) until the GPU is quiet or for up
# to 30 s (omps-server/src/unpin.rs): measure once that has passed.
sleep "${SOAK_SETTLE:-35}"
alive=no; kill -0 $SP 2>/dev/null && alive=yes
phase "after PyTorch kills and ${SOAK_SETTLE:-35} s"
after_rss=$(rss 2>/dev/null); after_fds=$(fds 2>/dev/null); after_gpu=$(gpumem)
ok_surv=0
for i in $(seq "$SURV"); do cmp -s "$W/native.txt" "$W/survivor$i.txt" && ok_surv=$((ok_surv + 1)); done
clients=$(ctl get_client_list 2>/dev/null | wc -l)
echo "soak: $done_kills kills of driver-API clients + $TORCH_KILLS of PyTorch clients in $((t1 - t0)) s"
echo "server alive: $alive; clients left: $clients"
echo "server RSS: $base_rss KiB -> $after_rss KiB; descriptors: $base_fds -> $after_fds; GPU memory used: $base_gpu MiB -> $after_gpu MiB"
echo "survivors: $ok_surv of $SURV printed exactly the native output"
# Ended early (TERM once the survivors are done) it prints nothing more; a FAIL line is
# a change to its buffer seen while the victims came and went.
if grep -q FAIL "$W/exporter.txt"; then echo "exporter: $(grep FAIL "$W/exporter.txt")"; else echo "exporter: its buffer stayed whole while victims opened it ($(grep -c . "$W/exporter.txt") lines)"; fi
echo "clients served: $(grep -c 'client connected' "$W/server.log"); connections refused: $(grep -c 'connection refused' "$W/server.log"); server log warnings: $(grep -c WARN "$W/server.log")"
grep -ciE "panic" "$W/server.log" | sed 's/^/server log panics: /'
cat "$W/phases.txt"
ctl quit > /dev/null; sleep 2; kill $SP 2>/dev/null; wait $SP
