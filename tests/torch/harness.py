"""Process plumbing for the suite: the modes a CUDA client can run in, the omps server and
the NVIDIA MPS daemon, and running one workload in a subprocess. No pytest here: the
fixtures in conftest.py turn its exceptions into test failures.
"""

import enum
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORKLOADS = HERE / "workloads.py"
TIMEOUT = float(os.environ.get("TORCH_SUITE_TIMEOUT", "180"))
MPS_CONTROL = os.environ.get("MPS_CONTROL", "/usr/local/nvidia/bin/nvidia-cuda-mps-control")


class Mode(enum.Enum):
    NATIVE = "native"
    MPS = "mps"
    OMPS_PRELOAD = "preload"  # LD_PRELOAD=libomps_shim.so
    OMPS_LIBPATH = "libpath"  # a libcuda.so.1 -> shim symlink first on LD_LIBRARY_PATH


class WorkloadFailed(Exception):
    pass


def omps_bin():
    """OMPS_BIN (relative to the current directory or the repo), default target/release."""
    p = Path(os.environ.get("OMPS_BIN", REPO / "target" / "release"))
    if not p.is_absolute() and not p.exists():
        p = REPO / p
    return p.resolve()


def tail(path, lines=40):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"({path}: {e})"


def base_env():
    """The environment of every client: no inherited preload, deterministic cuBLAS."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    return env


class OmpsServer:
    """One omps-server on a fresh 0700 pipe directory, for the whole session."""

    def __init__(self, bindir, workdir):
        self.bin = Path(bindir)
        self.server, self.ctl, self.shim = (self.bin / n for n in ("omps-server", "omps-ctl", "libomps_shim.so"))
        missing = [str(p) for p in (self.server, self.ctl, self.shim) if not p.exists()]
        if missing:
            raise FileNotFoundError(
                f"omps binaries missing: {', '.join(missing)}. Build them (scripts/build-release.sh) "
                f"or point OMPS_BIN at the directory that holds them")
        self.pipe = tempfile.mkdtemp(prefix="omps-torch-pipe.")  # mkdtemp makes it 0700
        os.chmod(self.pipe, 0o700)
        self.logdir = Path(workdir) / "omps-log"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.server_log = self.logdir / "server.log"  # written by the server itself
        # The other way in: a directory whose libcuda.so.1 is the shim (as scripts/gpu-e2e.sh).
        self.libdir = tempfile.mkdtemp(prefix="omps-torch-libdir.")
        for n in ("libcuda.so.1", "libcuda.so"):
            os.symlink(self.shim, os.path.join(self.libdir, n))
        self.proc = None

    def ctl_run(self, *args, timeout=10):
        env = dict(base_env(), OMPS_PIPE_DIRECTORY=self.pipe)
        return subprocess.run([str(self.ctl), *args], env=env, capture_output=True, text=True, timeout=timeout)

    def start(self):
        env = dict(base_env(), OMPS_PIPE_DIRECTORY=self.pipe, OMPS_LOG_DIRECTORY=str(self.logdir))
        out = open(self.logdir / "server.out", "wb")
        self.proc = subprocess.Popen([str(self.server)], env=env, stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT)
        t0 = time.time()
        while time.time() - t0 < 20:
            if self.proc.poll() is not None:
                raise RuntimeError(f"omps-server exited at start (rc {self.proc.returncode}):\n"
                                   f"{tail(self.logdir / 'server.out')}")
            try:
                if self.ctl_run("status").returncode == 0:
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("omps-server did not answer 'omps-ctl status' within 20 s")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def wait_active(self, timeout=10.0):
        """Seconds until `get_server_status` says ACTIVE (after a fault the server recovers
        by itself, under the same PID), or None if it does not within `timeout`."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            try:
                r = self.ctl_run("get_server_status", str(self.proc.pid))
                if r.stdout.strip() == "ACTIVE":
                    return time.time() - t0
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.05)
        return None

    def stop(self):
        """omps-ctl quit; returns a problem description, or "" if it stopped cleanly."""
        if self.proc is None:
            return ""
        problem = ""
        if self.proc.poll() is not None:
            problem = f"omps-server had already exited (rc {self.proc.returncode})"
        else:
            try:
                self.ctl_run("quit")
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                problem = "omps-server still running 10 s after 'omps-ctl quit': killed"
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        for d in (self.pipe, self.libdir):  # logs stay in workdir
            shutil.rmtree(d, ignore_errors=True)
        return problem

    def client_env(self, mode):
        env = {"OMPS_PIPE_DIRECTORY": self.pipe}
        if mode is Mode.OMPS_PRELOAD:
            env["LD_PRELOAD"] = str(self.shim)
        elif mode is Mode.OMPS_LIBPATH:
            old = os.environ.get("LD_LIBRARY_PATH")
            env["LD_LIBRARY_PATH"] = self.libdir + (":" + old if old else "")
        else:
            raise ValueError(mode)
        return env

    def ps_pids(self):
        """PIDs in `omps-ctl ps` (MPS's columns, PID first, then omps's; a row per client and
        GPU; clients still being torn down end in '(exiting)' and are listed too)."""
        r = self.ctl_run("ps")
        if r.returncode != 0:
            raise RuntimeError(f"omps-ctl ps failed: {r.stderr}")
        return {int(line.split()[0]) for line in r.stdout.splitlines()[1:] if line.strip()}

    def diagnostics(self):
        return (f"omps-server {'alive' if self.alive() else 'NOT RUNNING'}; "
                f"last lines of {self.server_log}:\n{tail(self.server_log, 20)}")


