#!/usr/bin/env bash
# Several users on one machine, as MPS's control daemon serves them (run as root on the
# GPU machine): `OMPS_MULTIUSER=1 omps-ctl -d` starts a daemon; clients of root and of two
# other users run at once;
#  1. each prints what it prints natively;
#  2. each user's clients were served by a server of that user's own, started on its
#     first connection (get_server_list lists three, each running as its user);
#  3. a user's omps-ctl talks to that user's server, and one user cannot open another's
#     pipe directory;
#  4. quit stops every server and the daemon.
#   OMPS_BIN=target/release bash scripts/multi-user/run.sh
set -u
B0=$(cd "${OMPS_BIN:-target/release}" && pwd)
R=$(cd "$(dirname "$0")/../.." && pwd)
W=${1:-/tmp/omps-multi-user}
rm -rf "$W"; mkdir -p "$W/bin" "$W/out"; chmod 755 "$W" "$W/bin"; chmod 777 "$W/out"
# The users' servers and clients must reach the programs: copies in a directory all can read.
cp "$B0/omps-server" "$B0/omps-ctl" "$B0/libomps_shim.so" "$W/bin/"
B=$W/bin
timeout 300 nvcc -O2 -arch=sm_90 -I"$R/tests/cuda/rt" -o "$W/bin/vector_add" "$R/tests/cuda/rt/vector_add.cu" || exit 1
chmod 755 "$W"/bin/*
timeout 60 "$W/bin/vector_add" > "$W/native.txt" 2>&1
for u in ompsa ompsb; do id "$u" > /dev/null 2>&1 || useradd -M -s /bin/sh "$u" || exit 1; done
as() { # user command...: the command as that user
    local u=$1; shift
    setpriv --reuid="$u" --regid="$(id -g "$u")" --clear-groups -- "$@"
}
export CUDA_MPS_PIPE_DIRECTORY=$W/pipe CUDA_MPS_LOG_DIRECTORY=$W/log
fail=0
verdict() { if [ "$2" = PASS ]; then echo ">>> $1: PASS"; else echo ">>> $1: FAIL ($2)"; fail=1; fi; }
OMPS_MULTIUSER=1 timeout 90 "$B/omps-ctl" -d || { echo "daemon did not start"; exit 1; }
echo "servers with the daemon: $(echo get_server_list | timeout 10 "$B/omps-ctl" | tr '\n' ' ')"
pids=()
for who in root root ompsa ompsa ompsb ompsb; do
    n=${#pids[@]}
    if [ "$who" = root ]; then
        LD_PRELOAD="$B/libomps_shim.so" timeout 120 "$W/bin/vector_add" > "$W/out/$who.$n" 2>&1 &
    else
        as "$who" env LD_PRELOAD="$B/libomps_shim.so" timeout 120 "$W/bin/vector_add" > "$W/out/$who.$n" 2>&1 &
    fi
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
bad=0
for f in "$W"/out/*; do cmp -s "$W/native.txt" "$f" || { bad=$((bad + 1)); echo "  $(basename "$f"): $(tail -n 2 "$f" | tr '\n' ' ')"; }; done
verdict "6 clients of 3 users, each as natively" "$([ $bad = 0 ] && echo PASS || echo "$bad differ")"
list=$(echo get_server_list | timeout 10 "$B/omps-ctl")
owners=$(for p in $list; do ps -o user= -p "$p"; done | sort | tr '\n' ' ')
echo "servers: $(echo $list) run as: $owners"
verdict "a server per user, as that user" "$([ "$owners" = "ompsa ompsb root " ] && echo PASS || echo "$owners")"
mine=$(as ompsa timeout 10 "$B/omps-ctl" get_server_list 2>&1 | tr -d '\n')
verdict "ompsa's omps-ctl reaches ompsa's server" "$([ "$(ps -o user= -p "$mine" 2>/dev/null)" = ompsa ] && echo PASS || echo "got '$mine'")"
uid_a=$(id -u ompsa)
if as ompsb timeout 10 ls "$W/pipe/u$uid_a" > /dev/null 2>&1; then verdict "ompsb cannot open ompsa's pipe directory" "it can"
else verdict "ompsb cannot open ompsa's pipe directory" PASS; fi
echo ps | timeout 10 "$B/omps-ctl" | head -n 3
echo quit | timeout 30 "$B/omps-ctl"
sleep 1
left=$(pgrep -c -f "$W/bin/omps-" || true)
verdict "quit stops every server and the daemon" "$([ "${left:-0}" = 0 ] && echo PASS || echo "$left left")"
[ $fail = 0 ] && echo "multi-user: PASS" || { echo "multi-user: FAIL"; tail -n 20 "$W/log/control.log" 2>/dev/null; exit 1; }
