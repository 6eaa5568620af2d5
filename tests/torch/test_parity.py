"""Every workload natively and as an omps client, in each way a client can load the shim;
the results must match (bit for bit where the workload is declared exact)."""

import os
import warnings

import pytest

import compare
import workloads
from harness import TIMEOUT, Mode, WorkloadFailed

WAYS = [Mode(w.strip()) for w in os.environ.get("TORCH_SUITE_WAYS", "preload,libpath").split(",") if w.strip()]
STRICT = os.environ.get("TORCH_SUITE_STRICT") == "1"


def _params():
    for name, wl in workloads.REGISTRY.items():
        for way in WAYS:
            marks = []
            # Known gaps of omps stay visible (x / X in the summary) without stopping -x.
            if wl.known_broken and way is not Mode.MPS and not STRICT:
                marks.append(pytest.mark.xfail(reason=f"known: {wl.known_broken}", strict=False))
            yield pytest.param(name, way, marks=marks, id=f"{name}-{way.value}")


@pytest.mark.parametrize("name,way", list(_params()))
def test_parity(name, way, native, run_workload, results_tsv):
    wl = workloads.REGISTRY[name]
    kind = "exact" if wl.exact else "tolerance"
    ref = native(name)
    row = dict(workload=name, way=way.value, comparison=kind, native_s=f"{ref.seconds:.1f}",
               note="known-broken" if wl.known_broken else "")
    if "__skip__" in ref.result:
        results_tsv(**dict(row, result="skip", note=ref.result["__skip__"]))
        pytest.skip(ref.result["__skip__"])
    if wl.exact and ref.runs > 1 and any(d != 0 for d in ref.spread.values()):
        results_tsv(**dict(row, result="FAIL", note="native runs differ"))
        pytest.fail(f"{name} is declared exact but two native runs differ: {ref.spread}", pytrace=False)
    bad = compare.nonfinite(ref.result)
    if bad:
        warnings.warn(f"{name}: native result has NaN/inf in {bad}: a weaker comparison there")

    try:
        # A known gap should fail fast; a shorter limit keeps a hang there from eating the budget.
        got, secs = run_workload(name, way, timeout=60 if wl.known_broken else TIMEOUT)
    except WorkloadFailed as e:
        got, failure = None, str(e)
    if got is None:
        results_tsv(**row, result="error")
        pytest.fail(failure, pytrace=False)
    row["client_s"] = f"{secs:.1f}"
    if "__skip__" in got:
        results_tsv(**dict(row, result="error", note=f"skipped under {way.value} only"))
        pytest.fail(f"skipped under {way.value} but not natively: {got['__skip__']}", pytrace=False)

    out = compare.compare(ref.result, got, wl.exact, ref.spread)
    results_tsv(**row, max_abs_diff=f"{out.max_diff:.3g}", tolerance=f"{out.max_tol:.3g}" if not wl.exact else "0",
                result="pass" if out.ok else "FAIL")
    if not out.ok:
        how = ("exact comparison: bit-identical results expected (the same deterministic algorithms run)"
               if wl.exact else
               f"tolerance comparison: max(1e-6 x max|native|, 4 x native spread over {ref.runs} runs, 4 eps x max|native|)")
        pytest.fail(f"{name} as a {way.value} client differs from native; {how}:\n  "
                    + "\n  ".join(out.problems[:20]), pytrace=False)
