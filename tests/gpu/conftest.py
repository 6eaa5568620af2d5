"""The GPU harness's pytest wiring: its options (those of scripts/gpu-e2e.sh), the order
of a run (every test carries `phase(N)` and a group, `cuda` or `rt`; tests run by phase),
the session (skip without nvcc or a GPU; else build, start and stop the servers, write
$OUT/table.txt), and the rounds of the omps server: the first one serves the phases before
e2e.QUIET, none runs while native and NVIDIA MPS are timed, a fresh one from e2e.AGAIN on.
It exists so that a test file says only what it runs and checks (see README.md).

    python3 -m pytest tests/gpu [--native-only] [--reps N] [--no-rt | --rt-only] [--gpu-required]
                                [--serving | --serving-only | --serving-fake]

The serving benchmark (test_serving.py, group "serving") is opt-in: it takes about six
minutes. Its host tests (test_serving_host.py, group "host") need no GPU, no harness and
no server: --serving-fake runs them alone.
"""

import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e  # noqa: E402
import e2e_build  # noqa: E402
import e2e_clients  # noqa: E402
import e2e_summary  # noqa: E402
from e2e import H, log, section  # noqa: E402
from e2e_servers import Mps, Omps  # noqa: E402


def pytest_addoption(parser):
    g = parser.getgroup("omps GPU harness (tests/gpu)")
    g.addoption("--native-only", action="store_true", help="skip the omps columns")
    g.addoption("--reps", type=int, default=3, help="runs of each timed measure; the median is kept (default 3)")
    g.addoption("--no-rt", action="store_true", help="skip the runtime-API programs and the benchmark")
    g.addoption("--rt-only", action="store_true", help="only the runtime-API programs and the benchmark")
    g.addoption("--gpu-required", action="store_true",
                help="fail instead of skipping when nvcc or a GPU is missing (scripts/gpu-e2e.sh sets it)")
    g.addoption("--serving", action="store_true", help="also the serving benchmark (issue 25; ~6 minutes)")
    g.addoption("--serving-only", action="store_true", help="only the serving benchmark (nothing is built)")
    g.addoption("--serving-fake", action="store_true",
                help="only the serving benchmark's host tests: fake replicas, the report, the M/D/1 math (no GPU)")


