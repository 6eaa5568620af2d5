#!/usr/bin/env bash
# PyTorch inference benchmark: N concurrent inference processes natively (time-sliced),
# under NVIDIA MPS and under omps.
#
#   bash scripts/bench/infer-bench.sh
#
# For each mode of $MODES (native mps omps), each model of $MODELS (resnet50 decoder) and
# each N (resnet50: 1 4 8, decoder: 1 8) it starts N copies of infer_worker.py, waits
# until each has printed READY (model built, warmed up), creates the start file, and waits
# for all of them. Throughput = all requests / (last worker's end - start-file creation);
# p50 and p99 are over every request of every worker. A final table compares the modes.
# MPS and omps never run at once: each is stopped (and MPS waited for until no MPS
# process is left) before the other starts, and everything is stopped on exit.
#
# Environment (all optional):
#   MODES="native mps omps"   MODELS="resnet50 decoder"   (MODELS may include "fake")
#   NS="1 4 8"                N values for every model (default resnet50 1 4 8, decoder 1 8)
#   REQUESTS, WARMUP          per worker, for every model (default 200/20 resnet50, 20/3 decoder)
#   READY_TIMEOUT=120         seconds from launch until every worker must be READY
#   RUN_TIMEOUT=120           seconds after that for the timed part (a worker that
#                             times out, in either part, ends the runs of its mode)
#   OMPS_BIN=target/release   omps-server, omps-ctl, libomps_shim.so
#   MPS_CONTROL               nvidia-cuda-mps-control (default: PATH, then /usr/local/nvidia/bin)
#   PYTHON=python3            the workers' python (the figures are computed with python3)
#   OUT=/tmp/infer-bench
# Output under $OUT: table.txt (the table), results.json (every run's figures and every
# worker's raw JSON), bench.log (everything printed), work.tar.gz (worker logs, server logs).
# Exit status: 0 if every run that was attempted succeeded, 1 otherwise (a mode whose
# binaries are missing is skipped, not failed; one that fails to start is failed).
set -u
export LC_ALL=C

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
OUT=${OUT:-/tmp/infer-bench}
OMPS_BIN=${OMPS_BIN:-target/release}
case "$OMPS_BIN" in /*) ;; *) OMPS_BIN="$ROOT/$OMPS_BIN" ;; esac
OMPS_SERVER="$OMPS_BIN/omps-server"
OMPS_CTL="$OMPS_BIN/omps-ctl"
OMPS_SHIM="$OMPS_BIN/libomps_shim.so"
PYTHON=${PYTHON:-python3}
WORKER="$ROOT/scripts/bench/infer_worker.py"
MODES=${MODES:-native mps omps}
MODELS=${MODELS:-resnet50 decoder}
READY_TIMEOUT=${READY_TIMEOUT:-120}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
MPS_CONTROL=${MPS_CONTROL:-$(command -v nvidia-cuda-mps-control 2>/dev/null || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)}

mkdir -p "$OUT" || exit 2
WORK=$(mktemp -d /tmp/infer-bench-work.XXXXXX) || exit 2
RESULTS="$WORK/results.tsv"   # mode \t model \t n \t status (OK|FAIL|SKIP) \t run dir or reason
: >"$RESULTS"
exec > >(tee "$OUT/bench.log") 2>&1

model_ns() {
    if [ -n "${NS:-}" ]; then echo "$NS"; return; fi
    case "$1" in decoder) echo "1 8" ;; *) echo "1 4 8" ;; esac
}
model_requests() {
    if [ -n "${REQUESTS:-}" ]; then echo "$REQUESTS"; return; fi
    case "$1" in resnet50) echo 200 ;; decoder) echo 20 ;; *) echo 100 ;; esac
}
model_warmup() {
    if [ -n "${WARMUP:-}" ]; then echo "$WARMUP"; return; fi
    case "$1" in resnet50) echo 20 ;; decoder) echo 3 ;; *) echo 2 ;; esac
}

ANY_FAIL=0
now_ns() { date +%s%N; }
log() { printf '%s\n' "$*"; }
section() { printf '\n==================== %s ====================\n' "$*"; }
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$RESULTS"; } # mode model n status dir|reason

# ---------------------------------------------------------------- workers

PIDS=()   # `timeout` PIDs of the workers of the run in progress

# TERM the workers still running (timeout passes it on), KILL what is left after 5 s.
kill_workers() {
    local p i
    [ "${#PIDS[@]}" -gt 0 ] || return 0
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for i in $(seq 50); do
        local alive=0
        for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" -eq 0 ] && break
        sleep 0.1
    done
    for p in "${PIDS[@]}"; do
        if kill -0 "$p" 2>/dev/null; then
            pkill -KILL -P "$p" 2>/dev/null
            kill -KILL "$p" 2>/dev/null
        fi
        wait "$p" 2>/dev/null
    done
    PIDS=()
}

show_err() { # dir i
    log "    --- worker $2 stderr (last 15 lines):"
    tail -n 15 "$1/w$2.err" 2>/dev/null | sed 's/^/      /'
}

MODE_ABANDONED=0

run_one() { # mode model n
    local mode=$1 model=$2 n=$3 i
    local req warm dir start wt
    req=$(model_requests "$model"); warm=$(model_warmup "$model")
    dir="$WORK/$mode/$model-n$n"; start="$dir/start"
    mkdir -p "$dir"; rm -f "$start"
    wt=$((READY_TIMEOUT + RUN_TIMEOUT))
    local envs=(-u LD_PRELOAD -u OMPS_PIPE_DIRECTORY -u CUDA_MPS_PIPE_DIRECTORY)
    case "$mode" in
        mps) envs+=(CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE") ;;
        omps) envs+=(OMPS_PIPE_DIRECTORY="$OMPS_PIPE" LD_PRELOAD="$OMPS_SHIM") ;;
    esac
    log "[$mode] $model N=$n: launching $n worker(s), $req requests each after $warm warm-up"
    PIDS=()
    local t0; t0=$(now_ns)
    for ((i = 0; i < n; i++)); do
        timeout -k 5 "$wt" env "${envs[@]}" "$PYTHON" "$WORKER" --model "$model" --requests "$req" \
            --warmup "$warm" --start-file "$start" --start-timeout "$wt" --out "$dir/w$i.json" \
            </dev/null >"$dir/w$i.out" 2>"$dir/w$i.err" &
        PIDS+=($!)
    done

    # every worker READY, or one dead, or READY_TIMEOUT
    local ready dead notready
    while :; do
        ready=0; dead=""; notready=""
        for ((i = 0; i < n; i++)); do
            if grep -q '^READY' "$dir/w$i.out" 2>/dev/null; then ready=$((ready + 1)); continue; fi
            notready="$notready $i"
            kill -0 "${PIDS[$i]}" 2>/dev/null || dead="$dead $i"
        done
        [ "$ready" -eq "$n" ] && break
        [ -n "$dead" ] && break
        [ $(( $(now_ns) - t0 )) -gt $((READY_TIMEOUT * 1000000000)) ] && break
        sleep 0.1
    done
    local ready_ms=$(( ($(now_ns) - t0) / 1000000 ))
    if [ "$ready" -ne "$n" ]; then
        local why
        if [ -n "$dead" ]; then why="worker(s)$dead exited before READY"
        else why="only $ready of $n READY after ${READY_TIMEOUT} s"; MODE_ABANDONED=1; fi
        log "[$mode] $model N=$n: FAIL: $why"
        kill_workers
        for i in ${dead:-$notready}; do show_err "$dir" "$i"; done
        record "$mode" "$model" "$n" FAIL "$why"; ANY_FAIL=1
        return 1
    fi
    log "[$mode] $model N=$n: all READY after $ready_ms ms"
    check_sharing "$mode" "$dir" "$n"

    local t_touch=${EPOCHREALTIME:-$(date +%s.%N)}
    : >"$start"
    local sampler=""
    if [ "${SAMPLE:-0}" = 1 ]; then sample_loop "$mode" "$dir/samples.txt" & sampler=$!; fi
    # Under omps, what an operator sees while the clients run: one frame of `omps-ctl top`
    # and the metrics, CAPTURE_AFTER seconds in.
    local capture=""
    if [ "$mode" = omps ]; then
        { sleep "${CAPTURE_AFTER:-3}"; ctl top --once >"$dir/omps-top.txt" 2>&1
          ctl metrics >"$dir/omps-metrics.txt" 2>&1; } & capture=$!
    fi
    local rcs=() rc
    for ((i = 0; i < n; i++)); do
        wait "${PIDS[$i]}"; rc=$?
        rcs+=("$rc")
        case "$rc" in 124|137) MODE_ABANDONED=1 ;; esac  # a hung worker: give up this mode
    done
    PIDS=()
    if [ -n "$sampler" ]; then kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null; fi
    if [ -n "$capture" ]; then
        wait "$capture" 2>/dev/null
        log "    omps-ctl top, ${CAPTURE_AFTER:-3} s into the run:"
        sed 's/^/      /' "$dir/omps-top.txt" | head -n 40
    fi
    local line
    line=$(summarize "$mode" "$model" "$n" "$dir" "$t_touch" "${rcs[@]}")
    [ -n "$line" ] || line="FAIL the figures could not be computed"
    log "[$mode] $model N=$n: $line"
    case "$line" in
        OK*) record "$mode" "$model" "$n" OK "$dir" ;;
        *)
            record "$mode" "$model" "$n" FAIL "${line#FAIL }"; ANY_FAIL=1
            for ((i = 0; i < n; i++)); do [ "${rcs[$i]}" -ne 0 ] && show_err "$dir" "$i"; done
            ;;
    esac
}

# SAMPLE=1: once a second while the timed part runs, what each thread burns (top) and,
# under omps, the server's own counters (omps-ctl stats), to find where time goes.
sample_loop() { # mode file
    while :; do
        { echo "=== sample $(date +%s.%N)"
          [ "$1" = omps ] && ctl stats
          top -b -H -n1 -w 160 2>/dev/null | head -40
        } >>"$2" 2>&1
        sleep 1
    done
}

# Figures of one run: writes $dir/summary.json, prints "OK ..." or "FAIL reason".
summarize() { # mode model n dir t_touch rc...
    python3 - "$@" <<'EOF'
import json, math, sys
mode, model, n, d, t_touch = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
rcs = [int(x) for x in sys.argv[6:]]

def pct(xs, q):  # linear interpolation between order statistics (numpy's default)
    k = (len(xs) - 1) * q / 100.0
    f = math.floor(k); c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)

ws, errs = [], []
for i in range(n):
    if rcs[i] != 0:
        errs.append(f"worker {i} rc={rcs[i]}" + (" (timeout)" if rcs[i] in (124, 137) else ""))
    try:
        with open(f"{d}/w{i}.json") as f:
            ws.append(json.load(f))
    except Exception as e:
        errs.append(f"worker {i} wrote no result ({type(e).__name__})")
s = {"mode": mode, "model": model, "n": n, "errors": errs, "workers": ws}
if errs or not ws:
    s["status"] = "FAIL"
    print("FAIL " + "; ".join(errs or ["no workers"]))
else:
    lat = sorted(x for w in ws for x in w["per_request_ms"])
    total = sum(w["requests"] for w in ws)
    makespan = max(w["t_end_unix"] for w in ws) - t_touch
    s.update(status="OK", requests_total=total, makespan_s=makespan,
             throughput_rps=total / makespan,
             throughput_wall_rps=total / max(w["wall_s"] for w in ws),
             p50_ms=pct(lat, 50), p99_ms=pct(lat, 99), mean_ms=sum(lat) / len(lat),
             start_lag_ms=(max(w["t_start_unix"] for w in ws) - t_touch) * 1e3,
             start_spread_ms=(max(w["t_start_unix"] for w in ws) - min(w["t_start_unix"] for w in ws)) * 1e3)
    print(f"OK {s['throughput_rps']:.1f} req/s (makespan {makespan:.3f} s, {total} requests; "
          f"sum/max wall_s {s['throughput_wall_rps']:.1f}), p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms, "
          f"last start {s['start_lag_ms']:.1f} ms after the start file")
with open(f"{d}/summary.json", "w") as f:
    json.dump(s, f)
EOF
}

# Log whether the READY workers really are clients of MPS / omps.
check_sharing() { # mode dir n
    case "$1" in
        mps)
            local srv cl
            srv=$(echo get_server_list | mps_ctl 2>/dev/null | head -n 1)
            if [ -z "$srv" ]; then log "    warning: MPS lists no server: the workers may not be MPS clients"; return; fi
            cl=$(echo "get_client_list $srv" | mps_ctl 2>/dev/null | grep -c '[0-9]')
            log "    MPS server $srv lists $cl client(s) (expected $3)"
            ;;
        omps)
            ctl ps >"$2/omps-ps.txt" 2>&1
            log "    omps-ctl ps (rc=$?):"
            sed 's/^/      /' "$2/omps-ps.txt" | head -n 20
            ;;
    esac
}

# ---------------------------------------------------------------- omps

OMPS_PIPE=""
SERVER_PID=""
SERVER_N=0
SKIP_REASON=""

ctl() { OMPS_PIPE_DIRECTORY="$OMPS_PIPE" timeout -k 2 10 "$OMPS_CTL" "$@"; }

start_omps() {
    local f
    for f in "$OMPS_SERVER" "$OMPS_CTL" "$OMPS_SHIM"; do
        [ -e "$f" ] || { SKIP_REASON="omps binary missing: $f (build with scripts/build-release.sh)"; SKIP_SOFT=1; return 1; }
    done
    local running; running=$(mps_procs)
    if [ -n "$running" ]; then SKIP_REASON="MPS processes still running (pids $running): omps not started"; return 1; fi
    SERVER_N=$((SERVER_N + 1))
    OMPS_PIPE=$(mktemp -d /tmp/infer-bench-omps-pipe.XXXXXX) || { SKIP_REASON="mktemp failed"; return 1; }
    chmod 700 "$OMPS_PIPE"
    local logdir="$WORK/omps-log-$SERVER_N"
    mkdir -p "$logdir"
    log "starting omps-server #$SERVER_N (pipe dir $OMPS_PIPE, logs $logdir)"
    OMPS_PIPE_DIRECTORY="$OMPS_PIPE" OMPS_LOG_DIRECTORY="$logdir" \
        "$OMPS_SERVER" </dev/null >"$WORK/omps-server-$SERVER_N.out" 2>&1 &
    SERVER_PID=$!
    local t0; t0=$(now_ns)
    while [ $(( $(now_ns) - t0 )) -lt 10000000000 ]; do
        if ctl status >"$WORK/omps-status-$SERVER_N.out" 2>&1; then
            log "omps-server up after $(( ($(now_ns) - t0) / 1000000 )) ms (pid $SERVER_PID)"
            sed 's/^/    /' "$WORK/omps-status-$SERVER_N.out"
            return 0
        fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            wait "$SERVER_PID"; SKIP_REASON="omps-server exited early with rc=$?"
            SERVER_PID=""
            tail -n 20 "$WORK/omps-server-$SERVER_N.out" | sed 's/^/    /'
            return 1
        fi
        sleep 0.1
    done
    SKIP_REASON="omps-server did not answer 'omps-ctl status' within 10 s"
    stop_omps
    return 1
}

# The server is up, or restarted (at most twice in a run) if it died.
RESTARTS_LEFT=2
ensure_omps() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then return 0; fi
    if [ -n "$SERVER_PID" ]; then
        wait "$SERVER_PID"; log "omps-server (pid $SERVER_PID) has died with status $?"; ANY_FAIL=1
        tail -n 20 "$WORK/omps-server-$SERVER_N.out" | sed 's/^/    /'
        SERVER_PID=""
    fi
    [ "$RESTARTS_LEFT" -gt 0 ] || { SKIP_REASON="omps-server died (no restarts left)"; return 1; }
    RESTARTS_LEFT=$((RESTARTS_LEFT - 1))
    start_omps
}

stop_omps() {
    [ -n "$SERVER_PID" ] || return 0
    log "stopping omps-server (omps-ctl quit)"
    ctl quit >"$WORK/omps-quit-$SERVER_N.out" 2>&1
    local i
    for i in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        log "omps-server still running 10 s after quit: SIGTERM to $SERVER_PID"
        kill -TERM "$SERVER_PID" 2>/dev/null; sleep 3
        kill -0 "$SERVER_PID" 2>/dev/null && kill -KILL "$SERVER_PID" 2>/dev/null
    fi
    wait "$SERVER_PID" 2>/dev/null
    log "omps-server exit status $?"
    SERVER_PID=""
}

# ---------------------------------------------------------------- NVIDIA MPS

MPS_PIPE="/tmp/infer-bench-mps-pipe.$$"
MPS_LOGD="/tmp/infer-bench-mps-log.$$"
MPS_UP=0

mps_ctl() { CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" timeout 10 "$MPS_CONTROL"; }

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
    if [ ! -x "$MPS_CONTROL" ]; then SKIP_REASON="nvidia-cuda-mps-control not found ($MPS_CONTROL)"; SKIP_SOFT=1; return 1; fi
    if [ -n "$SERVER_PID" ]; then SKIP_REASON="omps-server still running: MPS not started"; return 1; fi
    local running; running=$(mps_procs)
    if [ -n "$running" ]; then SKIP_REASON="an MPS daemon is already running (pids $running): not starting another"; return 1; fi
    mkdir -p "$MPS_PIPE" "$MPS_LOGD"
    log "starting NVIDIA MPS: $MPS_CONTROL -d (pipe $MPS_PIPE, logs $MPS_LOGD)"
    CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE" CUDA_MPS_LOG_DIRECTORY="$MPS_LOGD" \
        PATH="$(dirname "$MPS_CONTROL"):$PATH" \
        timeout 20 "$MPS_CONTROL" -d </dev/null >>"$WORK/mps-control.out" 2>&1
    local rc=$?
    if [ $rc -ne 0 ]; then SKIP_REASON="nvidia-cuda-mps-control -d failed rc=$rc"; return 1; fi
    MPS_UP=1
    local i
    for i in $(seq 50); do [ -e "$MPS_PIPE/control" ] && break; sleep 0.1; done
    if [ ! -e "$MPS_PIPE/control" ]; then SKIP_REASON="no $MPS_PIPE/control 5 s after starting MPS"; stop_mps; return 1; fi
    return 0
}

stop_mps() {
    [ "$MPS_UP" -eq 1 ] || return 0
    log "stopping NVIDIA MPS (echo quit | nvidia-cuda-mps-control)"
    echo quit | mps_ctl >>"$WORK/mps-control.out" 2>&1
    local t0 left; t0=$(now_ns)
    while :; do
        left=$(mps_procs)
        [ -z "$left" ] && break
        if [ $(( $(now_ns) - t0 )) -gt 30000000000 ]; then
            log "MPS processes still running 30 s after quit: $left"; ANY_FAIL=1; break
        fi
        sleep 0.2
    done
    log "NVIDIA MPS stopped after $(( ($(now_ns) - t0) / 1000000 )) ms"
    [ -d "$MPS_LOGD" ] && cp -r "$MPS_LOGD" "$WORK/mps-log" 2>/dev/null
    MPS_UP=0
}

# ---------------------------------------------------------------- modes

SKIP_SOFT=0   # 1: the mode is not available here (binary missing), not a failure
setup_mode() { # mode: 0 if it can run; else SKIP_REASON says why
    SKIP_REASON=""; SKIP_SOFT=0
    case "$1" in
        native) stop_omps; stop_mps
            local running; running=$(mps_procs)
            [ -n "$running" ] && log "warning: MPS processes are running (pids $running, not ours): native clients may use them"
            return 0 ;;
        mps) stop_omps; start_mps ;;
        omps) stop_mps; RESTARTS_LEFT=2; start_omps ;;
        *) SKIP_REASON="unknown mode '$1' (native, mps, omps)"; return 1 ;;
    esac
}

teardown_mode() { case "$1" in mps) stop_mps ;; omps) stop_omps ;; esac; }

CLEANED=0
cleanup() {
    [ "$CLEANED" -eq 1 ] && return
    CLEANED=1
    kill_workers
    stop_omps
    stop_mps
    [ -n "$OMPS_PIPE" ] && rm -rf "$OMPS_PIPE"
    rm -rf "$MPS_PIPE" "$MPS_LOGD"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# ---------------------------------------------------------------- table

write_table() {
    python3 - "$RESULTS" "$OUT" "$MODES" <<'EOF' >"$OUT/table.txt"
import json, sys
results, out, modes_run = sys.argv[1], sys.argv[2], sys.argv[3].split()
runs, cells, rows = [], {}, []
for line in open(results):
    mode, model, n, status, info = line.rstrip("\n").split("\t", 4)
    if (model, n) not in rows:
        rows.append((model, n))
    if status == "OK":
        s = json.load(open(f"{info}/summary.json"))
        cells[mode, model, n] = s
        runs.append(s)
    else:
        cells[mode, model, n] = {"status": status, "reason": info}
        runs.append({"mode": mode, "model": model, "n": int(n), "status": status, "reason": info})

def val(mode, model, n, key):
    c = cells.get((mode, model, n))
    if c is None:
        return None, "-"
    if c["status"] != "OK":
        return None, c["status"]
    return c[key], None

def fmt(mode, model, n, key, f):
    v, alt = val(mode, model, n, key)
    return alt if v is None else f % v

def ratio(a, b, model, n):
    x, _ = val(a, model, n, "throughput_rps"); y, _ = val(b, model, n, "throughput_rps")
    return "%.2fx" % (x / y) if x is not None and y else "-"

modes = [("native", "native"), ("mps", "MPS"), ("omps", "omps")]
head = ["model", "N"] + [f"{t} req/s" for _, t in modes] + ["omps/MPS", "omps/native"] \
    + [f"p50 ms {t}" for _, t in modes] + [f"p99 ms {t}" for _, t in modes]
table = []
for model, n in rows:
    r = [model, n] + [fmt(m, model, n, "throughput_rps", "%.1f") for m, _ in modes]
    r += [ratio("omps", "mps", model, n), ratio("omps", "native", model, n)]
    r += [fmt(m, model, n, "p50_ms", "%.2f") for m, _ in modes]
    r += [fmt(m, model, n, "p99_ms", "%.2f") for m, _ in modes]
    table.append(r)
w = [max(len(str(x)) for x in col) for col in zip(head, *table)]
line = lambda r: "| " + " | ".join(str(x).ljust(k) for x, k in zip(r, w)) + " |"
print(line(head))
print("|" + "|".join("-" * (k + 2) for k in w) + "|")
for r in table:
    print(line(r))
env = next((wk for s in runs for wk in s.get("workers", []) if "torch" in wk), {})
print()
print("req/s: all requests of the N workers / (last worker's end - start-file creation); "
      "p50/p99 over every request of every worker.")
print("resnet50: fp16, batch 1, 224x224, channels-last. decoder: GPT-2-small shape, fp16, "
      "one request = 16-token prompt + 32 greedy tokens with a KV cache.")
if env:
    print(f"torch {env.get('torch')}, {env.get('device')}")
notes = sorted({(m, c["reason"]) for (m, _, _), c in cells.items() if c["status"] != "OK"})
for m, why in notes:
    print(f"{m}: {why}")
with open(f"{out}/results.json", "w") as f:
    json.dump({"modes": modes_run, "runs": runs}, f)
EOF
}

# ---------------------------------------------------------------- main

section "PyTorch inference benchmark"
log "modes: $MODES; models: $MODELS; work dir $WORK; output $OUT"
for model in $MODELS; do
    log "  $model: N = $(model_ns "$model"), $(model_requests "$model") requests + $(model_warmup "$model") warm-up per worker"
done
log "omps binaries: $OMPS_BIN; MPS control: $MPS_CONTROL; python: $PYTHON"
command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/  GPU: /'
T_BEGIN=$(now_ns)

for mode in $MODES; do
    section "mode: $mode"
    MODE_ABANDONED=0
    if ! setup_mode "$mode"; then
        log "$mode: not run: $SKIP_REASON"
        [ "$SKIP_SOFT" -eq 1 ] || ANY_FAIL=1
        teardown_mode "$mode"
        for model in $MODELS; do for n in $(model_ns "$model"); do record "$mode" "$model" "$n" SKIP "$SKIP_REASON"; done; done
        continue
    fi
    for model in $MODELS; do
        for n in $(model_ns "$model"); do
            if [ "$MODE_ABANDONED" -eq 1 ]; then
                record "$mode" "$model" "$n" SKIP "not run: an earlier $mode run timed out"
                continue
            fi
            if [ "$mode" = omps ] && ! ensure_omps; then
                log "[$mode] $model N=$n: not run: $SKIP_REASON"
                record "$mode" "$model" "$n" FAIL "$SKIP_REASON"; ANY_FAIL=1
                continue
            fi
            run_one "$mode" "$model" "$n"
        done
    done
    teardown_mode "$mode"
done

cleanup
section "results ($(( ($(now_ns) - T_BEGIN) / 1000000000 )) s)"
if write_table; then cat "$OUT/table.txt"; else log "could not write the table"; ANY_FAIL=1; fi
tar -czf "$OUT/work.tar.gz" -C "$(dirname "$WORK")" "$(basename "$WORK")" 2>/dev/null && rm -rf "$WORK"
log "output: $OUT/table.txt, $OUT/results.json, $OUT/bench.log, $OUT/work.tar.gz"
exit "$ANY_FAIL"
