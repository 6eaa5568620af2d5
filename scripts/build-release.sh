#!/usr/bin/env bash
# Builds what the GPU machine needs (it has no cargo): the server, omps-ctl, the shim and
# the ring_vandal example, into target/release/.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace
cargo build --release -p omps-shim --example ring_vandal --example cupti_abi
ls -l target/release/omps-server target/release/omps-ctl target/release/libomps_shim.so target/release/examples/ring_vandal target/release/examples/cupti_abi
