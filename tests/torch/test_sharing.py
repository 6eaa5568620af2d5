"""Several PyTorch processes on one omps server at once: they must all get native results,
and a client killed with SIGKILL mid-inference must not disturb the others."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from harness import HERE, TIMEOUT, Mode, base_env, kill_group, start_client, tail

LOOP = HERE / "infer_loop.py"


def _loop(tag, workdir, iters, env, barrier=None, srv=None):
    prefix = str(workdir / f"loop-{tag}")
    Path(prefix + ".pt").unlink(missing_ok=True)
    argv = [str(LOOP), "--iters", str(iters), "--out", prefix + ".pt"]
    if barrier:
        argv += ["--barrier", str(barrier)]
    p = start_client(argv, dict(base_env(), **env), prefix)
    p.tag, p.srv = tag, srv
    return p


def _why(p):
    why = f"client {p.tag} (pid {p.pid}) rc {p.poll()}; stderr tail:\n{tail(p.log_prefix + '.stderr')}"
    return why + ("\n--- " + p.srv.diagnostics() if p.srv else "")


def _wait_line(p, word, timeout=TIMEOUT):
    """Waits until the client has printed `word` on a line of its own."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if word in Path(p.log_prefix + ".stdout").read_text(errors="replace").split():
            return
        if p.poll() is not None:
            pytest.fail(f"exited before printing '{word}': {_why(p)}", pytrace=False)
        time.sleep(0.05)
    pytest.fail(f"did not print '{word}' within {timeout:.0f} s: {_why(p)}", pytrace=False)


def _finish(p):
    try:
        rc = p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        kill_group(p)
        rc = "timeout"
    if rc != 0:
        pytest.fail(f"did not finish cleanly: {_why(p)}", pytrace=False)
    return torch.load(p.log_prefix + ".pt", weights_only=False)


def _check(res, ref, tag):
    assert res["mismatches"] == 0, f"{tag}: {res['mismatches']} of {res['iters']} iterations differed from its first"
    for key in ("out", "last"):
        assert torch.equal(res[key].view(torch.int16), ref["out"].view(torch.int16)), \
            f"{tag}: '{key}' output not bit-identical to the native run (exact comparison)"


def _gone(srv, pid, within=5.0):
    t0 = time.time()
    while pid in srv.ps_pids():
        if time.time() - t0 > within:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture(scope="module")
def loop_ref(workdir):
    """The loop's output natively (the same model and input as every client)."""
    p = _loop("native", workdir, 3, {})
    return _finish(p)


@pytest.fixture
def clients():
    started = []
    yield started
    for p in started:  # only our own clients, by their process group
        if p.poll() is None:
            kill_group(p)


def test_two_clients_at_once(omps_server, workdir, loop_ref, clients):
    barrier = workdir / "go-two"
    barrier.unlink(missing_ok=True)
    # One client per way in, to show the two ways side by side on one server.
    a = _loop("two-preload", workdir, 100, omps_server.client_env(Mode.OMPS_PRELOAD), barrier, omps_server)
    b = _loop("two-libpath", workdir, 100, omps_server.client_env(Mode.OMPS_LIBPATH), barrier, omps_server)
    clients += [a, b]
    for p in (a, b):
        _wait_line(p, "ready")
    listed = omps_server.ps_pids()
    assert {a.pid, b.pid} <= listed, f"omps-ctl ps lists {sorted(listed)}, not both clients {a.pid} {b.pid}"
    barrier.touch()  # both start their loops together, on the GPU at the same time
    for p in (a, b):
        _check(_finish(p), loop_ref, p.tag)
    for p in (a, b):
        assert _gone(omps_server, p.pid), f"omps-ctl ps still lists {p.tag} (pid {p.pid}) 5 s after it exited"


def test_killed_client_spares_the_other(omps_server, workdir, loop_ref, clients):
    barrier = workdir / "go-kill"
    barrier.unlink(missing_ok=True)
    env = omps_server.client_env(Mode.OMPS_PRELOAD)
    victim = _loop("victim", workdir, 10**6, env, barrier, omps_server)  # runs until killed
    survivor = _loop("survivor", workdir, 300, env, barrier, omps_server)
    clients += [victim, survivor]
    for p in (victim, survivor):
        _wait_line(p, "ready")
    assert victim.pid in omps_server.ps_pids(), "the victim is not listed by omps-ctl ps"
    barrier.touch()
    for p in (victim, survivor):
        _wait_line(p, "running")
    # Both are inside their loops now; the survivor's 300 iterations take well over a second.
    assert survivor.poll() is None, "survivor finished before the kill: raise its iteration count"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    _check(_finish(survivor), loop_ref, "survivor")
    assert _gone(omps_server, victim.pid), f"omps-ctl ps still lists the killed client (pid {victim.pid}) after 5 s"
    st = omps_server.ctl_run("status")
    assert st.returncode == 0 and "FAULT" not in st.stdout.splitlines()[0], \
        f"server unhealthy after the kill:\n{st.stdout}{st.stderr}\n{omps_server.diagnostics()}"
