#!/usr/bin/env bash
# End-to-end test of omps on a GPU machine.
#
#   bash scripts/gpu-e2e.sh [--native-only] [--reps N] [--no-rt | --rt-only]
#
# Run from anywhere inside the repository, on a machine with an NVIDIA GPU,
# nvcc and (for the MPS column) nvidia-cuda-mps-control. It
#   0. builds the driver-API test programs of tests/cuda/ with nvcc into
#      ${BUILD:-/tmp/omps-e2e}/bin (host code with -cudart none, kernels as
#      fatbin/cubin/PTX images loaded at run time), and the runtime-API
#      programs of tests/cuda/rt/ into $BUILD/rt with nvcc's default flags
#      (static cudart) plus -arch=sm_90 (dyn_parallel: + -rdc=true -lcudadevrt); per_thread_stream alone is built
#      with --default-stream per-thread;
#   1. correctness: runs each program natively and under omps
#      (LD_PRELOAD=libomps_shim.so) and diffs the outputs;
#   6. runtime API: runs each tests/cuda/rt program natively and under omps
#      two ways, (a) LD_PRELOAD=libomps_shim.so and (b) no preload but
#      LD_LIBRARY_PATH=$OMPS_LIBDIR, a temporary directory in which
#      libcuda.so.1 and libcuda.so are symlinks to libomps_shim.so, so that
#      cudart's dlopen("libcuda.so.1") finds the shim; diffs both against
#      native. kernel_fault and device_assert run last; after each of their omps
#      runs the server must be ACTIVE again by itself within 10 s (else it is
#      restarted and the run fails);
#  6b. device printf beside others: rt/device_printf under omps while 2
#      bench_overhead clients run beside it; its output must match native;
#   2. concurrency: N = 1, 4, 8 copies of spin_concurrency started at one
#      instant, natively (time-slicing), under NVIDIA MPS and under omps;
#      makespan = max(end) - min(start), median of --reps runs (default 3);
#   7. overhead benchmark: tests/cuda/rt/bench_overhead --reps times each
#      natively, under NVIDIA MPS and under omps (preload), median of each
#      figure; table in bench.txt (see docs/benchmarks.md);
#   3. kill -9: 7 vector_add survivors + 1 hold_memory victim under omps; the
#      victim is SIGKILLed, `omps-ctl ps` must drop it within 1 s, and the
#      survivors must pass;
#   4. vandal: ring_vandal scribbles on its ring while 4 vector_add run; the
#      server must disconnect it and keep serving the others;
#   5. stops the server and prints the end of its log.
# The PyTorch suite and the inference benchmark are scripts/gpu-torch.sh.
# --no-rt skips 6, 6b and 7 (and the runtime-API build); --rt-only runs only the
# runtime-API build, 6, 6b and 7.
# The omps binaries are expected prebuilt in target/release/ (omps-server,
# omps-ctl, libomps_shim.so, examples/ring_vandal). With --native-only, or
# when they are missing, the omps columns are skipped (and said so).
#
# Logs go to ${OUT:-/tmp/omps-e2e/out}: e2e.log (everything printed here),
# build.log, server.log, mps.log, bench.txt (the benchmark table) and
# table.txt (the summary, also printed last). Exit status: 0 if every test
# that ran passed, 1 otherwise.
set -u

NATIVE_ONLY=0
REPS=3
RT=1          # runtime-API section and benchmark
RT_ONLY=0     # only the runtime-API build, section and benchmark
while [ $# -gt 0 ]; do
    case "$1" in
        --native-only) NATIVE_ONLY=1 ;;
        --reps) REPS=${2:?--reps needs a value}; shift ;;
        --no-rt) RT=0 ;;
        --rt-only) RT_ONLY=1 ;;
        -h|--help) sed -n '2,46p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (try --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$RT" -eq 0 ] && [ "$RT_ONLY" -eq 1 ]; then echo "--no-rt and --rt-only exclude each other" >&2; exit 2; fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
BUILD=${BUILD:-/tmp/omps-e2e}
OUT=${OUT:-/tmp/omps-e2e/out}
BIN="$BUILD/bin"
RTBIN="$BUILD/rt"
WORK="$BUILD/work"
SRC="$ROOT/tests/cuda"
RTSRC="$SRC/rt"
mkdir -p "$BIN" "$RTBIN" "$OUT" || exit 2
rm -rf "$WORK"
mkdir -p "$WORK" || exit 2

OMPS_SERVER="$ROOT/target/release/omps-server"
OMPS_CTL="$ROOT/target/release/omps-ctl"
OMPS_SHIM="$ROOT/target/release/libomps_shim.so"
OMPS_VANDAL="$ROOT/target/release/examples/ring_vandal"

PROG_TIMEOUT=${PROG_TIMEOUT:-180}      # seconds for one test program
CORRECTNESS_PROGS="vector_add kernel_args memcpy_roundtrip streams_events module_globals dyn_shared tensor_maps vmm_and_pools"
CONC_NS="1 4 8"
START_LEAD_NS=3000000000               # copies start together 3 s after launch
KILL_SURVIVORS=7
VANDAL_SURVIVORS=4
# runtime-API programs (tests/cuda/rt/*.cu), in the order they run; kernel_fault and
# device_assert must stay last: each ends the omps server's context
RT_PROGS="device_props error_names vector_add memset memcpy2d3d memcpy_default pointer_attrs
          streams events async_copy pinned mapped host_register atomics dyn_shared symbols
          coop_grid_sync callbacks templates threads no_free stream_priority per_thread_stream
          legacy_stream device_sync device_printf func_attrs occupancy launch_ex invalid_launch
          host_func_order graph_capture graph_manual graph_mem_nodes user_objects managed
          texture_surface vmm_ipc dyn_parallel graph_queries conditional_nodes conditional_capture
          capture_modes graph_captured_child multi_gpu
          ipc_memory kernel_fault device_assert"
RT_FAULT_PROGS="kernel_fault device_assert"          # after each omps run of these the server must be ACTIVE again by itself
RT_ARCH=${RT_ARCH:-sm_90}
BENCH_KEYS="launch_async launch_sync sync_idle h2d_4b_pageable d2h_4b_pageable d2h_4b_pinned malloc_free_1mib h2d_bw_pinned h2d_bw_pageable"

ANY_FAIL=0
note_fail() { ANY_FAIL=1; }

now_ns() { date +%s%N; }
log() { printf '%s\n' "$*"; }
section() { printf '\n==================== %s ====================\n' "$*"; }

# "PASS" if rc is 0 and the last line of the output is PASS; else a reason.
verdict() { # rc file
    local rc=$1 f=$2
    if [ "$rc" -eq 0 ] && [ "$(tail -n 1 "$f" 2>/dev/null)" = "PASS" ]; then echo PASS
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "TIMEOUT"
    else echo "FAIL(rc=$rc)"; fi
}

