#!/bin/bash
# Runs one Python file through omps (preload) with OMPS_TRACE=1 and prints the shim's
# trace lines (entry points asked for, calls that failed and where) after its output.
# Usage, from the repository root on the GPU machine: scripts/probe/torch_trace.sh FILE.py [ARGS]
B=$PWD/target/release; W=/tmp/tt; mkdir -p $W
export OMPS_PIPE_DIRECTORY=$W/pipe; mkdir -p $OMPS_PIPE_DIRECTORY
RUST_LOG=info timeout 300 $B/omps-server > $W/server.log 2>&1 &
SP=$!
sleep 1
OMPS_TRACE=1 LD_PRELOAD=$B/libomps_shim.so timeout ${PROBE_TIMEOUT:-240} python3 "$@" > $W/out.txt 2> $W/err.txt
echo "rc=$?"
tail -n 15 $W/out.txt
grep -v "^omps trace" $W/err.txt | tail -n 25
echo "--- failed calls"
grep "returned" $W/err.txt | sort | uniq -c | sort -rn | head -40
timeout 10 $B/omps-ctl quit; wait $SP
grep -iE "warn|error|malformed" $W/server.log | tail -n 15
