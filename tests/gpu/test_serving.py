"""The serving benchmark of issue 25 on the GPU: replicas of PyTorch models (ResNet-50,
a BERT-shaped encoder, a CUDA-graph decoder), each a process serving one request at a
time under open-loop Poisson arrivals, with one more replica joining half-way, natively,
under NVIDIA MPS and under omps in one run; per model p50 / p99 / max before and after the
join, time to ready, and beside each row the M/D/1 interference-free limit. It exists as
one measure of the GPU harness, opt-in (`--serving`, or `--serving-only` as
`scripts/gpu-verify.sh serving` runs it: about six minutes). serving.py runs the replicas,
serving_report.py makes the table; this file only says which server each phase uses.

The alone latencies and the native and MPS runs are taken in the quiet phases (no omps
server); the omps run after every other omps test, on a fresh server. A mode that cannot
start (no MPS, no omps binaries) is reported and skipped; goals missed are reported in the
table, not failed: the test fails only when the benchmark could not run.
"""

import json
import subprocess
import threading
import time

import pytest

import e2e_summary as summary
import serving
import serving_report
from e2e import H, check, log, section

pytestmark = pytest.mark.group("serving")

STATE = {"cfg": None, "alone": None, "runs": {}, "report": None}


def _report():
    if STATE["cfg"] is None or STATE["alone"] is None:
        return None
    if STATE["report"] is None:
        STATE["report"] = serving_report.build(STATE["cfg"], STATE["alone"], STATE["runs"], H.gpu_desc)
    return STATE["report"]


def write_files():
    """$OUT/serving.txt (the table) and $OUT/serving.json (the report and every request)."""
    rep = _report()
    if rep is None:
        return
    text = "\n".join(serving_report.render(rep))
    (H.out / "serving.txt").write_text(text)
    with open(H.out / "serving.json", "w") as f:
        json.dump({"report": rep, "runs": STATE["runs"]}, f, separators=(",", ":"))
    H.write_log(f"\n==================== serving ====================\n{text}", console=False)


summary.at_end(write_files)
summary.block(60, lambda: serving_report.render(_report()) if _report() else
              (["## serving benchmark: not run (see e2e.log)", ""] if STATE["cfg"] else []))


def _wrap(mode):
    """The mode's wrapper of a replica's argv: `timeout` (and `env ...`) before python."""
    if mode == "native":
        return lambda argv, t: H.native(*argv, timeout=str(t))
    if mode == "mps":
        return lambda argv, t: H.as_mps(*argv, timeout=str(t))
    return lambda argv, t: H.as_omps(*argv, timeout=str(t))


def _run(mode):
    cfg = STATE["cfg"]
    if cfg is None or STATE["alone"] is None:
        STATE["runs"][mode] = serving.skipped(mode, "the alone latencies were not measured")
        check(False, f"serving {mode}: no alone latencies")
    work = H.work / "serving" / mode
    if mode != "native" and not serving.touch(cfg, _wrap(mode), work, log):
        log(f"serving {mode}: the warm-up client failed")
    sampler = _StatsSampler() if mode == "omps" else None
    try:
        r = serving.run_mode(cfg, mode, _wrap(mode), work, log)
    finally:
        if sampler:
            sampler.stop()
    STATE["runs"][mode] = r
    STATE["report"] = None
    check(r["status"] == "OK", f"serving {mode}: {r['reason']}")


class _StatsSampler:
    """`omps-ctl stats` every 2 s through the omps run, into $OUT/serving-stats.txt: each
    lane's records and longest record of the interval, and each client's share, so that a
    p99 far above its limit can be laid against what the lanes were doing (issue 25 asks
    for measurements from inside the server)."""

    def __init__(self, every=2.0):
        self.path = H.out / "serving-stats.txt"
        self.done = threading.Event()
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._loop, args=(every,), daemon=True)
        self.thread.start()

    def _loop(self, every):
        with open(self.path, "w") as f:
            while not self.done.wait(every):
                text = H.omps.ctl_stdout("stats")
                f.write(f"=== t {time.monotonic() - self.t0:.1f} s\n{text}\n")
                f.flush()

    def stop(self):
        self.done.set()
        self.thread.join(timeout=10)


@pytest.mark.phase(55)
def test_serving_alone():
    section("serving benchmark: alone latencies (native)")
    try:
        STATE["cfg"] = cfg = serving.config_from_env()
    except ValueError as e:
        check(False, f"serving: {e}")
    log(cfg.describe())
    if not cfg.fake:
        py = subprocess.run([cfg.python, "-c", "import torch, torchvision; print('torch', torch.__version__, "
                             "'cuda', torch.cuda.is_available())"], capture_output=True, text=True)
        log(f"{cfg.python}: " + " ".join((py.stdout or py.stderr).strip().splitlines()[-1:]))
        check(py.returncode == 0, f"serving: {cfg.python} cannot import torch and torchvision (SERVE_PYTHON)")
        check("cuda True" in py.stdout, f"serving: {cfg.python}'s torch sees no GPU")
    try:
        STATE["alone"] = serving.measure_alone(cfg, _wrap("native"), H.work / "serving", log)
    except RuntimeError as e:
        check(False, f"serving: {e}")


@pytest.mark.phase(56)
def test_serving_native():
    section("serving benchmark: native")
    _run("native")


@pytest.mark.phase(57)
def test_serving_mps():
    section("serving benchmark: NVIDIA MPS")
    if not H.mps.start():
        STATE["runs"]["mps"] = serving.skipped("mps", "NVIDIA MPS did not start (see e2e.log)")
        pytest.skip("NVIDIA MPS did not start")
    try:
        _run("mps")
    finally:
        H.mps.stop()


@pytest.mark.phase(95)
def test_serving_omps():
    section("serving benchmark: omps")
    if not H.omps_on:
        STATE["runs"]["omps"] = serving.skipped("omps", H.omps_note)
        log(f"skipped: {H.omps_note}")
        pytest.skip(H.omps_note)
    if H.cuda or H.rt:
        H.omps.restart()  # a fresh server, not the one the other omps tests used
    if not H.omps.ensure():
        STATE["runs"]["omps"] = serving.skipped("omps", "omps-server did not start")
        check(False, "serving omps: NO SERVER")
    _run("omps")