show_output() { # title file
    log "--- $1: stdout"
    sed 's/^/    /' "$2" 2>/dev/null
    if [ -s "$2.err" ]; then
        log "--- $1: stderr"
        sed 's/^/    /' "$2.err" | head -n 60
    fi
}

# ---------------------------------------------------------------- omps

OMPS=1
OMPS_NOTE="omps binaries present"
missing=""
for f in "$OMPS_SERVER" "$OMPS_CTL" "$OMPS_SHIM"; do
    [ -e "$f" ] || missing="$missing ${f#"$ROOT"/}"
done
if [ -n "$missing" ]; then
    OMPS=0
    OMPS_NOTE="omps binaries missing:$missing; omps columns skipped"
elif [ "$NATIVE_ONLY" -eq 1 ]; then
    OMPS=0
    OMPS_NOTE="omps columns skipped (--native-only)"
fi
if [ "$NATIVE_ONLY" -eq 1 ] && [ -n "$missing" ]; then
    OMPS_NOTE="omps binaries missing:$missing; omps columns skipped (--native-only)"
fi

OMPS_PIPE=""
SERVER_PID=""
SERVER_N=0

ctl() { OMPS_PIPE_DIRECTORY="$OMPS_PIPE" timeout -k 2 10 "$OMPS_CTL" "$@"; }

# Run a command as an omps client (no LD_PRELOAD on `timeout` itself).
as_omps() { timeout -k 5 "$PROG_TIMEOUT" env OMPS_PIPE_DIRECTORY="$OMPS_PIPE" LD_PRELOAD="$OMPS_SHIM" "$@"; }

# The same without LD_PRELOAD: the shim is found as libcuda.so.1 through
# LD_LIBRARY_PATH (a directory of symlinks to it; see make_omps_libdir).
OMPS_LIBDIR=""
as_omps_libpath() {
    timeout -k 5 "$PROG_TIMEOUT" env OMPS_PIPE_DIRECTORY="$OMPS_PIPE" \
        LD_LIBRARY_PATH="$OMPS_LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"
}

make_omps_libdir() {
    [ -n "$OMPS_LIBDIR" ] && return 0
    OMPS_LIBDIR=$(mktemp -d "$WORK/omps-libdir.XXXXXX") || return 1
    ln -s "$OMPS_SHIM" "$OMPS_LIBDIR/libcuda.so.1" && ln -s "$OMPS_SHIM" "$OMPS_LIBDIR/libcuda.so" || return 1
    log "omps library directory $OMPS_LIBDIR:"
    local l
    for l in "$OMPS_LIBDIR"/*; do log "    $l -> $(readlink "$l")"; done
}

# Restart the omps server if it died (at most RESTARTS_LEFT times per run).
RESTARTS_LEFT=3
ensure_omps() {
    [ "$OMPS" -eq 1 ] || return 1
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then return 0; fi
    if [ -n "$SERVER_PID" ]; then
        wait "$SERVER_PID"; log "omps-server (pid $SERVER_PID) has died with status $?"; SERVER_PID=""; note_fail
    fi
    [ "$RESTARTS_LEFT" -gt 0 ] || return 1
    RESTARTS_LEFT=$((RESTARTS_LEFT - 1))
    start_omps || { log "omps-server failed to start"; note_fail; return 1; }
}

restart_omps() { stop_omps; start_omps || { log "omps-server failed to start"; note_fail; }; }

# After a GPU fault the server recovers by itself once the faulting client is gone
# (recreating its context, or starting itself again under the same PID).
await_active() {
    local t0 st; t0=$(now_ns)
    while [ $(( $(now_ns) - t0 )) -lt 10000000000 ]; do
        st=$(ctl get_server_status "$SERVER_PID" 2>/dev/null)
        if [ "$st" = ACTIVE ]; then
            log "omps-server ACTIVE again $(( ($(now_ns) - t0) / 1000000 )) ms after the faulting client ended"
            return 0
        fi
        sleep 0.05
    done
    return 1
}

start_omps() {
    SERVER_N=$((SERVER_N + 1))
    OMPS_PIPE=$(mktemp -d /tmp/omps-e2e-pipe.XXXXXX) || return 1
    chmod 700 "$OMPS_PIPE"
    local logdir="$WORK/omps-log-$SERVER_N"
    mkdir -p "$logdir"
    log "starting omps-server #$SERVER_N (pipe dir $OMPS_PIPE)"
    OMPS_PIPE_DIRECTORY="$OMPS_PIPE" OMPS_LOG_DIRECTORY="$logdir" \
        "$OMPS_SERVER" </dev/null >"$WORK/server-$SERVER_N.out" 2>&1 &
    SERVER_PID=$!
    local t0; t0=$(now_ns)
    while [ $(( $(now_ns) - t0 )) -lt 10000000000 ]; do
        if ctl status >"$WORK/status-$SERVER_N.out" 2>&1; then
            log "omps-server up after $(( ($(now_ns) - t0) / 1000000 )) ms (pid $SERVER_PID)"
            sed 's/^/    /' "$WORK/status-$SERVER_N.out"
            return 0
        fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            wait "$SERVER_PID"; log "omps-server exited early with rc=$?"
            SERVER_PID=""
            return 1
        fi
        sleep 0.1
    done
    log "omps-server did not answer 'omps-ctl status' within 10 s"
    return 1
}

stop_omps() {
    [ -n "$SERVER_PID" ] || return 0
    log "stopping omps-server (omps-ctl quit)"
    ctl quit >"$WORK/quit-$SERVER_N.out" 2>&1
    log "omps-ctl quit rc=$?"
    local i
    for i in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        log "omps-server still running 10 s after quit: sending SIGTERM to $SERVER_PID"
        note_fail
        kill -TERM "$SERVER_PID" 2>/dev/null; sleep 3
        kill -0 "$SERVER_PID" 2>/dev/null && kill -KILL "$SERVER_PID" 2>/dev/null
    fi
    wait "$SERVER_PID" 2>/dev/null
    log "omps-server exit status $?"
    SERVER_PID=""
}

# ---------------------------------------------------------------- NVIDIA MPS

MPS_CONTROL=${MPS_CONTROL:-$(command -v nvidia-cuda-mps-control 2>/dev/null || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)}
MPS_PIPE="/tmp/omps-e2e-mps-pipe.$$"
MPS_LOGD="/tmp/omps-e2e-mps-log.$$"
MPS_UP=0

# PIDs of running MPS control daemons / servers (by executable name).
mps_procs() {
    local d exe
    for d in /proc/[0-9]*; do
        exe=$(readlink "$d/exe" 2>/dev/null) || continue
        case "${exe##*/}" in
            nvidia-cuda-mps-control|nvidia-cuda-mps-server) printf '%s ' "${d#/proc/}" ;;
        esac
    done
}

