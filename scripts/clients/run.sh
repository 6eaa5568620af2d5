#!/usr/bin/env bash
# Other CUDA clients than PyTorch, natively and through omps (both ways in), outputs
# compared line for line: JAX, CuPy, numba-cuda (tests/clients/*_prog.py), and with two
# GPUs torch.distributed over NCCL (tests/clients/nccl_prog.py, one rank per GPU).
#
#   bash scripts/clients/run.sh [jax cupy numba nccl]     (all when none is named)
#
# Needs the release binaries in ${OMPS_BIN:-target/release}. Prints a PASS/FAIL line per
# program and way; logs in ${OUT:-/tmp/omps-clients}. Exit 1 if any differs from native.
set -u
cd "$(dirname "$0")/../.."
source scripts/common.sh
BIN=$(readlink -f "${OMPS_BIN:-target/release}")
OUT=${OUT:-/tmp/omps-clients}; mkdir -p "$OUT"
LOG=$OUT/clients; rm -rf "$LOG"; mkdir -p "$LOG"
PIPE=$(mktemp -d /tmp/omps-clients-pipe.XXXX); LOGD=$LOG/omps-log; mkdir -p "$LOGD"
LIBDIR=$(mktemp -d); ln -s "$BIN/libomps_shim.so" "$LIBDIR/libcuda.so.1"; ln -s "$BIN/libomps_shim.so" "$LIBDIR/libcuda.so"
export OMPS_PIPE_DIRECTORY=$PIPE OMPS_LOG_DIRECTORY=$LOGD
progs=("$@"); [ ${#progs[@]} -eq 0 ] && progs=(jax cupy numba nccl)
T=${CLIENT_TIMEOUT:-240}

OMPS_LANES=${OMPS_LANES:-4} "$BIN/omps-server" > "$LOG/server.out" 2>&1 &
SPID=$!
for _ in $(seq 100); do [ -S "$PIPE/omps.sock" ] && break; sleep 0.1; done

# Lines that differ between runs whatever serves them (timings, PIDs, addresses).
norm() { grep -v -E '^(time|pid|took)' "$1" | sed -E 's/0x[0-9a-f]{8,}/ADDR/g'; }

rc=0
run_one() { # prog way
    local p=$1 way=$2 cmd
    case $p in
        nccl) cmd=(python3 tests/clients/nccl_prog.py) ;;
        *) cmd=(python3 "tests/clients/${p}_prog.py") ;;
    esac
    case $way in
        native) timeout "$T" "${cmd[@]}" > "$LOG/$p.$way.txt" 2> "$LOG/$p.$way.err" ;;
        preload) LD_PRELOAD=$BIN/libomps_shim.so OMPS_TRACE=${CLIENT_TRACE:-0} timeout "$T" "${cmd[@]}" > "$LOG/$p.$way.txt" 2> "$LOG/$p.$way.err" ;;
        libpath) LD_LIBRARY_PATH=$LIBDIR:${LD_LIBRARY_PATH:-} timeout "$T" "${cmd[@]}" > "$LOG/$p.$way.txt" 2> "$LOG/$p.$way.err" ;;
    esac
    echo $?
}
for p in "${progs[@]}"; do
    if [ "$p" = nccl ] && [ "$(nvidia-smi -L | wc -l)" -lt 2 ]; then echo "nccl: SKIP (needs two GPUs)"; continue; fi
    nrc=$(run_one "$p" native)
    if [ "$nrc" != 0 ]; then echo "$p: native FAILED (rc $nrc): $(tail -n 3 "$LOG/$p.native.err" | tr '\n' ' ')"; rc=1; continue; fi
    # A second native run: a program whose output differs from itself natively cannot be
    # compared line for line, and says so.
    cp "$LOG/$p.native.txt" "$LOG/$p.native1.txt"
    if [ "$(run_one "$p" native)" = 0 ] && ! diff <(norm "$LOG/$p.native1.txt") <(norm "$LOG/$p.native.txt") > "$LOG/$p.native.diff"; then
        echo "$p: native runs differ from each other: $(head -c 300 "$LOG/$p.native.diff")"; rc=1
    fi
    for way in preload libpath; do
        wrc=$(run_one "$p" $way)
        if [ "$wrc" = 0 ] && diff <(norm "$LOG/$p.native.txt") <(norm "$LOG/$p.$way.txt") > "$LOG/$p.$way.diff"; then
            echo "$p $way: PASS ($(wc -l < "$LOG/$p.native.txt") lines as native)"
        else
            echo "$p $way: FAIL (rc $wrc): $(head -c 600 "$LOG/$p.$way.diff") $(tail -n 4 "$LOG/$p.$way.err" | tr '\n' ' ')"; rc=1
        fi
    done
done
timeout 10 "$BIN/omps-ctl" quit > /dev/null 2>&1; wait_server "$SPID"
tar czf "$OUT/clients-logs.tgz" -C "$OUT" clients 2>/dev/null
exit $rc
