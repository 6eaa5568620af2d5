"""Memory limits under omps with PyTorch: a client at a 2 GiB limit sees 2 GiB in
torch.cuda.mem_get_info and gets torch.OutOfMemoryError past it while a neighbour
without a limit allocates and computes as natively; a limit an operator raises (or lowers)
with omps-ctl while the client runs takes effect at its next allocation."""

import subprocess

import pytest

from harness import HERE, TIMEOUT, Mode, base_env, kill_group

CLIENT = HERE / "limit_client.py"
GIB = 1 << 30


class Client:
    def __init__(self, env):
        self.p = subprocess.Popen(
            ["python3", str(CLIENT)], env=dict(base_env(), **env), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        assert self.ask(None) == "ready", self.why()

    def ask(self, cmd):
        if cmd is not None:
            self.p.stdin.write(cmd + "\n")
            self.p.stdin.flush()
        line = self.p.stdout.readline().strip()
        if not line:
            pytest.fail(f"client said nothing to '{cmd}': {self.why()}", pytrace=False)
        return line

    def info(self):
        _, free, total = self.ask("info").split()
        return int(free), int(total)

    def why(self):
        if self.p.poll() is None:
            return "(still running)"
        return f"rc {self.p.returncode}; stderr:\n{self.p.stderr.read()[-3000:]}"

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.close()
                self.p.wait(timeout=30)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                kill_group(self.p)
        return self.p.returncode


@pytest.fixture
def clients():
    started = []
    yield started
    for c in started:
        if c.p.poll() is None:
            kill_group(c.p)


def test_limit_holds_and_a_neighbour_is_unaffected(omps_server, clients):
    native = Client({})
    clients.append(native)
    ref = native.ask("matmul")
    gpu_total = native.info()[1]
    native.close()

    env = omps_server.client_env(Mode.OMPS_PRELOAD)
    limited = Client(dict(env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=2G"))
    neighbour = Client(env)
    clients += [limited, neighbour]
    free, total = limited.info()
    assert total == 2 * GIB, f"mem_get_info total {total} under a 2G limit"
    assert 0 < free <= 2 * GIB
    assert limited.ask("alloc 1") == "ok"
    assert limited.ask("alloc 1.5") == "oom", "past the limit: torch.OutOfMemoryError"
    assert neighbour.ask("alloc 4") == "ok", "the neighbour has no limit"
    assert neighbour.info()[1] == gpu_total, "the neighbour sees the whole GPU"
    assert neighbour.ask("matmul") == ref, "the neighbour computes as natively"
    assert limited.ask("matmul") == ref, "the limited client still computes after its OOM"
    assert limited.close() == 0 and neighbour.close() == 0


def test_limit_changed_at_run_time(omps_server, clients):
    c = Client(omps_server.client_env(Mode.OMPS_PRELOAD))
    clients.append(c)
    pid = str(c.p.pid)
    r = omps_server.ctl_run("set_device_pinned_mem_limit", pid, "0", "2G")
    assert r.returncode == 0, r.stdout + r.stderr
    assert c.info()[1] == 2 * GIB
    assert c.ask("alloc 3") == "oom"
    r = omps_server.ctl_run("get_device_pinned_mem_limit", pid, "0")
    assert r.stdout.strip() == "2G", r.stdout + r.stderr
    assert omps_server.ctl_run("set_device_pinned_mem_limit", pid, "0", "4G").returncode == 0
    assert c.info()[1] == 4 * GIB, "the raised limit shows at once"
    assert c.ask("alloc 3") == "ok", "and holds at the next allocation"
    assert omps_server.ctl_run("set_device_pinned_mem_limit", pid, "0", "1G").returncode == 0
    assert c.ask("alloc 1") == "oom", "lowered below its use: the next allocation fails"
    assert c.ask("free") == "ok"
    assert c.ask("alloc 0.5") == "ok", "under the lowered limit once freed"
    assert c.close() == 0