start_mps() {
    if [ ! -x "$MPS_CONTROL" ]; then log "nvidia-cuda-mps-control not found ($MPS_CONTROL)"; return 1; fi
    local running; running=$(mps_procs)
    if [ -n "$running" ]; then log "an MPS daemon is already running (pids $running): not starting another"; return 1; fi
    mkdir -p "$MPS_PIPE" "$MPS_LOGD"
    log "starting NVIDIA MPS: $MPS_CONTROL -d (pipe $MPS_PIPE, logs $MPS_LOGD)"
    CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" CUDA_MPS_LOG_DIRECTORY="$MPS_LOGD" \
        PATH="$(dirname "$MPS_CONTROL"):$PATH" \
        "$MPS_CONTROL" -d </dev/null >>"$WORK/mps-control.out" 2>&1
    local rc=$?
    if [ $rc -ne 0 ]; then log "nvidia-cuda-mps-control -d failed rc=$rc"; return 1; fi
    local i
    for i in $(seq 50); do [ -e "$MPS_PIPE/control" ] && break; sleep 0.1; done
    MPS_UP=1
    return 0
}

stop_mps() {
    [ "$MPS_UP" -eq 1 ] || return 0
    log "stopping NVIDIA MPS (echo quit | nvidia-cuda-mps-control)"
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" timeout 20 "$MPS_CONTROL" >>"$WORK/mps-control.out" 2>&1
    local t0 left; t0=$(now_ns)
    while :; do
        left=$(mps_procs)
        [ -z "$left" ] && break
        if [ $(( $(now_ns) - t0 )) -gt 30000000000 ]; then
            log "MPS processes still running 30 s after quit: $left"; note_fail; break
        fi
        sleep 0.2
    done
    log "NVIDIA MPS stopped after $(( ($(now_ns) - t0) / 1000000 )) ms"
    MPS_UP=0
}

cleanup() {
    [ -n "$SERVER_PID" ] && stop_omps
    [ "$MPS_UP" -eq 1 ] && stop_mps
}

# ---------------------------------------------------------------- build

find_nvcc() {
    local c
    for c in "${NVCC:-}" "$(command -v nvcc 2>/dev/null)" /usr/local/cuda/bin/nvcc /usr/local/cuda-13.0/bin/nvcc; do
        [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
    done
    return 1
}

build_all() {
    section "build"
    NVCC=$(find_nvcc) || { log "nvcc not found (set NVCC=...)"; return 1; }
    local cuda_home; cuda_home=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
    log "nvcc: $NVCC"
    "$NVCC" --version | tail -n 2
    local libs="-L$cuda_home/lib64/stubs -L$cuda_home/targets/x86_64-linux/lib/stubs -lcuda"
    local bpids=() names=()
    [ "$RT" -eq 1 ] && build_rt
    [ "$RT_ONLY" -eq 1 ] && { wait_builds; return; }
    # kernel images: source -> image name (as the programs expect it)
    local k
    for k in vector_add_kernel:vector_add.fatbin dyn_shared_kernel:dyn_shared.fatbin \
             kernel_args_kernel:kernel_args.cubin streams_events_kernel:streams_events.cubin \
             spin_kernel:spin.cubin module_globals_kernel:module_globals.ptx; do
        local src=${k%%:*} img=${k##*:} flags
        case "$img" in
            *.fatbin) flags="-fatbin -gencode arch=compute_90,code=[sm_90,compute_90]" ;;
            *.cubin) flags="-cubin -arch=sm_90" ;;
            *.ptx) flags="-ptx -arch=compute_90" ;;
        esac
        rm -f "$BIN/$img"
        # shellcheck disable=SC2086
        ( "$NVCC" $flags -O3 -o "$BIN/$img" "$SRC/$src.cu" ) >"$WORK/build-$img.log" 2>&1 &
        bpids+=($!); names+=("$img")
    done
    local p
    for p in vector_add kernel_args memcpy_roundtrip streams_events module_globals dyn_shared \
             spin_concurrency hold_memory tensor_maps vmm_and_pools; do
        rm -f "$BIN/$p"
        # shellcheck disable=SC2086
        ( "$NVCC" -cudart none -O2 -std=c++17 -Xcompiler -Wall -I"$SRC" -o "$BIN/$p" "$SRC/$p.cpp" $libs ) \
            >"$WORK/build-$p.log" 2>&1 &
        bpids+=($!); names+=("$p")
    done
    wait_builds
}

# Runtime-API programs: nvcc's default flags (static cudart) plus -arch; the
# commands are logged. Appends to bpids/names of build_all.
build_rt() {
    local p flags
    for p in $RT_PROGS bench_overhead; do
        flags="-arch=$RT_ARCH"
        [ "$p" = per_thread_stream ] && flags="$flags --default-stream per-thread"
        local libs=""
        [ "$p" = dyn_parallel ] && flags="$flags -rdc=true" && libs="-lcudadevrt"
        rm -f "$RTBIN/$p"
        # shellcheck disable=SC2086
        ( echo "$NVCC $flags -o $RTBIN/$p $RTSRC/$p.cu $libs"; "$NVCC" $flags -o "$RTBIN/$p" "$RTSRC/$p.cu" $libs ) \
            >"$WORK/build-rt-$p.log" 2>&1 &
        bpids+=($!); names+=("rt-$p")
    done
    log "runtime-API programs: nvcc -arch=$RT_ARCH (per_thread_stream: + --default-stream per-thread)"
}

# Wait for the builds of build_all (bpids/names are its locals).
wait_builds() {
    local i failed=0
    : >"$OUT/build.log"
    for i in "${!bpids[@]}"; do
        if wait "${bpids[$i]}"; then log "built ${names[$i]}"; else log "BUILD FAILED: ${names[$i]}"; failed=1; fi
        { echo "=== ${names[$i]}"; cat "$WORK/build-${names[$i]}.log"; } >>"$OUT/build.log"
    done
    [ "$failed" -eq 0 ] || { log "see build.log"; sed 's/^/    /' "$OUT/build.log" | head -n 80; }
    return "$failed"
}

# ---------------------------------------------------------------- 1. correctness

declare -A NAT_V OMPS_V RES_V

