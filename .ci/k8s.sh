#!/usr/bin/env bash
# The Kubernetes manifests (deploy/kubernetes) against Kubernetes' own JSON schemas, strict
# (an unknown or misspelt field fails), with kubernetes-validate from PyPI, pinned.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${CI_VENV:-target/ci-venv}
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check kubernetes-validate==1.37.0
fi
if ! "$venv/bin/python" -c 'import celpy' 2> /dev/null; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check cel-python==0.5.0
fi
for v in 1.30.0 1.33.0; do
    "$venv/bin/kubernetes-validate" --strict --quiet -k "$v" deploy/kubernetes/*.yaml
done
# The check can fail: a misspelt field in a copy must be refused.
bad=$(mktemp --suffix=.yaml)
sed 's/hostPID: true/hostPid: true/' deploy/kubernetes/omps-server.yaml > "$bad"
if "$venv/bin/kubernetes-validate" --strict --quiet -k 1.33.0 "$bad" > /dev/null 2>&1; then
    echo "kubernetes-validate accepted a misspelt field: the check proves nothing" >&2
    exit 1
fi
rm -f "$bad"
# tenant-guard.yaml's CEL rules against example pods it must admit and refuse; and the
# check can fail: the rules as they were before issue 23's review admitted a writable
# mount of /run/omps/omps/.
"$venv/bin/python" .ci/tenant_guard.py deploy/kubernetes/tenant-guard.yaml .ci/tenant-guard-pods.yaml
weak=$(mktemp --suffix=.yaml)
sed -e "s|v.hostPath.path.matches('[^']*')|v.hostPath.path.startsWith('/run/omps/omps/')|" \
    deploy/kubernetes/tenant-guard.yaml > "$weak"
if "$venv/bin/python" .ci/tenant_guard.py "$weak" .ci/tenant-guard-pods.yaml > /dev/null; then
    echo "tenant_guard.py passed a policy that admits /run/omps/omps/: the check proves nothing" >&2
    exit 1
fi
rm -f "$weak"
echo "manifests valid (Kubernetes 1.30, 1.33, strict)"
