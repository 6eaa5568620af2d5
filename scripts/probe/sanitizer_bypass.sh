#!/usr/bin/env bash
# compute-sanitizer through omps (issue 26): a program with an out-of-bounds write, run
# under compute-sanitizer's memcheck natively and with the shim preloaded (and a server
# running). The shim must step aside (one line on stderr) and memcheck report the same
# errors as natively. Writes $OUT/sanitizer.txt; exit status 0 when the reports match.
#
#   OMPS_BIN=target/release OUT=/tmp/x bash scripts/probe/sanitizer_bypass.sh
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${OMPS_BIN:-target/release}")
OUT=${OUT:-/tmp/omps-sanitizer}; mkdir -p "$OUT"
W=$(mktemp -d /tmp/omps-san.XXXXXX)
export CUDA_MPS_PIPE_DIRECTORY=$W/pipe CUDA_MPS_LOG_DIRECTORY=$W/log
mkdir -p "$W/log"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
cat > "$W/oob.cu" <<'CU'
#include <cstdio>
__global__ void oob(int *a, int n) { int i = threadIdx.x; a[i + n] = i; }
int main() {
    int *a; cudaMalloc(&a, 32 * sizeof(int));
    oob<<<1, 4>>>(a, 32);
    cudaError_t e = cudaDeviceSynchronize();
    printf("sync: %s\n", cudaGetErrorName(e));
    return 0;
}
CU
timeout 60 nvcc -arch=sm_90 -lineinfo -o "$W/oob" "$W/oob.cu" || { echo "nvcc failed" > "$OUT/sanitizer.txt"; exit 1; }
timeout 60 "$SAN" --tool memcheck "$W/oob" > "$W/native.txt" 2>&1
timeout 20 "$BIN/omps-ctl" -d
LD_PRELOAD=$BIN/libomps_shim.so timeout 60 "$SAN" --tool memcheck "$W/oob" > "$W/omps.txt" 2>&1
timeout 20 "$BIN/omps-ctl" quit > /dev/null 2>&1
# Addresses, PIDs and timings differ between runs; the errors, kernels and lines must not.
mask() { grep -v '^omps:' "$1" | sed -E 's/0x[0-9a-f]+/0xADDR/g; s/=+ *[0-9]+=+/=PID=/g; s/\(pid [0-9]+\)//g'; }
{
    echo "--- native"; cat "$W/native.txt"
    echo "--- through omps (LD_PRELOAD)"; cat "$W/omps.txt"
    echo "--- shim lines: $(grep -c '^omps:' "$W/omps.txt")"
    if diff <(mask "$W/native.txt") <(mask "$W/omps.txt") > "$W/diff.txt"; then
        echo "memcheck reports: the same"
    else
        echo "memcheck reports: DIFFER"; cat "$W/diff.txt"
    fi
} > "$OUT/sanitizer.txt"
cat "$OUT/sanitizer.txt"
grep -q "reports: the same" "$OUT/sanitizer.txt" && [ "$(grep -c '^omps:' "$W/omps.txt")" = 1 ]
rc=$?
rm -rf "$W"
exit $rc