correctness() {
    section "1. correctness (native vs omps)"
    local p
    for p in $CORRECTNESS_PROGS; do
        local on="$WORK/$p.native" oo="$WORK/$p.omps" rc
        if [ ! -x "$BIN/$p" ]; then
            NAT_V[$p]="NOT BUILT"; OMPS_V[$p]="-"; RES_V[$p]="FAIL"; note_fail; continue
        fi
        timeout -k 5 "$PROG_TIMEOUT" "$BIN/$p" >"$on" 2>"$on.err"; rc=$?
        NAT_V[$p]=$(verdict $rc "$on")
        show_output "$p native (rc=$rc)" "$on"
        if [ "$OMPS" -eq 1 ]; then
            if [ -n "$SERVER_PID" ]; then
                as_omps "$BIN/$p" >"$oo" 2>"$oo.err"; rc=$?
                OMPS_V[$p]=$(verdict $rc "$oo")
                show_output "$p omps (rc=$rc)" "$oo"
            else
                OMPS_V[$p]="NO SERVER"
            fi
            if [ "${NAT_V[$p]}" = PASS ] && [ "${OMPS_V[$p]}" = PASS ] && cmp -s "$on" "$oo"; then
                RES_V[$p]=PASS
            else
                RES_V[$p]=FAIL; note_fail
                if [ -f "$oo" ] && ! cmp -s "$on" "$oo"; then
                    log "--- $p: diff native omps"
                    diff "$on" "$oo" | head -n 40 | sed 's/^/    /'
                fi
            fi
        else
            OMPS_V[$p]="skipped"
            if [ "${NAT_V[$p]}" = PASS ]; then RES_V[$p]="PASS (native only)"; else RES_V[$p]=FAIL; note_fail; fi
        fi
        log ">>> $p: native ${NAT_V[$p]}, omps ${OMPS_V[$p]}, result ${RES_V[$p]}"
    done
}

# ---------------------------------------------------------------- 2. concurrency

CONC_RESULT=""
CONC_LATE=0

# One run: N copies of spin_concurrency in mode native|mps|omps.
conc_once() { # mode n rep
    local mode=$1 n=$2 rep=$3 i
    local start_at=$(( $(now_ns) + START_LEAD_NS ))
    local pids=()
    for ((i = 0; i < n; i++)); do
        local o="$WORK/spin.$mode.n$n.r$rep.$i"
        case "$mode" in
            native) timeout -k 5 60 "$BIN/spin_concurrency" --start-at "$start_at" >"$o" 2>"$o.err" & ;;
            mps) timeout -k 5 60 env CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" \
                    "$BIN/spin_concurrency" --start-at "$start_at" >"$o" 2>"$o.err" & ;;
            omps) timeout -k 5 60 env OMPS_PIPE_DIRECTORY="$OMPS_PIPE" LD_PRELOAD="$OMPS_SHIM" \
                    "$BIN/spin_concurrency" --start-at "$start_at" >"$o" 2>"$o.err" & ;;
        esac
        pids+=($!)
    done
    local bad=0 minstart="" maxend="" s e rc
    for ((i = 0; i < n; i++)); do
        local o="$WORK/spin.$mode.n$n.r$rep.$i"
        wait "${pids[$i]}"; rc=$?
        if [ "$(verdict $rc "$o")" != PASS ]; then
            bad=$((bad + 1)); show_output "spin_concurrency $mode N=$n rep $rep copy $i (rc=$rc)" "$o"; continue
        fi
        if grep -q '^LATE' "$o.err"; then CONC_LATE=1; log "    note: $mode N=$n rep $rep copy $i: $(head -n 1 "$o.err")"; fi
        read -r _ s e < <(grep '^TIMES ' "$o")
        if [ -z "$minstart" ] || [ "$s" -lt "$minstart" ]; then minstart=$s; fi
        if [ -z "$maxend" ] || [ "$e" -gt "$maxend" ]; then maxend=$e; fi
    done
    if [ "$bad" -ne 0 ]; then CONC_RESULT="FAIL"; return 1; fi
    CONC_RESULT=$(awk -v d=$((maxend - minstart)) 'BEGIN { printf "%.3f", d / 1e9 }')
    return 0
}

median() { # values...: median of numbers, or FAIL if any is not a number
    local v
    for v in "$@"; do case "$v" in ''|*[!0-9.]*) echo FAIL; return;; esac; done
    printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'
}

declare -A CONC   # CONC[mode,n] = median seconds | FAIL | skipped

conc_mode() { # mode
    local mode=$1 n rep
    declare -A runs
    for rep in $(seq "$REPS"); do
        for n in $CONC_NS; do
            conc_once "$mode" "$n" "$rep"
            runs[$n]="${runs[$n]:-} $CONC_RESULT"
            log "$mode N=$n rep $rep: makespan $CONC_RESULT s"
        done
    done
    for n in $CONC_NS; do
        # shellcheck disable=SC2086
        CONC[$mode,$n]=$(median ${runs[$n]})
        log "$mode N=$n: runs${runs[$n]} -> median ${CONC[$mode,$n]}"
        [ "${CONC[$mode,$n]}" = FAIL ] && note_fail
    done
}

conc_skip() { local n; for n in $CONC_NS; do CONC[$1,$n]=$2; done; }

concurrency_native_mps() {
    section "2a. concurrency: native (time-slicing)"
    if [ ! -x "$BIN/spin_concurrency" ]; then conc_skip native "NOT BUILT"; conc_skip mps "NOT BUILT"; note_fail; return; fi
    conc_mode native
    section "2b. concurrency: NVIDIA MPS"
    if start_mps; then
        # untimed warm-up: the first client makes the control daemon start its server
        timeout -k 5 60 env CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" "$BIN/spin_concurrency" --launches 10 \
            >"$WORK/spin.mps.warmup" 2>&1
        log "MPS warm-up client: $(tail -n 1 "$WORK/spin.mps.warmup")"
        conc_mode mps
        stop_mps
    else
        conc_skip mps "MPS failed to start"; note_fail
    fi
}

concurrency_omps() {
    section "2c. concurrency: omps"
    if [ "$OMPS" -ne 1 ]; then conc_skip omps skipped; log "skipped: $OMPS_NOTE"; return; fi
    if [ -z "$SERVER_PID" ]; then conc_skip omps "NO SERVER"; note_fail; return; fi
    as_omps "$BIN/spin_concurrency" --launches 10 >"$WORK/spin.omps.warmup" 2>&1
    log "omps warm-up client: $(tail -n 1 "$WORK/spin.omps.warmup")"
    conc_mode omps
}

# ---------------------------------------------------------------- 3. kill -9

