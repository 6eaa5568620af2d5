#!/bin/bash
# Does freed memory come back to the GPU while clients run? 1, 4, then 7 vector_add
# clients, each allocating and freeing 3 x 4 MiB per loop; every 0.5 s the clients'
# counted allocations (omps-ctl status) beside the GPU's used memory (nvidia-smi).
# Run from the repository root on the GPU machine, after scripts/build-release.sh.
export PATH=/usr/local/cuda/bin:$PATH
B=$PWD/target/release; W=/tmp/mg; mkdir -p $W
timeout 120 nvcc -O2 -fatbin -gencode arch=compute_90,code=[sm_90,compute_90] -o $W/vector_add.fatbin tests/cuda/vector_add_kernel.cu 2>&1 | tail -2
timeout 120 nvcc -cudart none -O2 -std=c++17 -Itests/cuda -o $W/vector_add tests/cuda/vector_add.cpp -L/usr/local/cuda/lib64/stubs -lcuda 2>&1 | tail -2
export OMPS_PIPE_DIRECTORY=$W/pipe; mkdir -p $OMPS_PIPE_DIRECTORY
RUST_LOG=info timeout 200 $B/omps-server > $W/server.log 2>&1 &
SP=$!
sleep 2
for n in 1 4 7; do
  pids=()
  for i in $(seq $n); do LD_PRELOAD=$B/libomps_shim.so timeout 60 $W/vector_add $W/vector_add.fatbin --loops 871 > $W/va.$n.$i 2>&1 & pids+=($!); done
  for t in $(seq 30); do sleep 0.5; echo "n=$n t=$t $(timeout 5 $B/omps-ctl status | grep -o "allocations [0-9]* MiB") gpu used $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"; if ! kill -0 ${pids[@]} 2>/dev/null; then break; fi; done
  wait ${pids[@]}; tail -n1 $W/va.$n.*
done
timeout 10 $B/omps-ctl stats | head -40
timeout 10 $B/omps-ctl quit; wait $SP
grep -v "client connected\|client gone" $W/server.log | tail -20
