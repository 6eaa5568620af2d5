"""Concurrency: N = 1, 4, 8 copies of spin_concurrency (500 launches x 200 us each) started
at one instant, natively (time-slicing), under NVIDIA MPS and under omps, in one run;
makespan = max(end) - min(start), the median of --reps runs, and omps/MPS. It exists as
one measure of the GPU harness (section 2 of scripts/gpu-e2e.sh before issue 24): its own
table in table.txt, the native and MPS columns taken while no omps server runs.
"""

import pytest

import e2e_summary as summary
from e2e import (CONC_NS, H, START_LEAD_NS, check, executable, grep_first, last_line, lines_of, log, median, now_ns,
                 ratio, run, section, show_output, spawn, verdict, wait)

pytestmark = pytest.mark.group("cuda")

CONC = {}     # (mode, n) -> median seconds as text, FAIL, or why not run
LATE = [False]

TABLE = summary.table(
    40, "cuda", ["| spin_concurrency, N copies | native (s) | NVIDIA MPS (s) | omps (s) | omps/MPS |",
                 "|---|---|---|---|---|"],
    footer=lambda: [f"makespan = max(end) - min(start) over the N copies, 500 launches x 200 us each, "
                    f"median of {H.reps} runs"]
    + (["note: some copies started after the common start instant (see e2e.log)"] if LATE[0] else []))
for _n in CONC_NS:
    TABLE.row(40, f"N={_n}", lambda n=_n: [CONC.get((m, n), "not run") for m in ("native", "mps", "omps")]
              + [ratio(CONC.get(("omps", n), ""), CONC.get(("mps", n), ""))])


def _argv(mode, start_at):
    spin = H.bin / "spin_concurrency"
    if mode == "native":
        return ["timeout", "-k", "5", "60", spin, "--start-at", str(start_at)]
    if mode == "mps":
        return H.as_mps(spin, "--start-at", str(start_at), timeout="60")
    return H.as_omps(spin, "--start-at", str(start_at), timeout="60")


def once(mode, n, rep):
    """One run of n copies; the makespan in seconds as text, or FAIL."""
    start_at = now_ns() + START_LEAD_NS
    outs = [H.work / f"spin.{mode}.n{n}.r{rep}.{i}" for i in range(n)]
    procs = [spawn(_argv(mode, start_at), o, f"{o}.err") for o in outs]
    bad, starts, ends = 0, [], []
    for i, (p, o) in enumerate(zip(procs, outs)):
        rc = wait(p)
        times = (grep_first(r"^TIMES ", o) or "").split()
        if verdict(rc, o) != "PASS" or len(times) < 3:
            bad += 1
            show_output(f"spin_concurrency {mode} N={n} rep {rep} copy {i} (rc={rc})", o)
            continue
        if grep_first(r"^LATE", f"{o}.err") is not None:
            LATE[0] = True
            log(f"    note: {mode} N={n} rep {rep} copy {i}: {(lines_of(f'{o}.err') or [''])[0]}")
        starts.append(int(times[1]))
        ends.append(int(times[2]))
    if bad:
        return "FAIL"
    return f"{(max(ends) - min(starts)) / 1e9:.3f}"


def measure(mode):
    """--reps runs of each N in mode native, mps or omps; medians into CONC; True if none FAILs."""
    runs = {n: [] for n in CONC_NS}
    for rep in range(1, H.reps + 1):
        for n in CONC_NS:
            r = once(mode, n, rep)
            runs[n].append(r)
            log(f"{mode} N={n} rep {rep}: makespan {r} s")
    ok = True
    for n in CONC_NS:
        CONC[(mode, n)] = median(runs[n])
        log(f"{mode} N={n}: runs{''.join(' ' + r for r in runs[n])} -> median {CONC[(mode, n)]}")
        if CONC[(mode, n)] == "FAIL":
            H.fail(f"concurrency {mode} N={n}: FAIL")
            ok = False
    return ok


def _skip(mode, why):
    for n in CONC_NS:
        CONC[(mode, n)] = why


def _built():
    return executable(H.bin / "spin_concurrency")


@pytest.mark.phase(40)
def test_concurrency_native():
    section("2a. concurrency: native (time-slicing)")
    if not _built():
        _skip("native", "NOT BUILT")
        _skip("mps", "NOT BUILT")
        check(False, "spin_concurrency: NOT BUILT")
    check(measure("native"), "concurrency native: a run failed (see e2e.log)")


@pytest.mark.phase(41)
def test_concurrency_mps():
    if not _built():
        _skip("mps", "NOT BUILT")
        check(False, "spin_concurrency: NOT BUILT")
    section("2b. concurrency: NVIDIA MPS")
    if not H.mps.start():
        _skip("mps", "MPS failed to start")
        check(False, "NVIDIA MPS failed to start")
    try:
        # untimed warm-up: the first client makes the control daemon start its server
        warm = H.work / "spin.mps.warmup"
        run(H.as_mps(H.bin / "spin_concurrency", "--launches", "10", timeout="60"), warm)
        log(f"MPS warm-up client: {last_line(warm)}")
        ok = measure("mps")
    finally:
        H.mps.stop()
    check(ok, "concurrency under NVIDIA MPS: a run failed (see e2e.log)")


@pytest.mark.phase(70)
def test_concurrency_omps():
    section("2c. concurrency: omps")
    if not H.omps_on:
        _skip("omps", "skipped")
        log(f"skipped: {H.omps_note}")
        pytest.skip(H.omps_note)
    if H.omps.proc is None:
        _skip("omps", "NO SERVER")
        check(False, "concurrency under omps: NO SERVER")
    warm = H.work / "spin.omps.warmup"
    run(H.as_omps(H.bin / "spin_concurrency", "--launches", "10"), warm)
    log(f"omps warm-up client: {last_line(warm)}")
    check(measure("omps"), "concurrency under omps: a run failed (see e2e.log)")
