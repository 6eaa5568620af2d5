#!/usr/bin/env bash
# A client as a container runs it: its own IPC, PID and mount namespaces, a private empty
# /dev/shm and /tmp, and of the host only the pipe directory (bind-mounted at /run/omps) —
# no hostIPC. It must print what it prints natively, and the server must list it under
# both its PIDs (the server's view, and 1-ish inside its namespace).
#   OMPS_BIN=target/release bash scripts/containers/unshare.sh   (as root, on the GPU machine)
set -u
B=$(cd "${OMPS_BIN:-target/release}" && pwd)
R=$(cd "$(dirname "$0")/../.." && pwd)
W=${1:-/var/tmp/omps-unshare}
rm -rf "$W"; mkdir -p "$W/pipe" "$W/bin"
nvcc -O2 -I"$R/tests/cuda/rt" -o "$W/bin/vector_add" "$R/tests/cuda/rt/vector_add.cu" || exit 1
nvcc -O2 -I"$R/tests/cuda/rt" -o "$W/bin/pinned" "$R/tests/cuda/rt/pinned.cu" || exit 1
# Stays 4 s (argument "hold"), so that ps lists it while it runs.
nvcc -O2 -o "$W/bin/limit_client" "$R/scripts/mps-compat/limit_client.cu" || exit 1
cp "$B/libomps_shim.so" "$W/bin/"
chmod 700 "$W/pipe"
OMPS_PIPE_DIRECTORY="$W/pipe" "$B/omps-server" > "$W/server.log" 2>&1 &
SP=$!
for _ in $(seq 100); do [ -S "$W/pipe/omps.sock" ] && break; sleep 0.1; done
ctl() { OMPS_PIPE_DIRECTORY="$W/pipe" timeout 10 "$B/omps-ctl" "$@"; }
fail=0
for prog in vector_add pinned limit_client; do
    "$W/bin/$prog" hold > "$W/$prog.native" 2>&1
    # In the namespaces: /tmp and /dev/shm replaced by empty ones, the pipe directory the
    # only thing of the host's omps can reach, the client's ps and IPC its own.
    timeout 120 unshare --ipc --pid --mount --fork --mount-proc --propagation private bash -c '
        set -e
        mkdir -p /run/omps
        mount --bind "$0/pipe" /run/omps
        mount -t tmpfs none /dev/shm
        mount -t tmpfs none /tmp
        echo "inside: pid $$, $(ls /dev/shm | wc -l) entries in /dev/shm, ipc $(readlink /proc/self/ns/ipc)"
        CUDA_MPS_PIPE_DIRECTORY=/run/omps LD_PRELOAD="$0/bin/libomps_shim.so" "$0/bin/$1" hold > "$0/$1.contained" 2>&1 &
        c=$!
        sleep 0.5
        wait $c
    ' "$W" "$prog" > "$W/$prog.inside" 2>&1 &
    up=$!
    sleep 1
    ctl ps > "$W/$prog.ps" 2>&1
    wait $up; rc=$?
    cat "$W/$prog.inside"
    echo "host ipc $(readlink /proc/self/ns/ipc); omps-ctl ps while it ran:"; sed 's/^/    /' "$W/$prog.ps"
    if [ $rc -eq 0 ] && cmp -s "$W/$prog.native" "$W/$prog.contained"; then
        echo ">>> $prog in its own namespaces: PASS (output identical to native)"
    else
        echo ">>> $prog in its own namespaces: FAIL (rc $rc)"; diff "$W/$prog.native" "$W/$prog.contained" | head; fail=1
    fi
done
ctl quit > /dev/null; wait $SP
[ $fail = 0 ] && echo "containers: PASS" || { echo "containers: FAIL"; tail -n 20 "$W/server.log"; exit 1; }
