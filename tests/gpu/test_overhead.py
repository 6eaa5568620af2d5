"""The overhead benchmark: tests/cuda/rt/bench_overhead --reps times natively, under NVIDIA
MPS and under omps (LD_PRELOAD), in one run; the median of each figure goes to $OUT/bench.txt
and the end of table.txt (docs/benchmarks.md reads them). It exists as one measure of the
GPU harness (section 7 of scripts/gpu-e2e.sh before issue 24); native and MPS are timed
while no omps server runs.
"""

import pytest

import e2e_summary as summary
from e2e import H, check, executable, last_line, lines_of, log, median, ratio, run, section, show_output, verdict

pytestmark = pytest.mark.group("rt")

KEYS = ["launch_async", "launch_sync", "sync_idle", "h2d_4b_pageable", "d2h_4b_pageable", "d2h_4b_pinned",
        "malloc_free_1mib", "h2d_bw_pinned", "h2d_bw_pageable"]
LABELS = {
    "launch_async": "empty-kernel launch, host cost per async launch",
    "launch_sync": "launch + cudaStreamSynchronize round trip",
    "sync_idle": "cudaStreamSynchronize on an idle stream",
    "h2d_4b_pageable": "4 B cudaMemcpyAsync H2D (pageable) + sync",
    "d2h_4b_pageable": "4 B cudaMemcpyAsync D2H (pageable) + sync",
    "d2h_4b_pinned": "4 B cudaMemcpyAsync D2H (pinned) + sync",
    "malloc_free_1mib": "cudaMalloc + cudaFree, 1 MiB",
    "h2d_bw_pinned": "H2D bandwidth, 256 MiB, pinned",
    "h2d_bw_pageable": "H2D bandwidth, 256 MiB, pageable",
}

BENCH = {}    # (mode, key) -> median as text, FAIL, or why not run
UNIT = {}     # key -> unit
RAN = [False]


def bench_lines():
    """bench.txt's lines."""
    lines = [f"## bench_overhead: {H.gpu_desc}", "", "| figure | native | MPS | omps | omps/native |", "|---|---|---|---|---|"]
    for k in KEYS:
        v = {m: BENCH.get((m, k), "not run") for m in ("native", "mps", "omps")}
        lines.append(f"| {LABELS[k]} ({k}, {UNIT.get(k) or '?'}) | {v['native']} | {v['mps']} | {v['omps']} | "
                     f"{ratio(BENCH.get(('omps', k), ''), BENCH.get(('native', k), ''))} |")
    return lines + ["", f"median of {H.reps} runs of {H.rtbin}/bench_overhead each; us = microseconds per call "
                        "(lower is better), GB/s higher is better"]


def write_bench():
    if not RAN[0]:
        return
    text = "\n".join(bench_lines()) + "\n"
    (H.out / "bench.txt").write_text(text)
    H.write_log(f"\n==================== benchmark ====================\n{text}", console=False)


summary.at_end(write_bench)
summary.block(50, lambda: bench_lines() + [""] if RAN[0] else [])


def _argv(mode):
    b = H.rtbin / "bench_overhead"
    if mode == "native":
        return ["timeout", "-k", "5", "120", b]
    if mode == "mps":
        return H.as_mps(b, timeout="120")
    return H.as_omps(b, timeout="120")


def measure(mode):
    """--reps runs in mode native, mps or omps; medians into BENCH; True if every run passed."""
    RAN[0] = True
    runs = {k: [] for k in KEYS}
    ok = True
    for rep in range(1, H.reps + 1):
        o = H.work / f"bench.{mode}.{rep}"
        rc = run(_argv(mode), o, f"{o}.err")
        show_output(f"bench_overhead {mode} rep {rep} (rc={rc})", o)
        if verdict(rc, o) != "PASS":
            H.fail(f"bench_overhead {mode} rep {rep}: {verdict(rc, o)}")
            ok = False
        found = {}
        for line in lines_of(o):
            f = line.split()
            if len(f) >= 2 and f[0] == "BENCH" and f[1] in runs and f[1] not in found:
                found[f[1]] = f
        for k in KEYS:
            if k in found:
                f = found[k]
                if len(f) >= 3:
                    runs[k].append(f[2])
                UNIT[k] = f[3] if len(f) >= 4 else ""
            else:
                runs[k].append("FAIL")
    for k in KEYS:
        BENCH[(mode, k)] = median(runs[k]) if runs[k] else "FAIL"
        log(f"bench {mode} {k}: runs{''.join(' ' + v for v in runs[k])} -> median {BENCH[(mode, k)]}")
    return ok


def _skip(mode, why):
    for k in KEYS:
        BENCH[(mode, k)] = why


def _built():
    return executable(H.rtbin / "bench_overhead")


@pytest.mark.phase(50)
def test_overhead_native():
    section("7a. overhead benchmark: native")
    if not _built():
        _skip("native", "NOT BUILT")
        _skip("mps", "NOT BUILT")
        check(False, "bench_overhead: NOT BUILT")
    check(measure("native"), "bench_overhead native: a run failed (see e2e.log)")


@pytest.mark.phase(51)
def test_overhead_mps():
    if not _built():
        _skip("mps", "NOT BUILT")
        check(False, "bench_overhead: NOT BUILT")
    section("7b. overhead benchmark: NVIDIA MPS")
    if not H.mps.start():
        _skip("mps", "MPS failed to start")
        check(False, "NVIDIA MPS failed to start")
    try:
        # untimed warm-up: the first client makes the control daemon start its server
        warm = H.work / "bench.mps.warmup"
        run(H.as_mps(H.rtbin / "vector_add", timeout="60"), warm)
        log(f"MPS warm-up client: {last_line(warm)}")
        ok = measure("mps")
    finally:
        H.mps.stop()
    check(ok, "bench_overhead under NVIDIA MPS: a run failed (see e2e.log)")


@pytest.mark.phase(60)
def test_overhead_omps():
    section("7c. overhead benchmark: omps (preload)")
    if not H.omps_on:
        _skip("omps", "skipped")
        log(f"skipped: {H.omps_note}")
        pytest.skip(H.omps_note)
    if not _built():
        _skip("omps", "NOT BUILT")
        check(False, "bench_overhead: NOT BUILT")
    if not H.omps.ensure():
        _skip("omps", "NO SERVER")
        check(False, "bench_overhead under omps: NO SERVER")
    warm = H.work / "bench.omps.warmup"
    run(H.as_omps(H.rtbin / "vector_add"), warm)
    log(f"omps warm-up client: {last_line(warm)}")
    check(measure("omps"), "bench_overhead under omps: a run failed (see e2e.log)")
