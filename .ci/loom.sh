#!/usr/bin/env bash
# Model-checks the ring's memory ordering (omps-ring/tests/loom_ring.rs) with loom.
# Its own target dir: `--cfg loom` rebuilds every crate, and sharing ../target would
# throw away the normal build each time.
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTFLAGS="${RUSTFLAGS:-} --cfg loom" \
  CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target/loom}" \
  cargo test -p omps-ring --test loom_ring --release "$@"
