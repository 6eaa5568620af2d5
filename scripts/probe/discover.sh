#!/usr/bin/env bash
# Discovery run on the GPU machine: the PyTorch probe natively (plain, under cutrace and
# under darktrace) and through omps, one process per section, with what each asked for.
# Expects target/release/ built here and the tracers' sources in .devbuild/.
set -u
OUT=${OUT:-/tmp/discover}; mkdir -p "$OUT"
R=$PWD/target/release
SMOKE=scripts/probe/torch_smoke.py
SECTIONS=${SECTIONS:-$(python3 -c "import ast,sys;t=ast.parse(open('$SMOKE').read());print(' '.join(f.name[4:] for f in t.body if isinstance(f,ast.FunctionDef) and f.name.startswith('sec_')))")}
nvidia-smi -L; python3 -c 'import torch;print(torch.__version__)'
gcc -shared -fPIC -O2 -o /tmp/cutrace.so .devbuild/cutrace.c -ldl -lpthread
[ -f scripts/probe/darktrace.c ] && gcc -shared -fPIC -O2 -o /tmp/darktrace.so scripts/probe/darktrace.c -ldl -lpthread
mkdir -p /tmp/tr /tmp/dk
export PYTHONUNBUFFERED=1
if [ -z "${SKIP_NATIVE:-}" ]; then
  echo "== native"; timeout 300 python3 $SMOKE >"$OUT/native.txt" 2>&1; cat "$OUT/native.txt"
  echo "== native under cutrace"; CUTRACE_DIR=/tmp/tr LD_PRELOAD=/tmp/cutrace.so timeout 300 python3 $SMOKE >/tmp/tr/stdout.txt 2>&1; grep -c OK /tmp/tr/stdout.txt
  if [ -f /tmp/darktrace.so ]; then
    echo "== native under darktrace"; DARKTRACE_DIR=/tmp/dk LD_PRELOAD=/tmp/darktrace.so timeout 300 python3 $SMOKE >/tmp/dk/stdout.txt 2>&1; grep -c OK /tmp/dk/stdout.txt
  fi
fi
pipe=$(mktemp -d /tmp/omps-pipe.XXXX); chmod 700 "$pipe"
OMPS_PIPE_DIRECTORY=$pipe OMPS_LOG_DIRECTORY=$pipe "$R/omps-server" & spid=$!
sleep 1
mkdir -p /tmp/om
for way in preload libpath; do
  echo "== omps ($way)"
  libdir=/tmp/omps-libdir; mkdir -p $libdir; ln -sf "$R/libomps_shim.so" $libdir/libcuda.so.1
  for s in $SECTIONS; do
    if [ $way = preload ]; then envv="LD_PRELOAD=$R/libomps_shim.so"; else envv="LD_LIBRARY_PATH=$libdir:${LD_LIBRARY_PATH:-}"; fi
    env OMPS_TRACE=${OMPS_TRACE:-1} OMPS_PIPE_DIRECTORY=$pipe SMOKE_TB=1 $envv timeout -k 5 ${SEC_TIMEOUT:-90} python3 $SMOKE $s >/tmp/om/$way.$s.out 2>/tmp/om/$way.$s.err
    echo "rc=$? $(grep '^\[' /tmp/om/$way.$s.out | head -1)"
  done
  [ -n "${PRELOAD_ONLY:-}" ] && break
done
OMPS_PIPE_DIRECTORY=$pipe timeout 10 "$R/omps-ctl" quit; timeout 10 tail --pid=$spid -f /dev/null
cp "$pipe/server.log" /tmp/om/ 2>/dev/null
tar czf "$OUT/traces.tgz" -C /tmp tr dk om 2>/dev/null; ls -la "$OUT"
