"""Fixtures: the omps server (and, only if asked for, NVIDIA MPS), native results cached
for the session, and run_workload(name, mode).

Environment:
  OMPS_BIN             directory with omps-server, omps-ctl, libomps_shim.so (default target/release)
  TORCH_SUITE_OUT      keep logs, results and results.tsv here (default: a temporary directory)
  TORCH_SUITE_WAYS     comma list of client ways for test_parity (default preload,libpath; add mps)
  TORCH_SUITE_NATIVE_RUNS  native runs of exact workloads (default 1; 2 checks that they are exact)
  TORCH_SUITE_TIMEOUT  seconds per workload process (default 180)
  TORCH_SUITE_STRICT=1 known-broken workloads are plain tests, not xfail
"""

import os
import sys
import tempfile
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
    return {"TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor-cache"),
            "TRITON_CACHE_DIR": str(workdir / "triton-cache")}


@pytest.fixture(scope="session")
def omps_server(workdir):
    try:
        srv = harness.OmpsServer(harness.omps_bin(), workdir)
        srv.start()
    except (FileNotFoundError, RuntimeError) as e:
        pytest.fail(f"cannot start omps: {e}", pytrace=False)  # never a silent skip
    yield srv
    problem = srv.stop()
    if problem:
        pytest.fail(f"omps-server did not stop cleanly: {problem}\n{srv.diagnostics()}", pytrace=False)


@pytest.fixture(scope="session")
def mps_daemon(workdir):
    """NVIDIA MPS: started only when a test asks for Mode.MPS (TORCH_SUITE_WAYS=...,mps)."""
    try:
        d = harness.MpsDaemon(workdir)
        d.start()
    except (FileNotFoundError, RuntimeError, OSError) as e:
        pytest.fail(f"cannot start NVIDIA MPS: {e}", pytrace=False)
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
    """run_workload(name, mode, tag="") -> (result dict, seconds); fails the test with the
    client's stderr tail (and the server's state) if it does not finish cleanly."""
    import workloads

    def run(name, mode, tag=""):
        mode_env, diag = _mode_env(request, mode)
        env = dict(session_env, **workloads.REGISTRY[name].env)
        return harness.run_workload(name, mode, env, mode_env, workdir, tag=tag, diag=diag)

    return run


class NativeRef:
    def __init__(self, runs):
        self.result, self.seconds = runs[0]
        self.spread = compare.spread(runs[0][0], runs[1][0]) if len(runs) > 1 else {}
        self.runs = len(runs)


@pytest.fixture(scope="session")
def native(workdir, session_env):
    """native(name) -> NativeRef, run once per session (twice for tolerance workloads, to
    measure the run-to-run spread; TORCH_SUITE_NATIVE_RUNS=2 does that for all)."""
    import workloads

    cache = {}
    min_runs = int(os.environ.get("TORCH_SUITE_NATIVE_RUNS", "1"))

    def get(name):
        if name not in cache:
            wl = workloads.REGISTRY[name]
            env = dict(session_env, **wl.env)
            runs = []
            try:
                for i in range(max(min_runs, 1 if wl.exact else 2)):
                    runs.append(harness.run_workload(name, Mode.NATIVE, env, {}, workdir, tag=f".{i}"))
                    if "__skip__" in runs[-1][0]:
                        break
                cache[name] = NativeRef(runs)
            except harness.WorkloadFailed as e:
                cache[name] = e
        if isinstance(cache[name], Exception):
            pytest.fail(f"native run failed, nothing to compare with:\n{cache[name]}", pytrace=False)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def results_tsv():
    """record(**row): one line per test in $TORCH_SUITE_OUT/results.tsv (if set)."""
    out = os.environ.get("TORCH_SUITE_OUT")
    cols = ["workload", "way", "comparison", "max_abs_diff", "tolerance", "result", "native_s", "client_s", "note"]
    path = Path(out) / "results.tsv" if out else None
    if path and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\t".join(cols) + "\n")

    def record(**row):
        if path:
            with open(path, "a") as f:
                f.write("\t".join(str(row.get(c, "")) for c in cols) + "\n")

    return record