LOOPS=200
calibrate_loops() {
    section "calibrating vector_add --loops (native)"
    [ -x "$BIN/vector_add" ] || return
    local t0 t1 t2 per
    t0=$(now_ns); "$BIN/vector_add" --loops 10 >/dev/null 2>&1
    t1=$(now_ns); "$BIN/vector_add" --loops 60 >/dev/null 2>&1
    t2=$(now_ns)
    per=$(( ((t2 - t1) - (t1 - t0)) / 50 ))
    if [ "$per" -gt 0 ]; then LOOPS=$(( 4000000000 / per )); fi
    [ "$LOOPS" -lt 100 ] && LOOPS=100
    [ "$LOOPS" -gt 20000 ] && LOOPS=20000
    log "one loop ~$(( per / 1000 )) us natively (start-up ~$(( ((t1 - t0) - 10 * per) / 1000000 )) ms): using --loops $LOOPS (~4 s)"
}

KILL_NATIVE="-"; KILL_OMPS="-"; KILL_RES="-"

# Start the survivors (mode native|omps) and the victim; sets SURV_PIDS, VPID.
start_kill_scenario() { # mode nsurv with_victim
    local mode=$1 nsurv=$2 victim=$3 i o
    SURV_PIDS=()
    for ((i = 0; i < nsurv; i++)); do
        o="$WORK/surv.$mode.$i"
        if [ "$mode" = omps ]; then
            as_omps "$BIN/vector_add" --loops "$LOOPS" >"$o" 2>"$o.err" &
        else
            timeout -k 5 "$PROG_TIMEOUT" "$BIN/vector_add" --loops "$LOOPS" >"$o" 2>"$o.err" &
        fi
        SURV_PIDS+=($!)
    done
    VPID=""
    [ "$victim" -eq 1 ] || return 0
    o="$WORK/victim.$mode"
    # no wrapper: $! must be the victim's own pid
    if [ "$mode" = omps ]; then
        env OMPS_PIPE_DIRECTORY="$OMPS_PIPE" LD_PRELOAD="$OMPS_SHIM" "$BIN/hold_memory" >"$o" 2>"$o.err" &
    else
        "$BIN/hold_memory" >"$o" 2>"$o.err" &
    fi
    VPID=$!
    local t0; t0=$(now_ns)
    while ! grep -q '^READY' "$o" 2>/dev/null; do
        if ! kill -0 "$VPID" 2>/dev/null || [ $(( $(now_ns) - t0 )) -gt 30000000000 ]; then
            log "victim never printed READY"; show_output "hold_memory $mode" "$o"; return 1
        fi
        sleep 0.02
    done
    log "victim pid $VPID READY after $(( ($(now_ns) - t0) / 1000000 )) ms"
    return 0
}

# Wait for the survivors (not in a subshell: they are this shell's children);
# sets SURV_RESULT to "k/n" passed.
SURV_RESULT=""
wait_survivors() { # mode
    local mode=$1 i rc ok=0 n=${#SURV_PIDS[@]}
    for i in "${!SURV_PIDS[@]}"; do
        wait "${SURV_PIDS[$i]}"; rc=$?
        if [ "$(verdict $rc "$WORK/surv.$mode.$i")" = PASS ]; then ok=$((ok + 1))
        else show_output "survivor $mode $i (rc=$rc)" "$WORK/surv.$mode.$i"; fi
    done
    SURV_RESULT="$ok/$n"
}

alive_count() { local p c=0; for p in "${SURV_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && c=$((c + 1)); done; echo $c; }

kill9_native() {
    section "3a. kill -9 rehearsal (native: survivors must pass)"
    if [ ! -x "$BIN/vector_add" ] || [ ! -x "$BIN/hold_memory" ]; then KILL_NATIVE="NOT BUILT"; note_fail; return; fi
    if ! start_kill_scenario native "$KILL_SURVIVORS" 1; then
        KILL_NATIVE="victim failed"; note_fail; [ -n "$VPID" ] && kill -9 "$VPID" 2>/dev/null
        wait_survivors native; return
    fi
    local alive; alive=$(alive_count)
    kill -9 "$VPID"; wait "$VPID" 2>/dev/null
    log "killed victim $VPID with $alive/$KILL_SURVIVORS survivors still running"
    local s; wait_survivors native; s=$SURV_RESULT
    KILL_NATIVE="survivors $s PASS"
    log "native kill -9: survivors $s PASS"
    [ "$s" = "$KILL_SURVIVORS/$KILL_SURVIVORS" ] || note_fail
}

# MEM_BYTES of pid in `omps-ctl ps`, or empty if not listed.
ps_mem() { awk -v p="$1" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "MEM_BYTES") c = i; next } $1 == p { print $c; exit }' "$2"; }

kill9_omps() {
    section "3b. kill -9 under omps"
    if [ "$OMPS" -ne 1 ]; then
        KILL_OMPS=skipped; log "skipped: $OMPS_NOTE"
        case "$KILL_NATIVE" in *"$KILL_SURVIVORS/$KILL_SURVIVORS"*) KILL_RES="PASS (native only)" ;; *) KILL_RES=FAIL ;; esac
        return
    fi
    if [ -z "$SERVER_PID" ]; then KILL_OMPS="NO SERVER"; KILL_RES=FAIL; note_fail; return; fi
    local verdicts=""
    if ! start_kill_scenario omps "$KILL_SURVIVORS" 1; then
        KILL_OMPS="victim failed"; KILL_RES=FAIL; note_fail
        [ -n "$VPID" ] && kill -9 "$VPID" 2>/dev/null
        wait_survivors omps; return
    fi
    ctl ps >"$WORK/ps.before" 2>"$WORK/ps.before.err"
    log "omps-ctl ps before the kill (rc=$?):"; sed 's/^/    /' "$WORK/ps.before"
    local mem; mem=$(ps_mem "$VPID" "$WORK/ps.before")
    if [ -z "$mem" ] || [ "$mem" = 0 ]; then
        log "victim $VPID not listed with nonzero memory (MEM_BYTES='${mem}')"; verdicts="victim not in ps"
    fi
    local alive; alive=$(alive_count)
    local t0 t1 gone=0 ms
    t0=$(now_ns)
    kill -9 "$VPID"
    wait "$VPID" 2>/dev/null
    while [ $(( $(now_ns) - t0 )) -lt 5000000000 ]; do
        ctl ps >"$WORK/ps.after" 2>"$WORK/ps.after.err"
        mem=$(ps_mem "$VPID" "$WORK/ps.after")
        if [ -z "$mem" ] || [ "$mem" = 0 ]; then gone=1; break; fi
        sleep 0.02
    done
    t1=$(now_ns); ms=$(( (t1 - t0) / 1000000 ))
    log "killed victim $VPID with $alive/$KILL_SURVIVORS survivors still running"
    log "omps-ctl ps after the kill:"; sed 's/^/    /' "$WORK/ps.after"
    local s; wait_survivors omps; s=$SURV_RESULT
    if [ "$gone" -eq 1 ]; then KILL_OMPS="$ms ms, survivors $s PASS"
    else KILL_OMPS="still listed after 5 s, survivors $s PASS"; verdicts="$verdicts not dropped"; fi
    if [ -z "$verdicts" ] && [ "$gone" -eq 1 ] && [ "$ms" -lt 1000 ] && [ "$s" = "$KILL_SURVIVORS/$KILL_SURVIVORS" ]; then
        KILL_RES=PASS
    else
        KILL_RES="FAIL${verdicts:+ ($verdicts)}"; note_fail
    fi
    [ "$alive" -lt "$KILL_SURVIVORS" ] && log "warning: only $alive survivors were still running at the kill (raise --loops)"
    log ">>> kill -9: $KILL_OMPS -> $KILL_RES"
}