def mps_procs():
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                exe = os.readlink(d / "exe")
            except OSError:
                continue
            if os.path.basename(exe) in ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
                pids.append(int(d.name))
    return pids


class MpsDaemon:
    """NVIDIA MPS, for comparison runs (the default tests do not use it)."""

    def __init__(self, workdir):
        if not os.access(MPS_CONTROL, os.X_OK):
            raise FileNotFoundError(f"nvidia-cuda-mps-control not found at {MPS_CONTROL} (set MPS_CONTROL)")
        self.pipe = tempfile.mkdtemp(prefix="omps-torch-mps-pipe.")
        self.logdir = str(Path(workdir) / "mps-log")
        os.makedirs(self.logdir, exist_ok=True)

    def env(self):
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe, "CUDA_MPS_LOG_DIRECTORY": self.logdir}

    def start(self):
        if mps_procs():
            raise RuntimeError(f"an MPS daemon already runs (pids {mps_procs()}): not starting another")
        env = dict(base_env(), **self.env())
        env["PATH"] = os.path.dirname(MPS_CONTROL) + ":" + env.get("PATH", "")
        subprocess.run([MPS_CONTROL, "-d"], env=env, check=True, timeout=30, stdin=subprocess.DEVNULL)
        for _ in range(50):
            if os.path.exists(os.path.join(self.pipe, "control")):
                return
            time.sleep(0.1)
        raise RuntimeError("MPS control pipe did not appear within 5 s")

    def stop(self):
        subprocess.run([MPS_CONTROL], input="quit\n", text=True, timeout=20,
                       env=dict(base_env(), **self.env()))
        t0 = time.time()
        while mps_procs() and time.time() - t0 < 30:
            time.sleep(0.2)
        return f"MPS processes still running 30 s after quit: {mps_procs()}" if mps_procs() else ""


def start_client(argv, env, log_prefix):
    """Starts a Python client with stdout/stderr in files; its own process group, so a
    timeout can end it and anything it started (e.g. compile workers) by that group's id."""
    out = open(f"{log_prefix}.stdout", "wb")
    err = open(f"{log_prefix}.stderr", "wb")
    p = subprocess.Popen([sys.executable, *argv], env=env, stdin=subprocess.DEVNULL,
                         stdout=out, stderr=err, start_new_session=True)
    p.log_prefix = log_prefix
    return p


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def run_workload(name, mode, extra_env, mode_env, workdir, tag="", timeout=TIMEOUT, diag=None):
    """Runs workloads.py NAME in a fresh process; returns (result dict, seconds)."""
    import torch  # only the harness's parent process needs it to load the results

    prefix = str(Path(workdir) / f"{name}.{mode.value}{tag}")
    outfile = prefix + ".pt"
    Path(outfile).unlink(missing_ok=True)  # never read a result an earlier session left
    env = dict(base_env(), **extra_env, **mode_env)
    t0 = time.time()
    p = start_client([str(WORKLOADS), name, outfile], env, prefix)
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(p)
        rc = f"timeout after {timeout:.0f} s"
    secs = time.time() - t0
    if rc != 0 or not os.path.exists(outfile):
        msg = (f"workload {name} ({mode.value}) failed: rc {rc}\n--- stderr tail ({prefix}.stderr):\n"
               f"{tail(prefix + '.stderr')}\n--- stdout tail:\n{tail(prefix + '.stdout', 10)}")
        if diag:
            msg += "\n--- " + diag()
        raise WorkloadFailed(msg)
    return torch.load(outfile, weights_only=False), secs
