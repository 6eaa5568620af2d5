#!/usr/bin/env bash
# Device printf from compressed fatbins (as PyTorch's kernels ship): rt/device_printf built
# with -Xfatbin -compress-all, two copies through omps at once. Each must print exactly
# what it prints natively; while compressed code could not be looked into, neither copy
# could be told its text (it went to the server log).
set -u
R=$PWD/target/release; B=$(mktemp -d /tmp/pfc.XXXX)
nvcc -arch=sm_90 -Xfatbin -compress-all -o "$B/dp" tests/cuda/rt/device_printf.cu || exit 1
cuobjdump -lelf "$B/dp" | head -3
timeout 30 "$B/dp" >"$B/native" 2>&1 || echo "native rc=$?"
pipe=$(mktemp -d /tmp/pfc-pipe.XXXX); chmod 700 "$pipe"
OMPS_PIPE_DIRECTORY=$pipe OMPS_LOG_DIRECTORY=$pipe "$R/omps-server" >/dev/null 2>&1 & sp=$!
sleep 1
for i in 1 2; do OMPS_PIPE_DIRECTORY=$pipe LD_PRELOAD=$R/libomps_shim.so timeout 30 "$B/dp" >"$B/omps$i" 2>"$B/err$i" & eval p$i=\$!; done
wait "$p1"; r1=$?; wait "$p2"; r2=$?
for i in 1 2; do
    if cmp -s "$B/native" "$B/omps$i"; then echo "copy $i: PASS (same as native, $(grep -c device: "$B/native") device lines)"
    else echo "copy $i: FAIL"; diff "$B/native" "$B/omps$i" | head -8; fi
done
echo "rc $r1 $r2"
OMPS_PIPE_DIRECTORY=$pipe timeout 10 "$R/omps-ctl" status | grep -i printf
OMPS_PIPE_DIRECTORY=$pipe timeout 10 "$R/omps-ctl" quit >/dev/null; timeout 10 tail --pid=$sp -f /dev/null
