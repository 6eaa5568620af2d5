#!/usr/bin/env bash
# End-to-end test of omps on a GPU machine: runs the pytest harness of tests/gpu, which
# tests/gpu/README.md describes (what runs in which order, and how to add a program or a
# measure). This wrapper stays so that scripts/gpu-verify.sh and the docs keep one command.
#
#   bash scripts/gpu-e2e.sh [--native-only] [--reps N] [--no-rt | --rt-only]
#                           [--serving | --serving-only] [PYTEST ARGS...]
#
# On a machine with an NVIDIA GPU, nvcc, python3 with pytest and (for the MPS columns)
# nvidia-cuda-mps-control, the omps binaries prebuilt in target/release/ (or $OMPS_BIN):
# builds tests/cuda and tests/cuda/rt with nvcc into ${BUILD:-/tmp/omps-e2e}, then, in one
# run: every driver-API program natively and under omps (LD_PRELOAD), every runtime-API
# program natively and under omps both ways in (LD_PRELOAD; LD_LIBRARY_PATH to a
# libcuda.so.1 -> shim directory), kernel_fault and device_assert last (the server must be
# ACTIVE again by itself within 10 s after each), device printf beside 2 bench_overhead;
# spin_concurrency N = 1, 4, 8 and the overhead benchmark natively, under NVIDIA MPS and
# under omps (median of --reps runs, default 3); kill -9 of one client of eight; ring_vandal
# beside 4 clients. --no-rt skips the runtime-API programs and the benchmark, --rt-only
# runs only those; --native-only (or missing omps binaries) skips the omps columns.
# The serving benchmark (issue 25: PyTorch replicas under Poisson traffic, ~6 minutes) is
# opt-in: --serving adds it, --serving-only runs it alone (tests/gpu/README.md).
# Logs go to ${OUT:-/tmp/omps-e2e/out}: e2e.log, build.log, server.log, mps.log, bench.txt
# and table.txt (the summary, also printed last). Unlike `pytest tests/gpu`, nothing is
# skipped for want of nvcc or a GPU (--gpu-required). Exit status: 0 if every test that
# ran passed, 1 otherwise, 2 for a usage error.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        --reps) [ $# -ge 2 ] || { echo "--reps needs a value" >&2; exit 2; }; args+=("$1" "$2"); shift ;;
        *) args+=("$1") ;;
    esac
    shift
done
python3 -c 'import pytest' 2>/dev/null || { echo "gpu-e2e: python3 has no pytest (pip install pytest)" >&2; exit 2; }
python3 -m pytest -q -s -rfEsxX --tb=short tests/gpu --gpu-required "${args[@]}"
rc=$?
case $rc in 0) exit 0 ;; 4) exit 2 ;; *) exit 1 ;; esac
