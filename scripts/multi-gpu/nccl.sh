#!/usr/bin/env bash
# torch.distributed over NCCL on two GPUs, each rank a client of omps (run on the two-GPU
# machine): tests/clients/nccl_prog.py natively and through omps, outputs compared line
# for line, once with NCCL's default cuMem transport (VMM memory shared as descriptors,
# cuMemSetAccess for the peer GPU: docs/design.md "Peer access between GPUs") and once
# with NCCL_CUMEM_ENABLE=0 (legacy cudaIpc handles). NCCL_DEBUG=INFO logs are kept; the
# transport NCCL chose between the ranks and any entry point omps does not implement
# (the shim names each once) are printed.
#   OMPS_BIN=target/release bash scripts/multi-gpu/nccl.sh [workdir]
set -u
. "$(dirname "$0")/../common.sh"
B=$(cd "${OMPS_BIN:-target/release}" && pwd)
R=$(cd "$(dirname "$0")/../.." && pwd)
W=${1:-/tmp/omps-nccl}
rm -rf "$W"; mkdir -p "$W/pipe" "$W/log"; chmod 700 "$W/pipe"
if [ "$(nvidia-smi -L | wc -l)" -lt 2 ]; then echo "needs two GPUs"; exit 2; fi
timeout 20 nvidia-smi topo -m 2>/dev/null | head -4
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
export NCCL_DEBUG=${NCCL_DEBUG:-INFO} NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
fail=0
run() { # name, then env assignments for the program
    local name=$1; shift
    env "$@" timeout "${NCCL_RUN_TIMEOUT:-300}" python3 "$R/tests/clients/nccl_prog.py" > "$W/$name.txt" 2> "$W/$name.err"
    echo $?
}
# NCCL_DEBUG writes its log to stdout beside the program's lines: the log is set aside
# (kept in the workdir) and the program's own lines compared.
transport() { cat "$@" | grep -o -E 'via (P2P|SHM|NET)[^ ]*( [^ ]*)?' | sort | uniq -c | head -5; }
own_lines() { grep -v -E ' NCCL (INFO|WARN|TRACE) |^\s*$' "$1"; }

OMPS_PIPE_DIRECTORY="$W/pipe" OMPS_LOG_DIRECTORY="$W/log" OMPS_LANES=${OMPS_LANES:-4} \
    "$B/omps-server" > "$W/server.log" 2>&1 &
SP=$!
for _ in $(seq 100); do [ -S "$W/pipe/omps.sock" ] && break; sleep 0.1; done
OMPS=(OMPS_PIPE_DIRECTORY="$W/pipe" LD_PRELOAD="$B/libomps_shim.so")
for mode in cumem legacy; do
    case $mode in cumem) M=(NCCL_CUMEM_ENABLE=1) ;; legacy) M=(NCCL_CUMEM_ENABLE=0) ;; esac
    n=$(run "$mode.native" "${M[@]}")
    o=$(run "$mode.omps" "${M[@]}" "${OMPS[@]}")
    echo "--- $mode: native rc $n, omps rc $o; transport native / omps:"
    transport "$W/$mode.native".{txt,err}; echo "  /"; transport "$W/$mode.omps".{txt,err}
    grep -h "is not supported yet" "$W/$mode.omps".{txt,err} | sort -u | head -10
    grep -h "NCCL WARN" "$W/$mode.omps".{txt,err} | sed 's/^.*NCCL WARN/omps run: NCCL WARN/' | sort | uniq -c
    own_lines "$W/$mode.native.txt" > "$W/$mode.native.own"; own_lines "$W/$mode.omps.txt" > "$W/$mode.omps.own"
    if [ "$n" = 0 ] && [ "$o" = 0 ] && [ -s "$W/$mode.native.own" ] && cmp -s "$W/$mode.native.own" "$W/$mode.omps.own"; then
        echo ">>> nccl $mode: PASS ($(wc -l < "$W/$mode.native.own") lines as native)"
    else
        echo ">>> nccl $mode: FAIL"; diff "$W/$mode.native.own" "$W/$mode.omps.own" | head -20
        grep -h -i -E "error|warn" "$W/$mode.omps".{txt,err} | head -20; fail=1
    fi
done
OMPS_PIPE_DIRECTORY="$W/pipe" timeout 10 "$B/omps-ctl" quit > /dev/null; wait_server "$SP"
grep -i -E "disconnect|fault|error" "$W/server.log" | head -20
tar czf "$W.tgz" -C "$(dirname "$W")" "$(basename "$W")" 2>/dev/null
exit $fail
