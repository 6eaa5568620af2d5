"""Vandal: ring_vandal (an omps example client) scribbles on its ring while 4 vector_add
run under omps; the server must disconnect it, the 4 must pass and `omps-ctl status` must
still answer. It exists as one measure of the GPU harness (section 4 of scripts/gpu-e2e.sh
before issue 24); its row is in the driver table of table.txt.
"""

import time

import pytest

import e2e_summary as summary
from e2e import H, VANDAL_SURVIVORS, check, executable, indented, lines_of, log, run, section
from e2e_clients import Scenario, calibrate_loops

pytestmark = pytest.mark.group("cuda")

OMPS, RES = ["-"], ["-"]
summary.DRIVER.row(90, f"vandal ({VANDAL_SURVIVORS} x vector_add + ring_vandal)", lambda: ["-", OMPS[0], RES[0]])


@pytest.mark.phase(90)
def test_vandal():
    calibrate_loops()
    section("4. vandal")
    if not H.omps_on:
        OMPS[0] = "skipped"
        log(f"skipped: {H.omps_note}")
        pytest.skip(H.omps_note)
    if not executable(H.vandal):
        OMPS[0], RES[0] = "ring_vandal missing", "FAIL"
        check(False, f"{H.vandal} missing (scripts/build-release.sh builds it)")
    if H.omps.proc is None:
        OMPS[0], RES[0] = "NO SERVER", "FAIL"
        check(False, "vandal: NO SERVER")
    sc = Scenario("omps", VANDAL_SURVIVORS, False)
    time.sleep(1)  # let the survivors connect and get going
    alive = sc.alive_count()
    out = H.work / "vandal.out"
    vrc = run(["timeout", "-k", "2", "30", H.vandal], out, env={"OMPS_PIPE_DIRECTORY": H.omps.pipe})
    log(f"ring_vandal rc={vrc} ({alive}/{VANDAL_SURVIVORS} survivors running while it ran):")
    indented(lines_of(out), 40)
    s = sc.wait_survivors()
    status = H.work / "status.after-vandal"
    src = H.omps.ctl_to(status, "status")
    log(f"omps-ctl status after the vandal: rc={src}")
    indented(lines_of(status))
    OMPS[0] = f"vandal rc {vrc}, survivors {s} PASS, status rc {src}"
    RES[0] = "PASS" if vrc == 0 and s == f"{VANDAL_SURVIVORS}/{VANDAL_SURVIVORS}" and src == 0 else "FAIL"
    log(f">>> vandal: {OMPS[0]} -> {RES[0]}")
    check(RES[0] == "PASS", f"vandal: {OMPS[0]}")
