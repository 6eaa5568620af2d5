"""Device printf must reach the client that printed while others, which do not print,
share the server: rt/device_printf under omps while 2 bench_overhead clients run beside
it; its output must equal native's and both others must still be running when it ends.
Section 6b of scripts/gpu-e2e.sh before issue 24.
"""

import time

import pytest

import e2e_rt
import e2e_summary as summary
from e2e import H, alive, check, executable, log, log_diff, run, same, section, show_output, spawn, verdict

pytestmark = [pytest.mark.group("rt"), pytest.mark.phase(30)]

RESULT = ["not run"]
summary.RT.row(30, "rt/device_printf beside 2 x bench_overhead",
               lambda: ["-", RESULT[0], "-", RESULT[0].split(" ", 1)[0]])


def test_printf_beside_others():
    printf, bench = H.rtbin / "device_printf", H.rtbin / "bench_overhead"
    if not (H.omps_on and executable(printf) and executable(bench)):
        pytest.skip("needs omps, rt/device_printf and rt/bench_overhead")
    if not H.omps.ensure():
        RESULT[0] = "NO SERVER"
        check(False, "device printf beside others: NO SERVER")
    native = e2e_rt.native_output("device_printf")
    section("6b. device printf beside other clients")
    o = H.work / "rt.device_printf.beside"
    others = [spawn(H.as_omps(bench, "--launches", "200000", "--reps", "100000"), H.work / f"beside.{i}")
              for i in (1, 2)]
    time.sleep(1)
    rc = run(H.as_omps(printf), o, f"{o}.err")
    v = verdict(rc, o)
    show_output(f"rt/device_printf beside 2 x bench_overhead (rc={rc})", o)
    if not same(native, o):
        log_diff(native, o, 20)
        if v == "PASS":
            v = "PASS, output differs"
    running = sum(1 for p in others if alive(p))
    for p in others:
        p.terminate()  # their `timeout`, which passes the TERM on
        p.wait()
    RESULT[0] = f"{v} ({running} of 2 others still running when it ended)"
    log(f">>> rt/device_printf beside others: {RESULT[0]}")
    check(v == "PASS" and running == 2, f"rt/device_printf beside others: {RESULT[0]}")
