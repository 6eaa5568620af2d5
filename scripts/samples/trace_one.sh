#!/usr/bin/env bash
# One cuda-sample through omps with OMPS_TRACE=1 on a server of its own: what it asked
# for and which calls failed (the driver's resolve lines left out).
#   bash scripts/samples/trace_one.sh NAME [ARGS...]    (after the runner's build.sh)
set -u
S=$(readlink -f "${SAMPLES:-target/cuda-samples}"); BIN=$(readlink -f "${OMPS_BIN:-target/release}")
n=$1; shift
P=$(mktemp -d /tmp/omps-trace-pipe.XXXX)
OMPS_PIPE_DIRECTORY=$P OMPS_LOG_DIRECTORY=$P "$BIN/omps-server" > "$P/server.out" 2>&1 &
SP=$!
for _ in $(seq 100); do [ -S "$P/omps.sock" ] && break; sleep 0.1; done
(cd "$S/bin/$n" && OMPS_PIPE_DIRECTORY=$P OMPS_TRACE=1 LD_PRELOAD=$BIN/libomps_shim.so timeout 60 "./$n" "$@") 2>&1 \
    | grep -v 'omps trace: resolve\|cuGetExportTable' | tail -n 60
echo "---- server log"; grep -iE 'warn|error|refus' "$P/server.log" | tail -n 20
OMPS_PIPE_DIRECTORY=$P timeout 10 "$BIN/omps-ctl" quit > /dev/null 2>&1
( sleep 15; kill -9 $SP 2>/dev/null ) & k=$!; wait $SP; kill $k 2>/dev/null
