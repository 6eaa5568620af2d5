#!/usr/bin/env bash
# The PyTorch part of the GPU test, on a machine with a GPU, PyTorch and (for the MPS
# column) nvidia-cuda-mps-control; the omps binaries prebuilt in target/release/.
#
#   bash scripts/gpu-torch.sh [suite] [bench]      (both when none is named)
#
# suite: tests/torch (pytest): every workload natively and through omps, both through
#        LD_PRELOAD and through LD_LIBRARY_PATH, compared bit for bit where the same
#        algorithms run; two processes sharing the GPU; a process killed mid-inference.
#        Each way takes 4-5 minutes on an H100 (TORCH_SUITE_WAYS picks them).
# bench: scripts/bench/infer-bench.sh: N = 1, 4, 8 ResNet-50 and N = 1, 8 decoder
#        processes natively, under NVIDIA MPS and under omps (about 5 minutes).
# Results go to ${OUT:-/tmp/omps-torch}: suite.txt, results.tsv, and the benchmark's files.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/omps-torch}; mkdir -p "$OUT"
what=("$@"); [ ${#what[@]} -eq 0 ] && what=(suite bench)
rc=0
for w in "${what[@]}"; do
    case "$w" in
        suite)
            OMPS_BIN=${OMPS_BIN:-target/release} TORCH_SUITE_OUT=${TORCH_SUITE_OUT:-/tmp/omps-torch-suite} \
                python3 -m pytest -q -p no:cacheprovider -rfEsxX --tb=short tests/torch \
                | tee "$OUT/suite.txt"
            [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
            cp "${TORCH_SUITE_OUT:-/tmp/omps-torch-suite}/results.tsv" "$OUT/" 2>/dev/null ;;
        bench)
            OUT="$OUT" bash scripts/bench/infer-bench.sh || rc=1 ;;
        *) echo "unknown part: $w (suite or bench)" >&2; exit 2 ;;
    esac
done
exit $rc
