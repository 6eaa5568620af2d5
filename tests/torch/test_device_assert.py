"""A device-side assert in PyTorch's own (compressed) kernels: the process gets PyTorch's
RuntimeError and the assert's message on its own stderr, as natively. An assert ends the
GPU context, which under omps is the server's, so this test runs its own omps server; the
server must be ACTIVE again by itself once the process is gone, and serve the next one."""

import subprocess
from pathlib import Path

import pytest

from harness import TIMEOUT, Mode, OmpsServer, base_env, omps_bin, start_client, tail, kill_group

SCRIPT = """
import torch
x = torch.zeros(10, device="cuda")
torch.cuda.synchronize()
print("before the assert", flush=True)
try:
    x[torch.tensor([20], device="cuda")]
    torch.cuda.synchronize()
    print("no error", flush=True)
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0], flush=True)
"""


def _run(tag, workdir, env):
    prefix = str(Path(workdir) / f"assert.{tag}")
    p = start_client(["-c", SCRIPT], dict(base_env(), **env), prefix)
    try:
        rc = p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        kill_group(p)
        pytest.fail(f"{tag}: timed out; stderr:\n{tail(prefix + '.stderr')}", pytrace=False)
    out = Path(prefix + ".stdout").read_text(errors="replace")
    err = Path(prefix + ".stderr").read_text(errors="replace")
    assert rc == 0, f"{tag}: rc {rc}\n{err}"
    return out, [line for line in err.splitlines() if "Assertion" in line]


@pytest.mark.parametrize("mode", [Mode.OMPS_PRELOAD, Mode.OMPS_LIBPATH], ids=lambda m: m.value)
def test_an_asserts_message_reaches_the_process(mode, workdir):
    native_out, native_asserts = _run("native", workdir, {})
    assert "device-side assert triggered" in native_out, native_out
    assert native_asserts, "natively the message is on stderr"
    srv = OmpsServer(omps_bin(), Path(workdir) / f"assert-{mode.value}")
    srv.start()
    try:
        out, asserts = _run(mode.value, workdir, srv.client_env(mode))
        # The assert faulted the server's context; once its client is gone it is ACTIVE
        # again by itself, and serves the next PyTorch process as natively.
        recovered = srv.wait_active()
        again = _run(mode.value + "-after", workdir, srv.client_env(mode))[0] if recovered is not None else None
    finally:
        problem = srv.stop()
    assert recovered is not None, f"not ACTIVE 10 s after the fault:\n{tail(srv.server_log, 20)}"
    assert again == native_out, f"after the recovery:\n{again}\n--- native:\n{native_out}"
    assert out == native_out, f"stdout differs from native:\n{out}\n--- native:\n{native_out}"
    assert asserts == native_asserts, (
        f"assert messages differ from native:\n{asserts}\n--- native:\n{native_asserts}\n--- "
        f"server log:\n{tail(srv.server_log, 20)}")
    assert not problem, problem
