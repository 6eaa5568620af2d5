"""Fixtures: the omps server (and, only if asked for, NVIDIA MPS), native results cached
for the session, and run_workload(name, mode).

Environment:
  OMPS_BIN             directory with omps-server, omps-ctl, libomps_shim.so (default target/release)
  TORCH_SUITE_OUT      keep logs, results and results.tsv here (default: a temporary directory)
  TORCH_SUITE_WAYS     comma list of client ways for test_parity (default preload,libpath; add mps)
  TORCH_SUITE_NATIVE_RUNS  native runs of exact workloads (default 1; 2 checks that they are exact)
  TORCH_SUITE_NATIVE_JOBS  native runs at a time, in the background (default 3)
  TORCH_SUITE_TIMEOUT  seconds per workload process (default 180)
  TORCH_SUITE_STRICT=1 known-broken workloads are plain tests, not xfail
"""

import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare  # noqa: E402
import harness  # noqa: E402
from harness import Mode  # noqa: E402


@pytest.fixture(scope="session")
def workdir():
    out = os.environ.get("TORCH_SUITE_OUT")
    if out:
        d = Path(out) / "work"
        d.mkdir(parents=True, exist_ok=True)
        return d
    return Path(tempfile.mkdtemp(prefix="omps-torch-suite."))


@pytest.fixture(scope="session")
def session_env(workdir):
    """Extra env for every workload process. One inductor/Triton cache per session, shared
    by all modes: omps runs reuse the kernels the native run compiled and tuned, so the
    compile workload can be compared exactly (and is not recompiled four times)."""
    cache = Path(tempfile.mkdtemp(prefix="compile-cache.", dir=workdir))  # fresh each session
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}


@pytest.fixture(scope="session")
def omps_server(workdir):
    srv, why = None, ""
    try:
        srv = harness.OmpsServer(harness.omps_bin(), workdir)
        srv.start()
    except (FileNotFoundError, RuntimeError) as e:
        why = str(e)
    if why:
        pytest.fail(f"cannot start omps: {why}", pytrace=False)  # never a silent skip
    yield srv
    problem = srv.stop()
    if problem:
        pytest.fail(f"omps-server did not stop cleanly: {problem}\n{srv.diagnostics()}", pytrace=False)


@pytest.fixture(scope="session")
def mps_daemon(workdir):
    """NVIDIA MPS: started only when a test asks for Mode.MPS (TORCH_SUITE_WAYS=...,mps)."""
    d, why = None, ""
    try:
        d = harness.MpsDaemon(workdir)
        d.start()
    except (FileNotFoundError, RuntimeError, OSError) as e:
        why = str(e)
    if why:
        pytest.fail(f"cannot start NVIDIA MPS: {why}", pytrace=False)
    yield d
    problem = d.stop()
    if problem:
        pytest.fail(problem, pytrace=False)


def _mode_env(request, mode):
    """The env to add for a client in `mode`, starting its daemon on first use."""
    if mode is Mode.NATIVE:
        return {}, None
    if mode is Mode.MPS:
        return request.getfixturevalue("mps_daemon").env(), None
    srv = request.getfixturevalue("omps_server")
    return srv.client_env(mode), srv.diagnostics


@pytest.fixture
def run_workload(request, workdir, session_env):
    """run_workload(name, mode) -> (result dict, seconds); raises harness.WorkloadFailed,
    with the client's stderr tail and the server's state, if it does not finish cleanly."""
    import workloads

    def run(name, mode, tag="", timeout=harness.TIMEOUT):
        mode_env, diag = _mode_env(request, mode)
        env = dict(session_env, **workloads.REGISTRY[name].env)
        return harness.run_workload(name, mode, env, mode_env, workdir, tag=tag, timeout=timeout, diag=diag)

    return run


class NativeRef:
    def __init__(self, runs):
        self.result, self.seconds = runs[0]
        self.spread = compare.spread(runs[0][0], runs[1][0]) if len(runs) > 1 else {}
        self.runs = len(runs)


def _native_runs(name, workdir, session_env):
    """NativeRef for one workload, or the WorkloadFailed of its native run."""
    import workloads

    wl = workloads.REGISTRY[name]
    env = dict(session_env, **wl.env)
    runs = []
    try:
        for i in range(max(int(os.environ.get("TORCH_SUITE_NATIVE_RUNS", "1")), 1 if wl.exact else 2)):
            runs.append(harness.run_workload(name, Mode.NATIVE, env, {}, workdir, tag=f".{i}"))
            if "__skip__" in runs[-1][0]:
                break
        return NativeRef(runs)
    except harness.WorkloadFailed as e:
        return e


@pytest.fixture(scope="session")
def native(request, workdir, session_env):
    """native(name) -> NativeRef: each workload run natively once per session (twice for
    tolerance workloads, to measure the run-to-run spread; TORCH_SUITE_NATIVE_RUNS=2 does
    that for all). The native runs of every selected test start at once in the background,
    TORCH_SUITE_NATIVE_JOBS (default 3) at a time, so they overlap the omps runs: results do
    not depend on what else runs on the GPU, only the seconds in results.tsv do."""
    names = []
    for item in request.session.items:
        n = getattr(item, "callspec", None) and item.callspec.params.get("name")
        if n and n not in names:
            names.append(n)
    pool = ThreadPoolExecutor(max_workers=int(os.environ.get("TORCH_SUITE_NATIVE_JOBS", "3")))
    futures = {n: pool.submit(_native_runs, n, workdir, session_env) for n in names}

    def get(name):
        if name not in futures:
            futures[name] = pool.submit(_native_runs, name, workdir, session_env)
        ref = futures[name].result()
        if isinstance(ref, Exception):
            pytest.fail(f"native run failed, nothing to compare with:\n{ref}", pytrace=False)
        return ref

    yield get
    pool.shutdown(wait=True, cancel_futures=True)


COLUMNS = ["workload", "way", "comparison", "max_abs_diff", "tolerance", "result", "native_s", "client_s", "note"]
ROWS = []


@pytest.fixture(scope="session")
def results_tsv():
    """record(**row): one row per parity test, printed as a table at the end of the run and
    appended to $TORCH_SUITE_OUT/results.tsv if that is set."""
    out = os.environ.get("TORCH_SUITE_OUT")
    path = Path(out) / "results.tsv" if out else None
    if path:  # this session's results only
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\t".join(COLUMNS) + "\n")

    def record(**row):
        ROWS.append([str(row.get(c, "")) for c in COLUMNS])
        if path:
            with open(path, "a") as f:
                f.write("\t".join(ROWS[-1]) + "\n")

    return record


def pytest_terminal_summary(terminalreporter):
    if not ROWS:
        return
    widths = [max(len(r[i]) for r in ROWS + [COLUMNS]) for i in range(len(COLUMNS))]
    terminalreporter.section("omps parity results")
    for r in [COLUMNS] + ROWS:
        terminalreporter.write_line("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
