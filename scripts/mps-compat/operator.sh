#!/usr/bin/env bash
# An operator's script written for NVIDIA MPS, as such scripts are written: start the
# daemon, set limits, run clients, look at them, quit. compare.sh runs it unchanged
# against nvidia-cuda-mps-control and against omps-ctl (installed under that name).
# Expects CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY and CLIENT (a CUDA program).
set -u
nvidia-cuda-mps-control -d
echo "rc -d: $?"
echo set_default_device_pinned_mem_limit 0 2G | nvidia-cuda-mps-control
echo get_default_device_pinned_mem_limit 0 | nvidia-cuda-mps-control
echo set_default_active_thread_percentage 50 | nvidia-cuda-mps-control
echo get_default_active_thread_percentage | nvidia-cuda-mps-control
"$CLIENT" hold > client1.out 2>&1 &
c1=$!
"$CLIENT" hold > client2.out 2>&1 &
c2=$!
sleep 3
server=$(echo get_server_list | nvidia-cuda-mps-control)
echo "servers: $(echo "$server" | wc -l)"
echo "get_server_status $server" | nvidia-cuda-mps-control
echo "clients: $(echo "get_client_list $server" | nvidia-cuda-mps-control | wc -w)"
echo "ps header: $(echo ps | nvidia-cuda-mps-control | head -n 1 | cut -d' ' -f1-6)"
echo "ps rows: $(echo ps | nvidia-cuda-mps-control | tail -n +2 | wc -l)"
echo "get_device_pinned_mem_limit $server 0" | nvidia-cuda-mps-control
echo "get_active_thread_percentage $server" | nvidia-cuda-mps-control
wait $c1 $c2
echo "client 1: $(cat client1.out)"
echo "client 2: $(cat client2.out)"
echo quit | nvidia-cuda-mps-control
echo "rc quit: $?"
sleep 1
echo get_server_list | nvidia-cuda-mps-control > /dev/null 2>&1
echo "rc after quit: $?"
