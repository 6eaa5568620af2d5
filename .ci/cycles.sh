#!/usr/bin/env bash
# No source file of any crate imports itself through others (issue 24): any circle fails.
# The self-test adds one import to a copy of two crates and requires the check to find the
# circle, so a check that can never fail is caught.
set -euo pipefail
cd "$(dirname "$0")/.."
crates=(omps-ring/src omps-server/src omps-shim/src omps-ctl/src)
python3 scripts/check-import-cycles.py "${crates[@]}"
python3 scripts/check-import-cycles.py --self-test omps-ring/src omps-ctl/src
