#!/usr/bin/env bash
# What verifying module images costs a PyTorch program's start (issue 23): the same
# program (a small CNN's forward and backward, a matmul, a softmax; its first CUDA work
# loads cuBLAS's and cuDNN's kernels) timed end to end natively, through omps with
# OMPS_VERIFY_IMAGES=0, through omps with an empty verdict file (every image new: each
# goes to the verifier child first), and again with the verdicts kept (what every later
# start pays). REPS runs each; the median, and its ratio to the unverified omps run.
#   OMPS_BIN=target/release bash scripts/probe/verifier_cost.sh [REPS]
set -u
. "$(dirname "$0")/../common.sh"
B=$(cd "${OMPS_BIN:-target/release}" && pwd)
REPS=${1:-3}
W=${W:-/tmp/omps-verifier-cost}; rm -rf "$W"; mkdir -p "$W"
cat > "$W/prog.py" <<'PY'
import torch, torch.nn as nn
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                    nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
                    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).cuda()
x = torch.randn(16, 3, 64, 64, device="cuda")
loss = net(x).log_softmax(1).mean()
loss.backward()
m = torch.randn(512, 512, device="cuda") @ torch.randn(512, 512, device="cuda")
torch.cuda.synchronize()
print(f"{loss.item():.6f} {m.abs().sum().item():.3f}")
PY
serve() { # log dir, then env for the server
    local d=$1; shift
    mkdir -p "$d/pipe"; chmod 700 "$d/pipe"
    env OMPS_LOG=info,omps_server::image::verifier=debug "$@" OMPS_PIPE_DIRECTORY="$d/pipe" OMPS_LOG_DIRECTORY="$d" "$B/omps-server" > "$d/server.out" 2>&1 &
    SP=$!
    for _ in $(seq 100); do [ -S "$d/pipe/omps.sock" ] && break; sleep 0.1; done
}
stop() { OMPS_PIPE_DIRECTORY="$1/pipe" timeout 10 "$B/omps-ctl" quit > /dev/null 2>&1; wait_server "$SP"; }
run() { # label, then env
    local label=$1; shift
    local t0 t1
    t0=$(date +%s%N)
    env "$@" timeout 120 python3 "$W/prog.py" > "$W/$label.out" 2>&1 || echo "$label: rc $?"
    t1=$(date +%s%N)
    echo "$label $(( (t1 - t0) / 1000000 ))" >> "$W/times"   # milliseconds
}
for r in $(seq "$REPS"); do
    run native
    serve "$W/off$r" OMPS_VERIFY_IMAGES=0
    run unverified OMPS_PIPE_DIRECTORY="$W/off$r/pipe" LD_PRELOAD="$B/libomps_shim.so"
    stop "$W/off$r"
    serve "$W/on$r"
    run verify-new OMPS_PIPE_DIRECTORY="$W/on$r/pipe" LD_PRELOAD="$B/libomps_shim.so"
    stop "$W/on$r"
    # The same log directory: the verdicts of the run before are read back.
    serve "$W/on$r"
    run verify-known OMPS_PIPE_DIRECTORY="$W/on$r/pipe" LD_PRELOAD="$B/libomps_shim.so"
    stop "$W/on$r"
done
for l in native unverified verify-new verify-known; do
    cmp -s "$W/native.out" "$W/$l.out" || { echo "$l: output differs from native"; diff "$W/native.out" "$W/$l.out" | head -5; }
done
echo "verdicts remembered: $(wc -l < "$W/on1/verified-images" 2>/dev/null || echo none)"
median() { grep "^$1 " "$W/times" | awk '{print $2}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
base=$(median unverified)
for l in native unverified verify-new verify-known; do
    m=$(median "$l"); awk -v l="$l" -v m="$m" -v b="$base" 'BEGIN { printf "%-13s median %6.2f s  x%.2f of unverified omps\n", l, m / 1000, m / b }'
done
# Where the verified runs' time went, from the verifier's debug lines (first repetition):
# images, their bytes, the time hashing them, and the whole of the checks.
awk '/server listening/ { run++ }
     /image hashed/ { match($0, /us=[0-9]+/); h[run] += substr($0, RSTART + 3, RLENGTH - 3) }
     /image verified/ { n[run]++; match($0, /bytes=[0-9]+/); b[run] += substr($0, RSTART + 6, RLENGTH - 6);
                        match($0, /us=[0-9]+/); v[run] += substr($0, RSTART + 3, RLENGTH - 3) }
     END { split("verify-new verify-known", name, " ");
           for (r = 1; r <= 2; r++) printf "%-13s %d images, %.1f MB, hashing %.2f s, checks %.2f s\n", name[r], n[r], b[r] / 1e6, h[r] / 1e6, v[r] / 1e6 }' "$W/on1/server.log"