# ---------------------------------------------------------------- 4. vandal

VANDAL_OMPS="-"; VANDAL_RES="-"
vandal() {
    section "4. vandal"
    if [ "$OMPS" -ne 1 ]; then VANDAL_OMPS=skipped; log "skipped: $OMPS_NOTE"; return; fi
    if [ ! -x "$OMPS_VANDAL" ]; then VANDAL_OMPS="ring_vandal missing"; VANDAL_RES=FAIL; note_fail; return; fi
    if [ -z "$SERVER_PID" ]; then VANDAL_OMPS="NO SERVER"; VANDAL_RES=FAIL; note_fail; return; fi
    start_kill_scenario omps "$VANDAL_SURVIVORS" 0
    sleep 1   # let the survivors connect and get going
    local alive; alive=$(alive_count)
    OMPS_PIPE_DIRECTORY="$OMPS_PIPE" timeout -k 2 30 "$OMPS_VANDAL" >"$WORK/vandal.out" 2>&1
    local vrc=$?
    log "ring_vandal rc=$vrc ($alive/$VANDAL_SURVIVORS survivors running while it ran):"
    sed 's/^/    /' "$WORK/vandal.out" | head -n 40
    local s; wait_survivors omps; s=$SURV_RESULT
    ctl status >"$WORK/status.after-vandal" 2>&1
    local src=$?
    log "omps-ctl status after the vandal: rc=$src"; sed 's/^/    /' "$WORK/status.after-vandal"
    VANDAL_OMPS="vandal rc $vrc, survivors $s PASS, status rc $src"
    if [ "$vrc" -eq 0 ] && [ "$s" = "$VANDAL_SURVIVORS/$VANDAL_SURVIVORS" ] && [ "$src" -eq 0 ]; then
        VANDAL_RES=PASS
    else
        VANDAL_RES=FAIL; note_fail
    fi
    log ">>> vandal: $VANDAL_OMPS -> $VANDAL_RES"
}

# ---------------------------------------------------------------- 6. runtime API

declare -A RT_NAT RT_PRE RT_LIB RT_RES

in_list() { # word list: is word in the whitespace-separated list?
    local w
    for w in $2; do [ "$w" = "$1" ] && return 0; done
    return 1
}

# One omps run of an rt program: mode preload|libpath; sets RT_PRE/RT_LIB.
rt_omps_run() { # prog mode
    local p=$1 mode=$2 o="$WORK/rt.$1.$2" rc v
    if ! ensure_omps; then v="NO SERVER"
    else
        if [ "$mode" = preload ]; then as_omps "$RTBIN/$p" >"$o" 2>"$o.err"; rc=$?
        else as_omps_libpath "$RTBIN/$p" >"$o" 2>"$o.err"; rc=$?; fi
        v=$(verdict $rc "$o")
        show_output "rt/$p omps $mode (rc=$rc)" "$o"
        if [ -f "$WORK/rt.$p.native" ] && ! cmp -s "$WORK/rt.$p.native" "$o"; then
            log "--- rt/$p: diff native omps-$mode"
            diff "$WORK/rt.$p.native" "$o" | head -n 40 | sed 's/^/    /'
            [ "$v" = PASS ] && v="PASS, output differs"
        fi
        # Assert messages go to stderr: the same lines as natively.
        if [ -f "$WORK/rt.$p.native.err" ] && grep -q Assertion "$WORK/rt.$p.native.err" &&
            ! cmp -s <(grep Assertion "$WORK/rt.$p.native.err") <(grep Assertion "$o.err"); then
            log "--- rt/$p: assert messages on stderr differ (native, then omps-$mode)"
            grep Assertion "$WORK/rt.$p.native.err" "$o.err" | head -n 10 | sed 's/^/    /'
            [ "$v" = PASS ] && v="PASS, assert message differs"
        fi
        if in_list "$p" "$RT_FAULT_PROGS" && ! await_active; then
            v="$v; server not ACTIVE again within 10 s"; note_fail; restart_omps
        fi
    fi
    if [ "$mode" = preload ]; then RT_PRE[$p]=$v; else RT_LIB[$p]=$v; fi
}

rt_correctness() {
    section "6. runtime-API programs (native, omps preload, omps libpath)"
    if [ "$OMPS" -eq 1 ]; then
        make_omps_libdir || { log "could not make the omps library directory"; note_fail; }
        log "omps preload: env OMPS_PIPE_DIRECTORY=\$pipe LD_PRELOAD=$OMPS_SHIM PROGRAM"
        log "omps libpath: env OMPS_PIPE_DIRECTORY=\$pipe LD_LIBRARY_PATH=$OMPS_LIBDIR\${LD_LIBRARY_PATH:+:...} PROGRAM (no preload)"
    else
        log "omps columns skipped: $OMPS_NOTE"
    fi
    local p on rc
    for p in $RT_PROGS; do
        on="$WORK/rt.$p.native"
        if [ ! -x "$RTBIN/$p" ]; then
            RT_NAT[$p]="NOT BUILT"; RT_PRE[$p]="-"; RT_LIB[$p]="-"; RT_RES[$p]="FAIL"; note_fail; continue
        fi
        timeout -k 5 "$PROG_TIMEOUT" "$RTBIN/$p" >"$on" 2>"$on.err"; rc=$?
        RT_NAT[$p]=$(verdict $rc "$on")
        show_output "rt/$p native (rc=$rc)" "$on"
        if [ "$OMPS" -eq 1 ]; then
            rt_omps_run "$p" preload
            rt_omps_run "$p" libpath
            if [ "${RT_NAT[$p]}" = PASS ] && [ "${RT_PRE[$p]}" = PASS ] && [ "${RT_LIB[$p]}" = PASS ]; then
                RT_RES[$p]=PASS
            else
                RT_RES[$p]=FAIL; note_fail
            fi
        else
            RT_PRE[$p]=skipped; RT_LIB[$p]=skipped
            if [ "${RT_NAT[$p]}" = PASS ]; then RT_RES[$p]="PASS (native only)"; else RT_RES[$p]=FAIL; note_fail; fi
        fi
        log ">>> rt/$p: native ${RT_NAT[$p]}, omps preload ${RT_PRE[$p]}, omps libpath ${RT_LIB[$p]}, result ${RT_RES[$p]}"
    done
}

