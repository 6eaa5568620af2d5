"""One runtime-API program of tests/cuda/rt natively and under omps both ways in (LD_PRELOAD,
and LD_LIBRARY_PATH to a libcuda.so.1 -> shim directory), outputs and assert messages
compared with native, its row in table.txt. It exists because two test files run such
programs (test_runtime_programs.py, and test_faults_last.py for those that end the server's
context) and test_printf_beside.py reads their native output; the steps and verdicts are
section 6 of scripts/gpu-e2e.sh before issue 24.
"""

import os

import programs
import e2e_summary as summary
from e2e import H, check, executable, log, log_diff, lines_of, run, same, section, show_output, verdict

# Every program's row, in run order, "not run" until its test fills it in.
ROWS = {p: summary.RT.row(20, f"rt/{p}", ["not run"] * 4) for p in programs.rt_all()}


def _native_out(p):
    return H.work / f"rt.{p}.native"


_started = []


def start_section():
    """The section's header and its omps library directory, before its first program."""
    if _started:
        return
    _started.append(True)
    section("6. runtime-API programs (native, omps preload, omps libpath)")
    if H.omps_on:
        if not H.omps.make_libdir():
            log("could not make the omps library directory")
            H.fail("could not make the omps library directory")
        log(f"omps preload: env OMPS_PIPE_DIRECTORY=$pipe LD_PRELOAD={H.shim} PROGRAM")
        log(f"omps libpath: env OMPS_PIPE_DIRECTORY=$pipe LD_LIBRARY_PATH={H.omps.libdir}"
            "${LD_LIBRARY_PATH:+:...} PROGRAM (no preload)")
    else:
        log(f"omps columns skipped: {H.omps_note}")


def run_native(p):
    """The native run (its output is what the omps runs must print); its verdict."""
    on = _native_out(p)
    rc = run(H.native(H.rtbin / p), on, f"{on}.err")
    show_output(f"rt/{p} native (rc={rc})", on)
    return verdict(rc, on)


def native_output(p):
    """The native output of p, run now if no test has run it yet in this run."""
    if not _native_out(p).exists() and executable(H.rtbin / p):
        run_native(p)
    return _native_out(p)


def _assertions(path):
    return [line for line in lines_of(path) if "Assertion" in line]


def omps_run(p, mode):
    """One omps run, mode preload or libpath; its verdict."""
    o = H.work / f"rt.{p}.{mode}"
    if not H.omps.ensure():
        return "NO SERVER"
    exe = H.rtbin / p
    argv = H.as_omps(exe) if mode == "preload" else H.as_omps_libpath(exe)
    rc = run(argv, o, f"{o}.err")
    v = verdict(rc, o)
    show_output(f"rt/{p} omps {mode} (rc={rc})", o)
    on = _native_out(p)
    if on.is_file() and not same(on, o):
        log(f"--- rt/{p}: diff native omps-{mode}")
        log_diff(on, o, 40)
        if v == "PASS":
            v = "PASS, output differs"
    # Assert messages go to stderr: the same lines as natively.
    native_asserts = _assertions(f"{on}.err") if os.path.isfile(f"{on}.err") else []
    if native_asserts and native_asserts != _assertions(f"{o}.err"):
        log(f"--- rt/{p}: assert messages on stderr differ (native, then omps-{mode})")
        both = [f"{on}.err:{line}" for line in native_asserts] + [f"{o}.err:{line}" for line in _assertions(f"{o}.err")]
        for line in both[:10]:
            log("    " + line)
        if v == "PASS":
            v = "PASS, assert message differs"
    if p in programs.RT_FAULT_PROGRAMS and not H.omps.await_active():
        v += "; server not ACTIVE again within 10 s"
        H.fail(f"rt/{p}: server not ACTIVE again within 10 s")
        H.omps.restart()
    return v


def check_program(p):
    """Runs p natively and under omps both ways; fails the calling test unless all PASS."""
    start_section()
    row = ROWS[p]
    if not executable(H.rtbin / p):
        row.set("NOT BUILT", "-", "-", "FAIL")
        check(False, f"rt/{p}: NOT BUILT (see build.log)")
    nat = run_native(p)
    if H.omps_on:
        pre, lib = omps_run(p, "preload"), omps_run(p, "libpath")
        res = "PASS" if nat == pre == lib == "PASS" else "FAIL"
    else:
        pre = lib = "skipped"
        res = "PASS (native only)" if nat == "PASS" else "FAIL"
    log(f">>> rt/{p}: native {nat}, omps preload {pre}, omps libpath {lib}, result {res}")
    row.set(nat, pre, lib, res)
    check(res != "FAIL", f"rt/{p}: native {nat}, omps preload {pre}, omps libpath {lib}")
