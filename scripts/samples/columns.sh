#!/usr/bin/env bash
# NVIDIA's cuda-samples natively, through omps both ways in, and under NVIDIA MPS: the
# runner of ../shared/tools/cuda-samples (run.sh, which knows native and LD_PRELOAD) run
# once per column, with stand-ins in place of the omps folder it is given:
#   preload  the omps binaries themselves;
#   libpath  LD_LIBRARY_PATH names a folder whose libcuda.so.1 is the shim; run.sh's
#            LD_PRELOAD gets libc (a no-op), and the server is started without the path;
#   mps      nvidia-cuda-mps-control's daemon on the same pipe directory; samples get
#            CUDA_MPS_PIPE_DIRECTORY, and LD_PRELOAD libc again.
# Run from the repository root on the GPU machine, after the runner's build.sh:
#   SAMPLES=target/cuda-samples bash scripts/samples/columns.sh "preload libpath mps" NAME...
# Writes $OUT/samples-columns.txt (each column's table and summary, then the verdicts side
# by side) and $OUT/samples-logs.tgz (every run's output and the servers' logs).
set -u
S=${SAMPLES:-target/cuda-samples}
BIN=$(readlink -f "${OMPS_BIN:-target/release}")
OUT=${OUT:-/tmp/omps-samples}; mkdir -p "$OUT"
cols=$1; shift
WORK=/tmp/samples-columns; rm -rf "$WORK"; mkdir -p "$WORK"
MPSCTL=${MPS_CONTROL:-/usr/local/nvidia/bin/nvidia-cuda-mps-control}
LIBC=$(ldconfig -p | awk '/libc.so.6 .*x86-64/ {print $NF; exit}')
deadline=${COLUMNS_DEADLINE:-540}

# The native column first: every other column reuses its results.
SAMPLES_OUTDIR=$WORK/native SAMPLES_MODES=native OUT=$WORK/native \
    SAMPLES_DEADLINE=$((deadline - SECONDS)) bash "$S/run.sh" "$BIN" "$@" > "$WORK/native.log" 2>&1
for c in $cols; do
    left=$((deadline - SECONDS)); [ $left -gt 20 ] || { echo "$c: no time left" >> "$WORK/skipped"; continue; }
    d=$WORK/$c; mkdir -p "$d/omps"; cp "$WORK/native/native-results.tsv" "$d/"
    for n in "$@"; do cp "$WORK/native/$n.native.txt" "$d/" 2>/dev/null; done
    envs=()
    case $c in
        preload) ln -s "$BIN"/{omps-server,omps-ctl,libomps_shim.so} "$d/omps/" ;;
        libpath)
            mkdir -p "$d/lib"; ln -s "$BIN/libomps_shim.so" "$d/lib/libcuda.so.1"; ln -s "$BIN/libomps_shim.so" "$d/lib/libcuda.so"
            printf '#!/bin/sh\nexec env -u LD_LIBRARY_PATH %q "$@"\n' "$BIN/omps-server" > "$d/omps/omps-server"
            ln -s "$BIN/omps-ctl" "$d/omps/"; ln -s "$LIBC" "$d/omps/libomps_shim.so"
            envs=(LD_LIBRARY_PATH="$d/lib:${LD_LIBRARY_PATH:-}") ;;
        mps)
            # The daemon runs while this stand-in does; run.sh stops it with omps-ctl quit.
            cat > "$d/omps/omps-server" <<EOS
#!/bin/sh
export CUDA_MPS_PIPE_DIRECTORY=\$OMPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY=\$OMPS_LOG_DIRECTORY
$MPSCTL -d || exit 1
trap 'echo quit | $MPSCTL; exit 0' TERM INT
while pgrep -f nvidia-cuda-mps-control > /dev/null; do sleep 0.3; done
EOS
            cat > "$d/omps/omps-ctl" <<EOS
#!/bin/sh
export CUDA_MPS_PIPE_DIRECTORY=\$OMPS_PIPE_DIRECTORY
case "\$1" in quit) echo quit | $MPSCTL ;; *) echo get_server_list | $MPSCTL ;; esac
EOS
            ln -s "$LIBC" "$d/omps/libomps_shim.so"
            envs=(CUDA_MPS_PIPE_DIRECTORY=/tmp/omps-samples-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/omps-samples-log) ;;
        *) echo "unknown column $c" >&2; continue ;;
    esac
    chmod +x "$d/omps/"* 2>/dev/null
    env "${envs[@]}" SAMPLES_OUTDIR="$d" SAMPLES_MODES=omps OUT="$d" SAMPLES_DEADLINE=$left \
        bash "$S/run.sh" "$d/omps" "$@" > "$WORK/$c.log" 2>&1
done
{
    for c in native $cols; do
        echo "================ column $c"; cat "$WORK/$c/samples-table.txt" 2>/dev/null | tail -n 12
    done
    cat "$WORK/skipped" 2>/dev/null
    echo "================ verdicts (omps-fails and others, per column)"
    for c in $cols; do
        echo "---- $c: $(grep -c ' same ' "$WORK/$c/samples-table.txt" 2>/dev/null) same"
        grep -E 'omps-fails|native-fails|not-run' "$WORK/$c/samples-table.txt" 2>/dev/null
    done
} > "$OUT/samples-columns.txt"
for c in $cols; do cp "$WORK/$c/samples-table.txt" "$OUT/table-$c.txt" 2>/dev/null; done
tar czf "$OUT/samples-logs.tgz" -C "$WORK" . 2>/dev/null
cat "$OUT/samples-columns.txt"
