"""The two servers the GPU harness compares against native runs: omps-server (started on a
fresh 0700 pipe directory, restarted when it dies, checked to come back ACTIVE after a
fault, stopped with `omps-ctl quit`) and NVIDIA's MPS control daemon (on its own pipe and
log directories). It exists so that the tests ask for a server instead of managing one;
each step is the one scripts/gpu-e2e.sh took before issue 24, with the same messages.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from e2e import H, indented, log, lines_of, now_ns, run, spawn, alive, bash_rc

CTL_TIMEOUT = ["timeout", "-k", "2", "10"]


class Omps:
    def __init__(self):
        self.proc = None       # the running server (gpu-e2e.sh's SERVER_PID)
        self.pipe = ""
        self.n = 0             # servers started so far
        self.restarts_left = 3
        self.libdir = ""

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None else None

    # ------------------------------------------------------------ omps-ctl

    def _ctl_argv(self, args):
        return [*CTL_TIMEOUT, H.ctl, *args]

    def ctl_to(self, out, *args, err=None):
        """`omps-ctl ARGS > out 2>&1` (or 2> err); its exit status."""
        return run(self._ctl_argv(args), out, err, env={"OMPS_PIPE_DIRECTORY": self.pipe})

    def ctl_stdout(self, *args):
        """`$(omps-ctl ARGS 2>/dev/null)`: stdout less its trailing newlines."""
        r = subprocess.run([str(a) for a in self._ctl_argv(args)], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           env=dict(os.environ, OMPS_PIPE_DIRECTORY=self.pipe))
        return r.stdout.decode("utf-8", errors="replace").rstrip("\n")

    # ------------------------------------------------------------ start, stop

    def start(self):
        self.n += 1
        self.pipe = tempfile.mkdtemp(prefix="omps-e2e-pipe.", dir="/tmp")
        os.chmod(self.pipe, 0o700)
        logdir = H.work / f"omps-log-{self.n}"
        logdir.mkdir(parents=True, exist_ok=True)
        log(f"starting omps-server #{self.n} (pipe dir {self.pipe})")
        self.proc = spawn([H.server], H.work / f"server-{self.n}.out",
                          env={"OMPS_PIPE_DIRECTORY": self.pipe, "OMPS_LOG_DIRECTORY": str(logdir)})
        t0 = now_ns()
        status = H.work / f"status-{self.n}.out"
        while now_ns() - t0 < 10_000_000_000:
            if self.ctl_to(status, "status") == 0:
                log(f"omps-server up after {(now_ns() - t0) // 1_000_000} ms (pid {self.proc.pid})")
                indented(lines_of(status))
                return True
            if not alive(self.proc):
                self.proc.wait()
                log(f"omps-server exited early with rc={bash_rc(self.proc)}")
                self.proc = None
                return False
            time.sleep(0.1)
        log("omps-server did not answer 'omps-ctl status' within 10 s")
        return False

    def stop(self):
        if self.proc is None:
            return
        log("stopping omps-server (omps-ctl quit)")
        rc = self.ctl_to(H.work / f"quit-{self.n}.out", "quit")
        log(f"omps-ctl quit rc={rc}")
        for _ in range(100):
            if not alive(self.proc):
                break
            time.sleep(0.1)
        if alive(self.proc):
            log(f"omps-server still running 10 s after quit: sending SIGTERM to {self.proc.pid}")
            H.fail("omps-server still running 10 s after omps-ctl quit")
            self.signal(signal.SIGTERM)
            time.sleep(3)
            if alive(self.proc):
                self.signal(signal.SIGKILL)
        self.proc.wait()
        log(f"omps-server exit status {bash_rc(self.proc)}")
        self.proc = None

    def signal(self, sig):
        try:
            self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def ensure(self):
        """The server is running: restarted if it died (at most 3 times a run)."""
        if not H.omps_on:
            return False
        if alive(self.proc):
            return True
        if self.proc is not None:
            self.proc.wait()
            log(f"omps-server (pid {self.proc.pid}) has died with status {bash_rc(self.proc)}")
            self.proc = None
            H.fail("omps-server died")
        if self.restarts_left <= 0:
            return False
        self.restarts_left -= 1
        if not self.start():
            log("omps-server failed to start")
            H.fail("omps-server failed to start")
            return False
        return True

    def restart(self):
        self.stop()
        if not self.start():
            log("omps-server failed to start")
            H.fail("omps-server failed to start")

    def await_active(self):
        """After a GPU fault the server recovers by itself once the faulting client is gone
        (recreating its context, or starting itself again under the same PID)."""
        t0 = now_ns()
        while now_ns() - t0 < 10_000_000_000:
            if self.ctl_stdout("get_server_status", self.pid or "") == "ACTIVE":
                log(f"omps-server ACTIVE again {(now_ns() - t0) // 1_000_000} ms after the faulting client ended")
                return True
            time.sleep(0.05)
        return False

    def make_libdir(self):
        """A directory in which libcuda.so.1 and libcuda.so are symlinks to the shim."""
        if self.libdir:
            return True
        try:
            self.libdir = tempfile.mkdtemp(prefix="omps-libdir.", dir=H.work)
            for n in ("libcuda.so.1", "libcuda.so"):
                os.symlink(H.shim, os.path.join(self.libdir, n))
        except OSError:
            return False
        log(f"omps library directory {self.libdir}:")
        for n in sorted(os.listdir(self.libdir)):
            p = os.path.join(self.libdir, n)
            log(f"    {p} -> {os.readlink(p)}")
        return True

    def collect_log(self):
        """Every server's output and log files into $OUT/server.log; its end into the log."""
        dest = H.out / "server.log"
        with open(dest, "wb") as f:
            for p in sorted(H.work.glob("server-*.out")) + sorted(H.work.glob("omps-log-*/*")):
                if p.is_file():
                    f.write(f"=== {p}\n".encode() + p.read_bytes())
        log("--- last 50 lines of the server log:")
        indented(lines_of(dest)[-50:])


