"""kill -9: 7 vector_add survivors and 1 hold_memory victim; the victim is SIGKILLed and
the survivors must pass. Natively first (a rehearsal, while no omps server runs), then under
omps, where `omps-ctl ps` must drop the victim within 1 s. It exists as one measure of the
GPU harness (section 3 of scripts/gpu-e2e.sh before issue 24); its row is in the driver
table of table.txt.
"""

import time

import pytest

import e2e_summary as summary
from e2e import H, KILL_SURVIVORS, check, executable, indented, lines_of, log, now_ns, section
from e2e_clients import Scenario, calibrate_loops

pytestmark = pytest.mark.group("cuda")

NATIVE, OMPS, RES = ["-"], ["-"], ["-"]
summary.DRIVER.row(80, lambda: f"kill -9 ({KILL_SURVIVORS} x vector_add --loops {H.loops} + hold_memory)",
                   lambda: [NATIVE[0], OMPS[0], RES[0]])
ALL = f"{KILL_SURVIVORS}/{KILL_SURVIVORS}"


def ps_mem(pid, path):
    """MEM_BYTES of pid in an `omps-ctl ps` listing, or "" if it is not listed."""
    lines = lines_of(path)
    head = lines[0].split() if lines else []
    col = head.index("MEM_BYTES") if "MEM_BYTES" in head else None
    for line in lines[1:]:
        f = line.split()
        if f and f[0] == str(pid):
            # without a MEM_BYTES column, the whole line (awk's $c with c unset)
            return line if col is None else (f[col] if col < len(f) else "")
    return ""


@pytest.mark.phase(45)
def test_kill9_native():
    calibrate_loops()
    section("3a. kill -9 rehearsal (native: survivors must pass)")
    if not (executable(H.bin / "vector_add") and executable(H.bin / "hold_memory")):
        NATIVE[0] = "NOT BUILT"
        check(False, "kill -9: vector_add or hold_memory NOT BUILT")
    sc = Scenario("native", KILL_SURVIVORS, True)
    if not sc.ok:
        NATIVE[0] = "victim failed"
        sc.kill_victim()
        sc.wait_survivors()
        check(False, "kill -9 native: the victim never printed READY")
    alive = sc.alive_count()
    sc.kill_victim()
    sc.victim.wait()
    log(f"killed victim {sc.victim.pid} with {alive}/{KILL_SURVIVORS} survivors still running")
    s = sc.wait_survivors()
    NATIVE[0] = f"survivors {s} PASS"
    log(f"native kill -9: survivors {s} PASS")
    check(s == ALL, f"kill -9 native: survivors {s} PASS")


@pytest.mark.phase(80)
def test_kill9_omps():
    calibrate_loops()
    section("3b. kill -9 under omps")
    if not H.omps_on:
        OMPS[0] = "skipped"
        log(f"skipped: {H.omps_note}")
        RES[0] = "PASS (native only)" if ALL in NATIVE[0] else "FAIL"
        pytest.skip(H.omps_note)
    if H.omps.proc is None:
        OMPS[0], RES[0] = "NO SERVER", "FAIL"
        check(False, "kill -9 under omps: NO SERVER")
    problems = ""
    sc = Scenario("omps", KILL_SURVIVORS, True)
    if not sc.ok:
        OMPS[0], RES[0] = "victim failed", "FAIL"
        sc.kill_victim()
        sc.wait_survivors()
        check(False, "kill -9 under omps: the victim never printed READY")
    before, after = H.work / "ps.before", H.work / "ps.after"
    rc = H.omps.ctl_to(before, "ps", err=f"{before}.err")
    log(f"omps-ctl ps before the kill (rc={rc}):")
    indented(lines_of(before))
    vpid = sc.victim.pid
    mem = ps_mem(vpid, before)
    if mem in ("", "0"):
        log(f"victim {vpid} not listed with nonzero memory (MEM_BYTES='{mem}')")
        problems = "victim not in ps"
    alive = sc.alive_count()
    t0 = now_ns()
    sc.kill_victim()
    sc.victim.wait()
    gone = False
    while now_ns() - t0 < 5_000_000_000:
        H.omps.ctl_to(after, "ps", err=f"{after}.err")
        if ps_mem(vpid, after) in ("", "0"):
            gone = True
            break
        time.sleep(0.02)
    ms = (now_ns() - t0) // 1_000_000
    log(f"killed victim {vpid} with {alive}/{KILL_SURVIVORS} survivors still running")
    log("omps-ctl ps after the kill:")
    indented(lines_of(after))
    s = sc.wait_survivors()
    if gone:
        OMPS[0] = f"{ms} ms, survivors {s} PASS"
    else:
        OMPS[0] = f"still listed after 5 s, survivors {s} PASS"
        problems += " not dropped"
    if not problems and gone and ms < 1000 and s == ALL:
        RES[0] = "PASS"
    else:
        RES[0] = f"FAIL ({problems})" if problems else "FAIL"
    if alive < KILL_SURVIVORS:
        log(f"warning: only {alive} survivors were still running at the kill (raise --loops)")
    log(f">>> kill -9: {OMPS[0]} -> {RES[0]}")
    check(RES[0] == "PASS", f"kill -9 under omps: {OMPS[0]} -> {RES[0]}")
