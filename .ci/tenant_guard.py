#!/usr/bin/env python3
"""Evaluates deploy/kubernetes/tenant-guard.yaml's CEL rules (its variables, then every
validation) against the pods of .ci/tenant-guard-pods.yaml with cel-python: each `allow`
pod must pass every rule, each `deny` pod must fail the rule whose message holds its
`why`. Each pod's Kubernetes namespace (`namespaceObject`) is labelled omps.io/tenant=true
and omps.io/namespace=inference unless its case gives `namespaceLabels`. cel-python is not Kubernetes' CEL (no cost limits, no Kubernetes extensions), so
this checks what the rules say, not that an API server takes them."""
import sys

import celpy
import yaml

policy_path, pods_path = sys.argv[1], sys.argv[2]
policy = next(
    d for d in yaml.safe_load_all(open(policy_path)) if d and d["kind"] == "ValidatingAdmissionPolicy"
)
env = celpy.Environment()
variables = [(v["name"], env.program(env.compile(v["expression"]))) for v in policy["spec"].get("variables", [])]
rules = [(r["message"], env.program(env.compile(r["expression"]))) for r in policy["spec"]["validations"]]


DEFAULT_LABELS = {"omps.io/tenant": "true", "omps.io/namespace": "inference"}


def failed(pod, labels):
    """The messages of the rules `pod` fails, in a Namespace labelled `labels`."""
    name = pod.get("metadata", {}).get("namespace", "inference")
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    if labels:
        ns["metadata"]["labels"] = labels
    act = {"object": celpy.json_to_cel(pod), "namespaceObject": celpy.json_to_cel(ns)}
    vals = {}
    for name, prog in variables:
        act["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in vals.items()})
        vals[name] = prog.evaluate(act)
    act["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in vals.items()})
    out = []
    for message, prog in rules:
        r = prog.evaluate(act)
        if not isinstance(r, celpy.celtypes.BoolType):
            raise SystemExit(f"rule '{message}' gave {r!r}, not a bool")
        if not r:
            out.append(message)
    return out


bad = 0
cases = yaml.safe_load(open(pods_path))
for case in cases:
    got = failed(case["pod"], case.get("namespaceLabels", DEFAULT_LABELS))
    if case["expect"] == "allow" and got:
        print(f"FAIL {case['name']}: an allowed pod was denied: {got}")
        bad += 1
    elif case["expect"] == "deny" and not any(case["why"] in m for m in got):
        print(f"FAIL {case['name']}: not denied for '{case['why']}' (denied for {got})")
        bad += 1
if bad:
    sys.exit(1)
print(f"tenant-guard rules: {len(cases)} example pods as expected")
