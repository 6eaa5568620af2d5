#!/bin/bash
# usage: one.sh CMD...  runs CMD natively and through omps (preload), prints both
B=$PWD/target/release; W=/tmp/one; rm -rf $W; mkdir -p $W/pipe
export OMPS_PIPE_DIRECTORY=$W/pipe
timeout 120 $B/omps-server > $W/server.log 2>&1 & SP=$!
sleep 1
echo "--- native"; timeout 60 "$@"; echo "rc=$?"
echo "--- omps"; OMPS_TRACE=1 LD_PRELOAD=$B/libomps_shim.so timeout 60 "$@" 2>$W/err; echo "rc=$?"; grep returned $W/err | head
timeout 10 $B/omps-ctl quit; wait $SP
