#!/usr/bin/env bash
# Quick check on the GPU machine: builds the named driver-API programs of tests/cuda and
# runs each natively and through omps (LD_PRELOAD), diffing the outputs. For a full run
# use scripts/gpu-e2e.sh; this is for iterating on a few programs in one short call.
# Usage: scripts/probe/compare-programs.sh PROGRAM...   (omps binaries in target/release)
set -u
R=$PWD/target/release; SRC=tests/cuda; BIN=$(mktemp -d /tmp/cmp-bin.XXXX)
CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
libs="-L$CUDA_HOME/lib64/stubs -L$CUDA_HOME/targets/x86_64-linux/lib/stubs -lcuda"
pipe=$(mktemp -d /tmp/cmp-pipe.XXXX); chmod 700 "$pipe"
OMPS_PIPE_DIRECTORY=$pipe OMPS_LOG_DIRECTORY=$pipe "$R/omps-server" >"$pipe/server.out" 2>&1 &
spid=$!
fails=0
for p in "$@"; do
    # shellcheck disable=SC2086
    nvcc -cudart none -O2 -std=c++17 -I"$SRC" -o "$BIN/$p" "$SRC/$p.cpp" $libs || { echo "BUILD FAILED $p"; fails=1; continue; }
    timeout 60 "$BIN/$p" >"$BIN/$p.native" 2>&1; nrc=$?
    OMPS_PIPE_DIRECTORY=$pipe LD_PRELOAD=$R/libomps_shim.so timeout 60 "$BIN/$p" >"$BIN/$p.omps" 2>&1; orc=$?
    if [ $nrc -eq 0 ] && [ $orc -eq 0 ] && cmp -s "$BIN/$p.native" "$BIN/$p.omps"; then
        echo "PASS $p (native and omps identical, $(wc -l <"$BIN/$p.native") lines)"
    else
        fails=1; echo "FAIL $p native rc=$nrc omps rc=$orc"; diff "$BIN/$p.native" "$BIN/$p.omps" | head -30
    fi
done
OMPS_PIPE_DIRECTORY=$pipe timeout 10 "$R/omps-ctl" quit >/dev/null; timeout 10 tail --pid=$spid -f /dev/null
grep -iE 'warn|error' "$pipe/server.log" 2>/dev/null | head -5
exit $fails
