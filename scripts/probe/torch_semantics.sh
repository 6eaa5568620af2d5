#!/usr/bin/env bash
# Probe: tests/torch workloads natively, then through omps (LD_PRELOAD, OMPS_TRACE=1),
# compared; then N copies of one workload at once through omps, each compared with native.
#   bash scripts/probe/torch_semantics.sh "W1 W2 ..." [STRESS_WORKLOAD N]
set -u
cd "$(dirname "$0")/../.."
source scripts/common.sh
BIN=$(readlink -f "${OMPS_BIN:-target/release}")
OUT=${OUT:-/tmp/omps-probe}; D=$OUT/ts; rm -rf "$D"; mkdir -p "$D"
PIPE=$(mktemp -d /tmp/omps-ts-pipe.XXXX); mkdir -p "$D/omps-log"
export OMPS_PIPE_DIRECTORY=$PIPE OMPS_LOG_DIRECTORY=$D/omps-log
W=${1:-}; SW=${2:-}; SN=${3:-6}
"$BIN/omps-server" > "$D/server.out" 2>&1 &
SPID=$!
for _ in $(seq 100); do [ -S "$PIPE/omps.sock" ] && break; sleep 0.1; done
wl() { # name tag env...
    local n=$1 t=$2; shift 2
    local envs; envs=$(cd tests/torch && python3 -c "import registry, wl_models, wl_libs, wl_semantics; print(' '.join(f'{k}={v}' for k,v in registry.REGISTRY['$n'].env.items()))")
    (cd tests/torch && env $envs "$@" timeout 300 python3 workloads.py "$n" "$D/$n.$t.pt") > "$D/$n.$t.out" 2>&1
    echo $?
}
cmp_pt() { (cd tests/torch && python3 -c "
import torch, compare, sys
a = torch.load('$1', weights_only=False); b = torch.load('$2', weights_only=False)
r = compare.compare(a, b, True, {})
bad = [k for k in a if not k.startswith('__') and (k not in b or compare.value_diff(a[k], b[k]) != 0)]
print('same' if r.ok else 'DIFFER', 'max_diff', r.max_diff, 'keys', bad[:12], [str(b.get(k))[:200] for k in bad[:4] if k.endswith('error')])
") 2>&1 | tail -3; }
for n in $W; do
    nrc=$(wl "$n" native)
    orc=$(wl "$n" omps LD_PRELOAD="$BIN/libomps_shim.so" OMPS_TRACE=1)
    echo "== $n: native rc $nrc, omps rc $orc: $(cmp_pt "$D/$n.native.pt" "$D/$n.omps.pt")"
    [ "$orc" != 0 ] && grep -v '^omps: ask' "$D/$n.omps.out" | tail -n 25
    grep -E 'fail|FAIL|not supported|NOT_SUPPORTED' "$D/$n.omps.out" | grep -v 'ask' | sort | uniq -c | sort -rn | head -20
done
if [ -n "$SW" ]; then
    pids=()
    for i in $(seq "$SN"); do wl "$SW" "stress$i" LD_PRELOAD="$BIN/libomps_shim.so" > "$D/stress$i.rc" & pids+=($!); done
    for p in "${pids[@]}"; do wait "$p"; done
    for i in $(seq "$SN"); do echo "stress $SW #$i rc $(cat "$D/stress$i.rc"): $(cmp_pt "$D/$SW.native.pt" "$D/$SW.stress$i.pt")"; done
fi
timeout 10 "$BIN/omps-ctl" quit > /dev/null 2>&1; wait_server "$SPID"
tail -n 30 "$D/server.out"
tar czf "$OUT/ts.tgz" -C "$OUT" ts 2>/dev/null