# Device printf must reach the client that printed while others, which do not print,
# share the server: rt/device_printf under omps beside 2 x bench_overhead.
PRINTF_BESIDE="not run"
rt_printf_beside() {
    [ "$OMPS" -eq 1 ] && [ -x "$RTBIN/device_printf" ] && [ -x "$RTBIN/bench_overhead" ] || return 0
    ensure_omps || { PRINTF_BESIDE="NO SERVER"; note_fail; return; }
    section "6b. device printf beside other clients"
    local o="$WORK/rt.device_printf.beside" bg=() i rc v
    for i in 1 2; do
        as_omps "$RTBIN/bench_overhead" --launches 200000 --reps 100000 >"$WORK/beside.$i" 2>&1 &
        bg+=($!)
    done
    sleep 1
    as_omps "$RTBIN/device_printf" >"$o" 2>"$o.err"; rc=$?
    v=$(verdict $rc "$o")
    show_output "rt/device_printf beside 2 x bench_overhead (rc=$rc)" "$o"
    if ! cmp -s "$WORK/rt.device_printf.native" "$o"; then
        diff "$WORK/rt.device_printf.native" "$o" | head -n 20 | sed 's/^/    /'
        [ "$v" = PASS ] && v="PASS, output differs"
    fi
    local alive=0
    for i in "${bg[@]}"; do kill -0 "$i" 2>/dev/null && alive=$((alive + 1)); done
    for i in "${bg[@]}"; do kill "$i" 2>/dev/null; wait "$i" 2>/dev/null; done
    PRINTF_BESIDE="$v ($alive of 2 others still running when it ended)"
    [ "$v" = PASS ] && [ "$alive" -eq 2 ] || note_fail
    log ">>> rt/device_printf beside others: $PRINTF_BESIDE"
}

# ---------------------------------------------------------------- 7. overhead benchmark

declare -A BENCH BENCH_UNIT   # BENCH[mode,key] = median | FAIL | skipped; BENCH_UNIT[key]
BENCH_RAN=0

# --reps runs of bench_overhead in mode native|mps|omps; medians into BENCH.
bench_mode() { # mode
    local mode=$1 rep o rc k line
    declare -A runs
    BENCH_RAN=1
    for rep in $(seq "$REPS"); do
        o="$WORK/bench.$mode.$rep"
        case "$mode" in
            native) timeout -k 5 120 "$RTBIN/bench_overhead" >"$o" 2>"$o.err"; rc=$? ;;
            mps) timeout -k 5 120 env CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" "$RTBIN/bench_overhead" >"$o" 2>"$o.err"; rc=$? ;;
            omps) timeout -k 5 120 env OMPS_PIPE_DIRECTORY="$OMPS_PIPE" LD_PRELOAD="$OMPS_SHIM" \
                      "$RTBIN/bench_overhead" >"$o" 2>"$o.err"; rc=$? ;;
        esac
        show_output "bench_overhead $mode rep $rep (rc=$rc)" "$o"
        [ "$(verdict $rc "$o")" = PASS ] || note_fail
        for k in $BENCH_KEYS; do
            line=$(awk -v k="$k" '$1 == "BENCH" && $2 == k { print $3, $4; exit }' "$o")
            if [ -n "$line" ]; then runs[$k]="${runs[$k]:-} ${line%% *}"; BENCH_UNIT[$k]=${line#* }
            else runs[$k]="${runs[$k]:-} FAIL"; fi
        done
    done
    for k in $BENCH_KEYS; do
        # shellcheck disable=SC2086
        BENCH[$mode,$k]=$(median ${runs[$k]:-FAIL})
        log "bench $mode $k: runs${runs[$k]:-} -> median ${BENCH[$mode,$k]}"
    done
}

bench_skip() { local k; for k in $BENCH_KEYS; do BENCH[$1,$k]=$2; done; }

bench_native_mps() {
    section "7a. overhead benchmark: native"
    if [ ! -x "$RTBIN/bench_overhead" ]; then bench_skip native "NOT BUILT"; bench_skip mps "NOT BUILT"; note_fail; return; fi
    bench_mode native
    section "7b. overhead benchmark: NVIDIA MPS"
    if start_mps; then
        # untimed warm-up: the first client makes the control daemon start its server
        timeout -k 5 60 env CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" "$RTBIN/vector_add" >"$WORK/bench.mps.warmup" 2>&1
        log "MPS warm-up client: $(tail -n 1 "$WORK/bench.mps.warmup")"
        bench_mode mps
        stop_mps
    else
        bench_skip mps "MPS failed to start"; note_fail
    fi
}

bench_omps() {
    section "7c. overhead benchmark: omps (preload)"
    if [ "$OMPS" -ne 1 ]; then bench_skip omps skipped; log "skipped: $OMPS_NOTE"; return; fi
    if [ ! -x "$RTBIN/bench_overhead" ]; then bench_skip omps "NOT BUILT"; return; fi
    if ! ensure_omps; then bench_skip omps "NO SERVER"; return; fi
    as_omps "$RTBIN/vector_add" >"$WORK/bench.omps.warmup" 2>&1
    log "omps warm-up client: $(tail -n 1 "$WORK/bench.omps.warmup")"
    bench_mode omps
}

bench_label() {
    case "$1" in
        launch_async) echo "empty-kernel launch, host cost per async launch" ;;
        launch_sync) echo "launch + cudaStreamSynchronize round trip" ;;
        sync_idle) echo "cudaStreamSynchronize on an idle stream" ;;
        h2d_4b_pageable) echo "4 B cudaMemcpyAsync H2D (pageable) + sync" ;;
        d2h_4b_pageable) echo "4 B cudaMemcpyAsync D2H (pageable) + sync" ;;
        d2h_4b_pinned) echo "4 B cudaMemcpyAsync D2H (pinned) + sync" ;;
        malloc_free_1mib) echo "cudaMalloc + cudaFree, 1 MiB" ;;
        h2d_bw_pinned) echo "H2D bandwidth, 256 MiB, pinned" ;;
        h2d_bw_pageable) echo "H2D bandwidth, 256 MiB, pageable" ;;
        *) echo "$1" ;;
    esac
}

