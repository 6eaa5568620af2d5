#!/usr/bin/env bash
# The CUPTI numbers the shim writes against CUDA's own headers (issue 26): builds a C
# program from the names `target/release/examples/cupti_abi` prints (sizeof, offsetof,
# enum values), runs both, and diffs. Writes $OUT/cupti-layout.txt; exit status 0 when
# every number matches.
#
#   OMPS_BIN=target/release OUT=/tmp/x bash scripts/probe/cupti_layout.sh
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${OMPS_BIN:-target/release}")
OUT=${OUT:-/tmp/omps-cupti-layout}; mkdir -p "$OUT"
W=$(mktemp -d /tmp/omps-cupti-layout.XXXXXX)
report=$OUT/cupti-layout.txt; : > "$report"
. scripts/probe/cupti_paths.sh
inc=$CUPTI_INC
echo "CUPTI headers: ${inc:-none}" | tee -a "$report"
[ -n "$inc" ] || exit 1
"$BIN/examples/cupti_abi" > "$W/omps.txt"
{
    echo '#include <cupti.h>'
    echo '#include <stddef.h>'
    echo '#include <stdio.h>'
    echo 'int main(void) {'
    # A line is a name (one word, or `sizeof TYPE`) and its number.
    while read -r line; do
        name=${line% *}
        case $name in
            sizeof*) echo "  printf(\"$name %zu\\n\", sizeof(${name#sizeof }));" ;;
            kernel.*) echo "  printf(\"$name %zu\\n\", offsetof(CUpti_ActivityKernel10, ${name#*.}));" ;;
            memcpy.*) echo "  printf(\"$name %zu\\n\", offsetof(CUpti_ActivityMemcpy6, ${name#*.}));" ;;
            memset.*) echo "  printf(\"$name %zu\\n\", offsetof(CUpti_ActivityMemset4, ${name#*.}));" ;;
            api.*) echo "  printf(\"$name %zu\\n\", offsetof(CUpti_ActivityAPI, ${name#*.}));" ;;
            sync.*) echo "  printf(\"$name %zu\\n\", offsetof(CUpti_ActivitySynchronization2, ${name#*.}));" ;;
            external.*) echo "  printf(\"$name %zu\\n\", offsetof(CUpti_ActivityExternalCorrelation, ${name#*.}));" ;;
            *) echo "  printf(\"$name %zu\\n\", (size_t)$name);" ;;
        esac
    done < "$W/omps.txt"
    echo '  return 0; }'
} > "$W/layout.c"
cuda=$(dirname "$(dirname "$(command -v nvcc)")")/include
timeout 60 gcc -I"$inc" -I"$cuda" -o "$W/layout" "$W/layout.c" >> "$report" 2>&1 || { echo "build failed" | tee -a "$report"; exit 1; }
"$W/layout" > "$W/cuda.txt"
if diff "$W/cuda.txt" "$W/omps.txt" >> "$report"; then
    echo "layout: all $(wc -l < "$W/omps.txt") numbers match CUDA's headers" | tee -a "$report"
else
    echo "layout: DIFFERS (< CUDA's headers, > omps)" | tee -a "$report"; exit 1
fi
