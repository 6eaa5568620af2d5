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
# Nor may the rules as they were before review 4, which took any namespace's directory
# (a team-a pod could mount team-b's); each weakened copy must differ from the policy.
bound="v.hostPath.path == '/run/omps/omps/' + variables.ompsNamespace"
weaken() {
    local weak
    weak=$(mktemp --suffix=.yaml)
    sed -e "s|(variables.ompsNamespace != '' \&\& $bound)|$1|" deploy/kubernetes/tenant-guard.yaml > "$weak"
    if cmp -s "$weak" deploy/kubernetes/tenant-guard.yaml; then
        echo "k8s.sh: tenant-guard.yaml no longer has the rule it weakens" >&2
        exit 1
    fi
    if "$venv/bin/python" .ci/tenant_guard.py "$weak" .ci/tenant-guard-pods.yaml > /dev/null; then
        echo "tenant_guard.py passed a policy that admits $2: the check proves nothing" >&2
        exit 1
    fi
    rm -f "$weak"
}
weaken "v.hostPath.path.startsWith('/run/omps/omps/')" "/run/omps/omps/"
weaken "v.hostPath.path.matches('^/run/omps/omps/[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}\$')" \
    "another namespace's directory"
echo "manifests valid (Kubernetes 1.30, 1.33, strict)"