write_bench() {
    [ "$BENCH_RAN" -eq 1 ] || return 0
    local k
    {
        echo "## bench_overhead: $GPU_DESC"
        echo
        echo "| figure | native | MPS | omps | omps/native |"
        echo "|---|---|---|---|---|"
        for k in $BENCH_KEYS; do
            echo "| $(bench_label "$k") ($k, ${BENCH_UNIT[$k]:-?}) | ${BENCH[native,$k]:-not run} | ${BENCH[mps,$k]:-not run} | ${BENCH[omps,$k]:-not run} | $(ratio "${BENCH[omps,$k]:-}" "${BENCH[native,$k]:-}") |"
        done
        echo
        echo "median of $REPS runs of $RTBIN/bench_overhead each; us = microseconds per call (lower is better), GB/s higher is better"
    } >"$OUT/bench.txt"
    section "benchmark"
    cat "$OUT/bench.txt"
}

# ---------------------------------------------------------------- table

ratio() { # omps mps
    case "$1$2" in *[!0-9.]*|'') echo "-"; return;; esac
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'
}

write_table() {
    local t="$OUT/table.txt" p n
    {
        echo "## omps end-to-end: $GPU_DESC"
        echo
        echo "$OMPS_NOTE"
        echo
        if [ "$RT_ONLY" -eq 0 ]; then
            echo "| test | native | omps | result |"
            echo "|---|---|---|---|"
            for p in $CORRECTNESS_PROGS; do
                echo "| $p | ${NAT_V[$p]:-not run} | ${OMPS_V[$p]:-not run} | ${RES_V[$p]:-not run} |"
            done
            echo "| kill -9 ($KILL_SURVIVORS x vector_add --loops $LOOPS + hold_memory) | $KILL_NATIVE | $KILL_OMPS | $KILL_RES |"
            echo "| vandal ($VANDAL_SURVIVORS x vector_add + ring_vandal) | - | $VANDAL_OMPS | $VANDAL_RES |"
            echo
        fi
        if [ "$RT" -eq 1 ]; then
            echo "| test | native | omps preload | omps libpath | result |"
            echo "|---|---|---|---|---|"
            for p in $RT_PROGS; do
                echo "| rt/$p | ${RT_NAT[$p]:-not run} | ${RT_PRE[$p]:-not run} | ${RT_LIB[$p]:-not run} | ${RT_RES[$p]:-not run} |"
            done
            echo "| rt/device_printf beside 2 x bench_overhead | - | $PRINTF_BESIDE | - | ${PRINTF_BESIDE%% *} |"
            echo
            echo "rt/*: tests/cuda/rt, nvcc -arch=$RT_ARCH, static cudart (rt/per_thread_stream: --default-stream per-thread);"
            echo "preload = LD_PRELOAD=libomps_shim.so; libpath = LD_LIBRARY_PATH=<dir with libcuda.so.1 -> libomps_shim.so>"
            echo
        fi
        if [ "$RT_ONLY" -eq 0 ]; then
            echo "| spin_concurrency, N copies | native (s) | NVIDIA MPS (s) | omps (s) | omps/MPS |"
            echo "|---|---|---|---|---|"
            for n in $CONC_NS; do
                echo "| N=$n | ${CONC[native,$n]:-not run} | ${CONC[mps,$n]:-not run} | ${CONC[omps,$n]:-not run} | $(ratio "${CONC[omps,$n]:-}" "${CONC[mps,$n]:-}") |"
            done
            echo
            echo "makespan = max(end) - min(start) over the N copies, 500 launches x 200 us each, median of $REPS runs"
            [ "$CONC_LATE" -eq 1 ] && echo "note: some copies started after the common start instant (see e2e.log)"
            echo
        fi
        [ -f "$OUT/bench.txt" ] && [ "$BENCH_RAN" -eq 1 ] && { cat "$OUT/bench.txt"; echo; }
        if [ "$ANY_FAIL" -eq 0 ]; then echo "overall: PASS"; else echo "overall: FAIL"; fi
    } >"$t"
    section "summary"
    cat "$t"
}

# ---------------------------------------------------------------- main

collect_server_log() {
    local f
    : >"$OUT/server.log"
    for f in "$WORK"/server-*.out "$WORK"/omps-log-*/*; do
        [ -f "$f" ] && { echo "=== $f"; cat "$f"; } >>"$OUT/server.log"
    done
    log "--- last 50 lines of the server log:"
    tail -n 50 "$OUT/server.log" | sed 's/^/    /'
}

main() {
    local f
    section "omps gpu-e2e $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    log "repo: $ROOT   build: $BUILD   out: $OUT"
    log "$OMPS_NOTE"
    [ "$RT" -eq 0 ] && log "runtime-API section and benchmark skipped (--no-rt)"
    [ "$RT_ONLY" -eq 1 ] && log "--rt-only: runtime-API build, section and benchmark only"
    GPU_DESC=$(nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader 2>/dev/null | head -n 1)
    GPU_DESC=${GPU_DESC:-unknown GPU}
    log "GPU: $GPU_DESC"

    if ! build_all; then note_fail; fi

    if [ "$OMPS" -eq 1 ]; then
        section "starting omps-server"
        start_omps || { log "omps-server failed to start"; note_fail; }
    fi
    [ "$RT_ONLY" -eq 0 ] && correctness
    [ "$RT" -eq 1 ] && { rt_correctness; rt_printf_beside; }
    stop_omps                      # no omps server while native and MPS are timed

    if [ "$RT_ONLY" -eq 0 ]; then
        calibrate_loops
        concurrency_native_mps
        kill9_native
    fi
    [ "$RT" -eq 1 ] && bench_native_mps

    if [ "$OMPS" -eq 1 ]; then
        section "restarting omps-server"
        start_omps || { log "omps-server failed to start"; note_fail; }
    fi
    [ "$RT" -eq 1 ] && bench_omps
    if [ "$RT_ONLY" -eq 0 ]; then
        concurrency_omps
        kill9_omps
        vandal
    fi

    section "5. stop omps-server"
    if [ "$OMPS" -eq 1 ]; then
        stop_omps
        collect_server_log
    else
        log "omps not run: $OMPS_NOTE"
    fi
    cleanup

    if [ -d "$MPS_LOGD" ] || [ -f "$WORK/mps-control.out" ]; then
        : >"$OUT/mps.log"
        for f in "$WORK/mps-control.out" "$MPS_LOGD"/*; do
            [ -f "$f" ] && { echo "=== $f"; cat "$f"; } >>"$OUT/mps.log"
        done
    fi

    write_bench
    write_table
    return "$ANY_FAIL"
}

main_guarded() {
    trap 'cleanup; exit 130' INT TERM
    main
}
main_guarded 2>&1 | tee "$OUT/e2e.log"
exit "${PIPESTATUS[0]}"
