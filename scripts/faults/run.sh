#!/usr/bin/env bash
# Faults and server death on the GPU (issue 10):
#  1. A kernel that stores to an unmapped address: every client of the GPU is told (its
#     next call fails), the server says FAULT, and once those clients are gone it is
#     ACTIVE again by itself and a new client computes what it computes natively.
#  2. Clients arriving back to back, no pause, before, during and after a fault (and the
#     restart it brings where the context cannot be recreated): each is served, refused
#     with CUDA_ERROR_MPS_SERVER_NOT_READY (807), or, if it was connected when the fault
#     came, told of the fault; none fails to reach the server, the socket file is there
#     throughout, the server keeps its PID, and once ACTIVE again every client is served.
#  3. SIGKILL of the server while clients work: each gets an error within 1 s of the kill
#     (none hangs), and a server started again serves a new client at once.
#   OMPS_BIN=target/release bash scripts/faults/run.sh     (GPU machine)
set -u
. "$(dirname "$0")/../common.sh"
B=$(cd "${OMPS_BIN:-target/release}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
W=${1:-/tmp/omps-faults}
N=${FAULT_CLIENTS:-4}
rm -rf "$W"; mkdir -p "$W/pipe"; chmod 700 "$W/pipe"
nvcc -O2 -arch=sm_90 -o "$W/client" "$HERE/fault_client.cu" || exit 1
"$W/client" once > "$W/native.txt"
export OMPS_PIPE_DIRECTORY=$W/pipe
ctl() { timeout 10 "$B/omps-ctl" "$@"; }
serve() {
    OMPS_LOG=info "$B/omps-server" >> "$W/server.log" 2>&1 &
    SP=$!
    for _ in $(seq 200); do ctl get_server_list > /dev/null 2>&1 && break; sleep 0.05; done
}
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
fail=0
verdict() { if [ "$2" = PASS ]; then echo ">>> $1: PASS"; else echo ">>> $1: FAIL ($2)"; fail=1; fi; }
start_loops() { # n: clients that work until an error, each waited for until ready
    LOOPS=()
    for i in $(seq "$1"); do
        LD_PRELOAD="$B/libomps_shim.so" timeout 60 "$W/client" loop > "$W/loop$i.out" 2>&1 &
        LOOPS+=($!)
    done
    for i in $(seq "$1"); do
        for _ in $(seq 200); do grep -q ready "$W/loop$i.out" && break; sleep 0.05; done
    done
}

# 1. A fault.
serve
start_loops "$N"
LD_PRELOAD="$B/libomps_shim.so" timeout 60 "$W/client" fault > "$W/fault.out" 2>&1
echo "faulting client: $(cat "$W/fault.out")"
wait "${LOOPS[@]}"
told=0
for i in $(seq "$N"); do grep -q '^error ' "$W/loop$i.out" && told=$((told + 1)); echo "  client $i: $(tail -n 1 "$W/loop$i.out")"; done
verdict "fault: every client of the GPU told ($told of $N)" "$([ $told = "$N" ] && echo PASS || echo "$told of $N")"
t=$(date +%s%N); st=""
for _ in $(seq 100); do st=$(ctl get_server_status "$SP"); [ "$st" = ACTIVE ] && break; sleep 0.1; done
echo "server status $(ms_since "$t") ms after its clients left: $st (how: $(grep -o 'context recreated after the fault\|the server stops to start again' "$W/server.log" | sort | uniq -c | tr '\n' ' '))"
grep 'context reset: ' "$W/server.log" | head -n 3
verdict "fault: ACTIVE again by itself" "$([ "$st" = ACTIVE ] && echo PASS || echo "$st")"
# If it started itself again: under its own name, and still writing its log.
starts=$(grep -c 'omps server listening' "$W/server.log")
echo "server process: pid $SP, name $(cat /proc/$SP/comm 2>/dev/null), $starts start(s) in its log"
verdict "fault: the server keeps its name and its log" "$([ "$(cat /proc/$SP/comm 2>/dev/null)" = omps-server ] && [ "$starts" -ge 1 ] && echo PASS || echo "name or log lost")"
LD_PRELOAD="$B/libomps_shim.so" timeout 60 "$W/client" once > "$W/after_fault.txt" 2>&1
verdict "fault: a new client computes as natively" "$(cmp -s "$W/native.txt" "$W/after_fault.txt" && echo PASS || cat "$W/after_fault.txt")"
if [ "$(timeout 20 nvidia-smi -L | wc -l)" -ge 2 ]; then
    # Several GPUs: the recreated context (or restarted server) reaches its peers again.
    timeout 300 nvcc -O2 -arch=sm_90 -I"$HERE/../../tests/cuda/rt" -o "$W/peer_access" "$HERE/../../tests/cuda/rt/peer_access.cu" || exit 1
    timeout 60 "$W/peer_access" > "$W/peer.native" 2>&1
    LD_PRELOAD="$B/libomps_shim.so" timeout 60 "$W/peer_access" > "$W/peer.omps" 2>&1
    verdict "fault: peer access between the GPUs as natively after it" "$(cmp -s "$W/peer.native" "$W/peer.omps" && echo PASS || diff "$W/peer.native" "$W/peer.omps" | head -n 5)"
fi

# 2. Clients back to back through a fault and the restart.
arrivals() { # "once" clients one after another until $W/arr.stop exists; $1: OMPS_CONNECT_WAIT
    # Two loops run at once: one whose clients take the refusal at once (0), one whose
    # clients wait for the server as MPS clients do (the default, 30 s). Apart, a waiting
    # client would hold its loop through the whole restart and none would be refused.
    local i=0 wait=$1
    while [ ! -e "$W/arr.stop" ]; do
        i=$((i + 1)); local s0; s0=$(date +%s%N)
        OMPS_CONNECT_WAIT=$wait LD_PRELOAD="$B/libomps_shim.so" timeout 40 "$W/client" once > "$W/arr$wait-$i.out" 2>&1
        echo "$? $s0 $wait" > "$W/arr$wait-$i.rc"
    done
}
rm -f "$W"/arr* "$W/sock.missing"
( while [ ! -e "$W/arr.stop" ]; do [ -S "$W/pipe/omps.sock" ] || echo "$(date +%s%N)" >> "$W/sock.missing"; sleep 0.005; done ) &
WATCH=$!
arrivals 0 & ARR=$!
arrivals 30 & ARR2=$!
sleep 1
LD_PRELOAD="$B/libomps_shim.so" timeout 60 "$W/client" fault > "$W/fault2.out" 2>&1; f=$(date +%s%N)
st=""
for _ in $(seq 100); do st=$(ctl get_server_status "$SP" 2>/dev/null); [ "$st" = ACTIVE ] && break; sleep 0.1; done
active=$(date +%s%N)
echo "back to back: $(cat "$W/fault2.out"); server $st $(( (active - f) / 1000000 )) ms after it"
sleep 3; touch "$W/arr.stop"; wait "$ARR"; wait "$ARR2"; wait "$WATCH"
served=0 refused=0 told=0 lost=0 late=0 waited=0 unserved_waiters=0
for r in "$W"/arr*.rc; do
    o=${r%.rc}.out; read -r rc began waits < "$r"
    ok=0; [ "$rc" = 0 ] && cmp -s "$W/native.txt" "$o" && ok=1
    # A waiting client is served, unless it was connected when the fault came.
    if [ "$waits" != 0 ]; then
        waited=$((waited + 1))
        [ $ok = 0 ] && grep -q 'CUDA error 807\|cudaErrorMpsServerNotReady\|cannot reach' "$o" && unserved_waiters=$((unserved_waiters + 1))
    fi
    # Started once the server was ACTIVE again: must be served.
    [ "$began" -gt "$active" ] && [ $ok = 0 ] && late=$((late + 1))
    if [ $ok = 1 ]; then served=$((served + 1))
    elif grep -q 'CUDA error 807\|cudaErrorMpsServerNotReady' "$o"; then refused=$((refused + 1))
    elif [ "$rc" = 124 ] || grep -q 'cannot reach\|handshake\|CUDA error 80[5689]\|cudaErrorMps' "$o"; then
        lost=$((lost + 1)); echo "  lost: $(basename "$o"): $(head -c 300 "$o")"
    else told=$((told + 1)); fi
done
missing=0; [ -e "$W/sock.missing" ] && missing=$(wc -l < "$W/sock.missing")
echo "back to back: $served served, $refused refused (807), $told told of the fault, $lost lost; socket missing $missing times; server pid $SP $(cat /proc/$SP/comm 2>/dev/null), $(grep -c 'omps server listening' "$W/server.log") start(s) in its log"
verdict "back to back: no client fails to reach the server" "$([ $lost = 0 ] && echo PASS || echo "$lost lost")"
verdict "back to back: the socket file is always there" "$([ "$missing" = 0 ] && echo PASS || echo "missing $missing times")"
verdict "back to back: clients came during the fault, were refused (807), and are served after it" "$([ $refused -gt 0 ] && [ "$st" = ACTIVE ] && [ $late = 0 ] && [ $served -gt 0 ] && echo PASS || echo "refused $refused, status $st, $late not served after ACTIVE")"
verdict "back to back: clients that wait (OMPS_CONNECT_WAIT, default 30 s) are served, never refused" "$([ $waited -gt 0 ] && [ $unserved_waiters = 0 ] && echo PASS || echo "$unserved_waiters of $waited refused")"
verdict "back to back: the server keeps its PID" "$(kill -0 "$SP" 2>/dev/null && [ "$(cat /proc/$SP/comm 2>/dev/null)" = omps-server ] && echo PASS || echo "server $SP gone")"

# 3. The server killed.
start_loops "$N"
kill -9 "$SP"; k=$(date +%s%N)
wait "$SP" 2>/dev/null
for i in $(seq "$N"); do wait "${LOOPS[$((i - 1))]}"; echo "  client $i exited rc $? $(ms_since "$k") ms after the kill: $(tail -n 1 "$W/loop$i.out")"; done
slow=0
for i in $(seq "$N"); do
    at=$(awk '/^error .* at [0-9]+$/ {print $NF}' "$W/loop$i.out")
    if [ -z "$at" ] || [ $(( (at - k) / 1000000 )) -gt 1000 ]; then slow=$((slow + 1)); else echo "  client $i: error $(( (at - k) / 1000000 )) ms after the kill"; fi
done
verdict "server killed: every client gets an error within 1 s" "$([ $slow = 0 ] && echo PASS || echo "$slow late or none")"
t=$(date +%s%N)
serve
LD_PRELOAD="$B/libomps_shim.so" timeout 60 "$W/client" once > "$W/after_restart.txt" 2>&1
echo "restarted server: a client done $(ms_since "$t") ms after the start"
verdict "server restarted: serves a new client at once" "$(cmp -s "$W/native.txt" "$W/after_restart.txt" && echo PASS || cat "$W/after_restart.txt")"
ctl quit > /dev/null; wait_server "$SP"
grep -c panicked "$W/server.log" | sed 's/^/server log panics: /'
[ $fail = 0 ] && echo "faults: PASS" || { echo "faults: FAIL"; tail -n 30 "$W/server.log"; exit 1; }
