"""Runs one workload and saves its result dict.

    python3 workloads.py NAME OUTFILE     (torch.save of {name: CPU tensor | number | str})

Each workload (wl_models.py, wl_libs.py) runs on CUDA and returns a dict. The harness
(harness.py) runs every workload in a fresh process, natively and as an omps client, and
compares the dicts. A workload is declared `exact` when the same deterministic algorithms
run in both (bit-identical results expected), else it is compared with a tolerance measured
from two native runs. Keys starting with "__" are metadata, not compared.
"""

import os
import sys
import time

# registry first: it sets CUBLAS_WORKSPACE_CONFIG before torch is imported.
from registry import DEV, REGISTRY, SkipWorkload, setup_determinism

import torch  # noqa: E402
import wl_models  # noqa: E402,F401  (importing registers the workloads, in this order)
import wl_libs  # noqa: E402,F401
import wl_semantics  # noqa: E402,F401


def run(name):
    wl = REGISTRY[name]
    for k, v in wl.env.items():
        if os.environ.get(k) != v:  # must be set before torch was imported: too late here
            raise SystemExit(f"workload {name} needs {k}={v} in its environment")
    setup_determinism()
    t0 = time.time()
    try:
        res = wl.fn()
    except SkipWorkload as e:
        return {"__skip__": str(e)}
    if DEV == "cuda":
        torch.cuda.synchronize()
    res["__seconds__"] = time.time() - t0
    res["__torch__"] = str(torch.__version__)
    return res


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in REGISTRY:
        raise SystemExit(f"usage: {sys.argv[0]} NAME OUTFILE; NAME one of: {' '.join(REGISTRY)}")
    result = run(sys.argv[1])
    torch.save(result, sys.argv[2])
    print(f"{sys.argv[1]}: {len(result)} entries saved to {sys.argv[2]}", flush=True)
