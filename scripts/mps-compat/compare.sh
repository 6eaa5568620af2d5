#!/usr/bin/env bash
# Runs operator.sh, unchanged, against NVIDIA MPS and against omps (omps-ctl installed as
# nvidia-cuda-mps-control, the shim as libcuda.so.1 first on the library path), and
# compares what it printed. PIDs differ between runs and are replaced by "PID".
#   OMPS_BIN=target/release bash scripts/mps-compat/compare.sh [WORKDIR]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
B=$(cd "${OMPS_BIN:-target/release}" && pwd)
W=${1:-/tmp/omps-mps-compat}
MPS_BIN=${MPS_BIN:-/usr/local/nvidia/bin}
rm -rf "$W"; mkdir -p "$W"
nvcc -O2 -o "$W/limit_client" "$HERE/limit_client.cu" || exit 1

run() { # name: runs operator.sh with that control program
    local name=$1 d="$W/$1"
    mkdir -p "$d/pipe" "$d/log" "$d/bin"
    case "$name" in
        mps) ln -s "$MPS_BIN/nvidia-cuda-mps-control" "$d/bin/nvidia-cuda-mps-control"
             [ -e "$MPS_BIN/nvidia-cuda-mps-server" ] && ln -s "$MPS_BIN/nvidia-cuda-mps-server" "$d/bin/" ;;
        omps) ln -s "$B/omps-ctl" "$d/bin/nvidia-cuda-mps-control"
              ln -s "$B/omps-server" "$d/bin/omps-server"
              mkdir -p "$d/lib"; ln -s "$B/libomps_shim.so" "$d/lib/libcuda.so.1" ;;
    esac
    local libpath=${LD_LIBRARY_PATH:-}
    [ "$name" = omps ] && libpath="$d/lib${libpath:+:$libpath}"
    ( cd "$d" && PATH="$d/bin:$PATH" LD_LIBRARY_PATH="$libpath" CUDA_MPS_PIPE_DIRECTORY="$d/pipe" \
        CUDA_MPS_LOG_DIRECTORY="$d/log" CLIENT="$W/limit_client" \
        timeout 120 bash "$HERE/operator.sh" > "$d/out.txt" 2>&1 )
    # Whatever the script left running is stopped.
    CUDA_MPS_PIPE_DIRECTORY="$d/pipe" timeout 10 "$d/bin/nvidia-cuda-mps-control" <<< quit > /dev/null 2>&1
    sed -E 's/\b[0-9]{3,7}\b/PID/g' "$d/out.txt" > "$d/normalized.txt"
}

run mps
run omps
echo "=== NVIDIA MPS"; cat "$W/mps/out.txt"
echo "=== omps"; cat "$W/omps/out.txt"
echo "=== control.log (omps), last lines"; tail -n 12 "$W/omps/log/control.log" 2>/dev/null
if diff -u "$W/mps/normalized.txt" "$W/omps/normalized.txt" > "$W/diff.txt"; then
    echo "mps-compat: PASS (the same output, PIDs aside)"
else
    echo "mps-compat: DIFFERENT:"; cat "$W/diff.txt"; exit 1
fi
