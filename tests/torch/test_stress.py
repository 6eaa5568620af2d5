"""Several PyTorch processes through one omps server at once, each compared bit for bit
with its native run: a wrong result that only shows while other clients share the
server (a copy overtaking a kernel, a stream placed on a work stream another client
uses) shows here. TORCH_SUITE_STRESS_WORKLOADS picks the workloads (comma-separated),
TORCH_SUITE_STRESS_COPIES how many copies of each run at once (default 2)."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

import compare
import workloads
from harness import Mode, WorkloadFailed

DEFAULT = ("grad_scaling,graphed_optimizers,graph_rng,train_adamw,cuda_graph_decode,"
           "gpt2_generate,matmul,conv")
NAMES = [n.strip() for n in os.environ.get("TORCH_SUITE_STRESS_WORKLOADS", DEFAULT).split(",") if n.strip()]
COPIES = int(os.environ.get("TORCH_SUITE_STRESS_COPIES", "2"))


def test_stress_all_at_once(native, run_workload, results_tsv, omps_server):
    """Every named workload, COPIES copies each, all at once through LD_PRELOAD: every
    copy's result must equal the native one bit for bit."""
    for n in NAMES:
        assert n in workloads.REGISTRY, f"unknown workload {n}"
        assert workloads.REGISTRY[n].exact, f"{n} is not exact: the stress run compares bit for bit"
    refs = {n: native(n) for n in NAMES}
    jobs = [(n, i) for n in NAMES for i in range(COPIES) if "__skip__" not in refs[n].result]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {job: pool.submit(run_workload, job[0], Mode.OMPS_PRELOAD, f".stress{job[1]}") for job in jobs}
    failures = []
    for (n, i), f in futures.items():
        try:
            got, secs = f.result()
        except WorkloadFailed as e:
            failures.append(f"{n} copy {i}: {e}")
            results_tsv(workload=n, way=f"stress{i}", comparison="exact", result="error")
            continue
        out = compare.compare(refs[n].result, got, True, {})
        results_tsv(workload=n, way=f"stress{i}", comparison="exact", max_abs_diff=f"{out.max_diff:.3g}",
                    result="pass" if out.ok else "FAIL", client_s=f"{secs:.1f}")
        if not out.ok:
            failures.append(f"{n} copy {i}: " + "; ".join(out.problems[:10]))
    if failures:
        pytest.fail(f"{len(failures)} of {len(jobs)} concurrent runs differ from native:\n" + "\n".join(failures),
                    pytrace=False)