def _term(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # `timeout` signals the child and then its group
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    config.addinivalue_line("markers", "phase(n): where the test runs in a GPU harness run (tests run by phase)")
    config.addinivalue_line("markers", "group(name): cuda (driver-API programs and their measures), rt "
                                       "(runtime-API programs and the benchmark), serving or host; "
                                       "--rt-only / --no-rt / --serving* pick")
    opt = {n: config.getoption(n, default) for n, default in
           (("native_only", False), ("reps", 3), ("no_rt", False), ("rt_only", False), ("gpu_required", False),
            ("serving", False), ("serving_only", False), ("serving_fake", False))}
    if opt["no_rt"] and opt["rt_only"]:
        raise pytest.UsageError("--no-rt and --rt-only exclude each other")
    if sum(bool(opt[k]) for k in ("serving", "serving_only", "serving_fake")) > 1:
        raise pytest.UsageError("--serving, --serving-only and --serving-fake exclude each other")
    H.configure(native_only=opt["native_only"], reps=opt["reps"], rt=not opt["no_rt"], rt_only=opt["rt_only"],
                gpu_required=opt["gpu_required"], serving=opt["serving"], serving_only=opt["serving_only"],
                serving_fake=opt["serving_fake"])
    H.omps, H.mps = Omps(), Mps()
    # A TERM (e.g. from `timeout`) unwinds like ^C, so the servers are stopped on the way out.
    if not config.option.collectonly:
        signal.signal(signal.SIGTERM, _term)


def _phase(item):
    m = item.get_closest_marker("phase")
    if m is None:
        raise pytest.UsageError(f"{item.nodeid}: every test of tests/gpu needs @pytest.mark.phase(N)")
    return m.args[0]


def _group(item):
    m = item.get_closest_marker("group")
    if m is None or m.args[0] not in ("cuda", "rt", "serving", "host"):
        raise pytest.UsageError(f"{item.nodeid}: every test of tests/gpu needs pytest.mark.group: "
                                "'cuda', 'rt', 'serving' or 'host'")
    return m.args[0]


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    ours = [it for it in items if here in Path(str(it.path)).resolve().parents]
    others = [it for it in items if it not in ours]  # a session that collected tests/torch too
    keep = [it for it in ours if e2e_summary.enabled(_group(it))]
    dropped = [it for it in ours if it not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    keep.sort(key=_phase)  # stable: a file's tests, and a parametrized test's cases, keep their order
    items[:] = others + keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
    if rep.failed and H.began:
        H.fail(f"{item.nodeid} ({rep.when})")


@pytest.fixture(scope="session")
def harness():
    """The run: skipped where the harness cannot run; else the build, and at the end the
    servers stopped, their logs collected and table.txt written."""
    why = H.skip_reason()
    if why:
        pytest.skip(why)
    H.begin()
    if not e2e_build.build_all():
        H.fail("build failed")
    yield H
    finish()


def finish():
    section("5. stop omps-server")
    if H.omps_on:
        H.omps.stop()
        H.omps.collect_log()
    else:
        log(f"omps not run: {H.omps_note}")
    cleanup()
    H.mps.collect_log()
    e2e_summary.write()


def cleanup():
    if H.omps is not None and H.omps.proc is not None:
        H.omps.stop()
    if H.mps is not None and H.mps.up:
        H.mps.stop()


_round = [None]


def _enter(phase):
    """Moves the run into the round of `phase`: starts, stops or restarts omps-server."""
    r = "first" if phase < e2e.QUIET else "quiet" if phase < e2e.AGAIN else "again"
    if r == _round[0]:
        return
    _round[0] = r
    if r == "first":
        if H.omps_on:
            section("starting omps-server")
            if not H.omps.start():
                log("omps-server failed to start")
                H.fail("omps-server failed to start")
    elif r == "quiet":
        H.omps.stop()  # no omps server while native and MPS are timed
        if e2e_summary.enabled("cuda"):
            e2e_clients.calibrate_loops()
    else:
        H.omps.stop()
        if H.omps_on:
            section("restarting omps-server")
            if not H.omps.start():
                log("omps-server failed to start")
                H.fail("omps-server failed to start")


_attributed = [0]  # failures noted up to the end of the last test: each is some test's


@pytest.fixture(autouse=True)
def _step(request):
    """Each test: its round first; afterwards, a failure the harness noted while it ran
    (a server that died or would not stop) fails it too, if nothing else did. A host test
    runs outside the harness: no build, no server, nothing in $OUT."""
    if _group(request.node) == "host":
        yield
        return
    request.getfixturevalue("harness")
    before = len(H.fail_reasons)
    _enter(_phase(request.node))
    yield
    noted = H.fail_reasons[before:]
    _attributed[0] = len(H.fail_reasons)
    call = getattr(request.node, "rep_call", None)
    if noted and call is not None and call.passed:
        pytest.fail("the harness noted: " + "; ".join(noted), pytrace=False)


def pytest_sessionfinish(session, exitstatus):
    if not H.began:
        return
    cleanup()  # after an interrupt
    if H.any_fail and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if H.table_text:
        terminalreporter.section("omps gpu-e2e summary")
        terminalreporter.write(H.table_text)
        terminalreporter.write_line(f"(logs in {H.out}: e2e.log, build.log, server.log, mps.log, bench.txt, table.txt)")
    extra = H.fail_reasons[_attributed[0]:] if H.began else []
    if extra:
        terminalreporter.write_line("failed outside any test: " + "; ".join(dict.fromkeys(extra)))


def pytest_keyboard_interrupt(excinfo):
    if H.began:
        H.fail("interrupted")
