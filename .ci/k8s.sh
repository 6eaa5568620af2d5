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
echo "manifests valid (Kubernetes 1.30, 1.33, strict)"
