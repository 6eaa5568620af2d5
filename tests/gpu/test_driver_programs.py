"""The driver-API programs of tests/cuda (programs.DRIVER_PROGRAMS, COMPARE), each natively
and under omps through LD_PRELOAD; the outputs must be equal and end in PASS. It exists as
the first family of the GPU harness (section 1 of scripts/gpu-e2e.sh before issue 24); a
new program is its .cpp in tests/cuda and one line in programs.py.
"""

import pytest

import programs
import e2e_summary as summary
from e2e import H, check, executable, log, log_diff, run, same, section_once, show_output, verdict

pytestmark = [pytest.mark.group("cuda"), pytest.mark.phase(10)]

ROWS = {p: summary.DRIVER.row(10, p, ["not run"] * 3) for p in programs.driver_compared()}


@pytest.mark.parametrize("prog", programs.driver_compared())
def test_driver_program(prog):
    section_once("driver", "1. correctness (native vs omps)")
    row = ROWS[prog]
    exe = H.bin / prog
    on, oo = H.work / f"{prog}.native", H.work / f"{prog}.omps"
    if not executable(exe):
        row.set("NOT BUILT", "-", "FAIL")
        check(False, f"{prog}: NOT BUILT (see build.log)")
    rc = run(H.native(exe), on, f"{on}.err")
    nat = verdict(rc, on)
    show_output(f"{prog} native (rc={rc})", on)
    if H.omps_on:
        if H.omps.proc is not None:
            rc = run(H.as_omps(exe), oo, f"{oo}.err")
            omps = verdict(rc, oo)
            show_output(f"{prog} omps (rc={rc})", oo)
        else:
            omps = "NO SERVER"
        if nat == omps == "PASS" and same(on, oo):
            res = "PASS"
        else:
            res = "FAIL"
            if oo.exists() and not same(on, oo):
                log(f"--- {prog}: diff native omps")
                log_diff(on, oo, 40)
    else:
        omps = "skipped"
        res = "PASS (native only)" if nat == "PASS" else "FAIL"
    log(f">>> {prog}: native {nat}, omps {omps}, result {res}")
    row.set(nat, omps, res)
    differs = ", output differs from native" if nat == omps == "PASS" and res == "FAIL" else ""
    check(res != "FAIL", f"{prog}: native {nat}, omps {omps}{differs}")