def mps_procs():
    """PIDs of running MPS control daemons and servers (by executable name)."""
    pids = []
    for d in sorted(Path("/proc").glob("[0-9]*"), key=lambda d: d.name):
        try:
            exe = os.readlink(d / "exe")
        except OSError:
            continue
        if os.path.basename(exe) in ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
            pids.append(d.name)
    return pids


class Mps:
    def __init__(self):
        self.control = (os.environ.get("MPS_CONTROL") or shutil.which("nvidia-cuda-mps-control")
                        or "/usr/local/nvidia/bin/nvidia-cuda-mps-control")
        self.pipe = f"/tmp/omps-e2e-mps-pipe.{os.getpid()}"
        self.logd = f"/tmp/omps-e2e-mps-log.{os.getpid()}"
        self.up = False

    def start(self):
        if not os.access(self.control, os.X_OK):
            log(f"nvidia-cuda-mps-control not found ({self.control})")
            return False
        running = mps_procs()
        if running:
            log(f"an MPS daemon is already running (pids {''.join(p + ' ' for p in running)}): not starting another")
            return False
        os.makedirs(self.pipe, exist_ok=True)
        os.makedirs(self.logd, exist_ok=True)
        log(f"starting NVIDIA MPS: {self.control} -d (pipe {self.pipe}, logs {self.logd})")
        rc = run([self.control, "-d"], H.work / "mps-control.out", append=True,
                 env={"CUDA_MPS_PIPE_DIRECTORY": self.pipe, "CUDA_MPS_LOG_DIRECTORY": self.logd,
                      "PATH": os.path.dirname(self.control) + ":" + os.environ.get("PATH", "")})
        if rc != 0:
            log(f"nvidia-cuda-mps-control -d failed rc={rc}")
            return False
        for _ in range(50):
            if os.path.exists(os.path.join(self.pipe, "control")):
                break
            time.sleep(0.1)
        self.up = True
        return True

    def stop(self):
        if not self.up:
            return
        log("stopping NVIDIA MPS (echo quit | nvidia-cuda-mps-control)")
        with open(H.work / "mps-control.out", "ab") as out:
            subprocess.run(["timeout", "20", self.control], input=b"quit\n", stdout=out, stderr=subprocess.STDOUT,
                           env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=self.pipe))
        t0 = now_ns()
        while True:
            left = mps_procs()
            if not left:
                break
            if now_ns() - t0 > 30_000_000_000:
                log(f"MPS processes still running 30 s after quit: {''.join(p + ' ' for p in left)}")
                H.fail("MPS processes still running 30 s after quit")
                break
            time.sleep(0.2)
        log(f"NVIDIA MPS stopped after {(now_ns() - t0) // 1_000_000} ms")
        self.up = False

    def collect_log(self):
        """The control daemon's output and MPS's logs into $OUT/mps.log, if MPS ran."""
        ctl_out = H.work / "mps-control.out"
        if not (os.path.isdir(self.logd) or ctl_out.is_file()):
            return
        with open(H.out / "mps.log", "wb") as f:
            for p in [ctl_out] + sorted(Path(self.logd).glob("*")):
                if p.is_file():
                    f.write(f"=== {p}\n".encode() + p.read_bytes())
