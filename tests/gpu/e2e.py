"""The GPU harness's core, shared by every file of tests/gpu: its settings (paths, options,
timeouts), the log ($OUT/e2e.log), running a program with its output in files and judging
it, and the run's record of failures. It exists so that a test file holds only what its
test does; the commands, timeouts and verdicts are those of scripts/gpu-e2e.sh before
issue 24, kept byte for byte where they reach a program (`timeout -k 5 ...`, `env ...`).
"""

import datetime
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SRC = ROOT / "tests" / "cuda"
RTSRC = SRC / "rt"

# Rounds of a run, by phase (the pytest mark `phase(N)` every test carries; tests run in
# phase order): the first omps server serves phases below QUIET; from QUIET to AGAIN no
# omps server runs (native and NVIDIA MPS are timed then); from AGAIN on a fresh one serves.
QUIET = 40
AGAIN = 60

KILL_SURVIVORS = 7
VANDAL_SURVIVORS = 4
CONC_NS = (1, 4, 8)
START_LEAD_NS = 3_000_000_000  # concurrency copies start together 3 s after launch


def now_ns():
    return time.time_ns()


def tdiv(a, b):
    """Integer division as bash's $(( a / b )): truncated toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def omps_bin():
    """OMPS_BIN (relative to the current directory or the repo), default target/release."""
    p = Path(os.environ.get("OMPS_BIN") or ROOT / "target" / "release")
    if not p.is_absolute() and not p.exists():
        p = ROOT / p
    return p.resolve()


def find_nvcc():
    for c in (os.environ.get("NVCC", ""), shutil.which("nvcc") or "",
              "/usr/local/cuda/bin/nvcc", "/usr/local/cuda-13.0/bin/nvcc"):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


class Harness:
    """Settings and shared state of one run; `H` below is the one instance."""

    def configure(self, native_only=False, reps=3, rt=True, rt_only=False, gpu_required=False,
                  serving=False, serving_only=False, serving_fake=False):
        """The groups that run (e2e_summary.enabled): cuda unless --rt-only, rt unless
        --no-rt; serving (opt-in) with --serving or --serving-only, which alone runs;
        host (the serving benchmark's tests without a GPU) with --serving-fake, alone."""
        self.native_only, self.reps, self.rt_only = native_only, reps, rt_only
        alone = serving_only or serving_fake
        self.cuda, self.rt = not rt_only and not alone, rt and not alone
        self.serving, self.host = (serving or serving_only) and not serving_fake, serving_fake
        self.gpu_required = gpu_required
        self.build = Path(os.environ.get("BUILD") or "/tmp/omps-e2e")
        self.out = Path(os.environ.get("OUT") or "/tmp/omps-e2e/out")
        self.bin, self.rtbin, self.work = self.build / "bin", self.build / "rt", self.build / "work"
        b = omps_bin()
        self.server, self.ctl, self.shim = b / "omps-server", b / "omps-ctl", b / "libomps_shim.so"
        self.vandal = b / "examples" / "ring_vandal"
        self.prog_timeout = os.environ.get("PROG_TIMEOUT") or "180"  # seconds for one program
        self.rt_arch = os.environ.get("RT_ARCH") or "sm_90"
        missing = "".join(" " + rel(f) for f in (self.server, self.ctl, self.shim) if not f.exists())
        self.omps_on = not missing and not native_only
        if missing:
            self.omps_note = f"omps binaries missing:{missing}; omps columns skipped"
            if native_only:
                self.omps_note += " (--native-only)"
        elif native_only:
            self.omps_note = "omps columns skipped (--native-only)"
        else:
            self.omps_note = "omps binaries present"
        self.fail_reasons = []
        self.gpu_desc = "unknown GPU"
        self.loops = 200           # vector_add --loops of the kill and vandal survivors
        self.calibrated = False
        self.began = False         # the run got past its skip check: logs and tables are written
        self.table_text = None
        self._log = None
        self._sections = set()
        self.omps = self.mps = None  # e2e_servers.Omps / Mps, set by conftest

    # ------------------------------------------------------------ skip, start, log

    def skip_reason(self):
        """Why this machine cannot run the harness, or None. With --gpu-required (as
        scripts/gpu-e2e.sh runs it) nothing is skipped: a missing nvcc fails the run."""
        if self.gpu_required:
            return None
        if (self.cuda or self.rt) and not find_nvcc():
            return "nvcc not found (set NVCC=...): the GPU harness needs a CUDA toolkit"
        if not os.path.exists("/dev/nvidiactl") and not nvidia_smi_ok():
            return "no NVIDIA GPU here (no /dev/nvidiactl, nvidia-smi fails)"
        return None

    def begin(self):
        for d in (self.bin, self.rtbin, self.out):
            d.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True, exist_ok=True)
        for stale in ("table.txt", "bench.txt", "serving.txt", "serving.json"):  # an interrupted run leaves none
            (self.out / stale).unlink(missing_ok=True)
        self._log = open(self.out / "e2e.log", "w")
        self.began = True
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        section(f"omps gpu-e2e {stamp}")
        log(f"repo: {ROOT}   build: {self.build}   out: {self.out}")
        log(self.omps_note)
        if not self.rt and self.cuda:
            log("runtime-API section and benchmark skipped (--no-rt)")
        if self.rt_only:
            log("--rt-only: runtime-API build, section and benchmark only")
        if self.serving:
            log("with the serving benchmark" + ("" if self.cuda or self.rt else " only (--serving-only)"))
        self.gpu_desc = gpu_desc()
        log(f"GPU: {self.gpu_desc}")

    def write_log(self, text, console=True):
        if self._log:
            self._log.write(text)
            self._log.flush()
        if console:
            sys.stdout.write(text)
            sys.stdout.flush()

    def fail(self, reason):
        """Notes a failure: the run's overall verdict becomes FAIL (gpu-e2e.sh's note_fail)."""
        self.fail_reasons.append(reason)

    @property
    def any_fail(self):
        return bool(self.fail_reasons)

    # ------------------------------------------------------------ argv of a client

    def native(self, prog, *args, timeout=None):
        return ["timeout", "-k", "5", timeout or self.prog_timeout, prog, *args]

    def as_omps(self, prog, *args, timeout=None):
        """An omps client through LD_PRELOAD (no preload on `timeout` itself)."""
        return ["timeout", "-k", "5", timeout or self.prog_timeout, "env",
                f"OMPS_PIPE_DIRECTORY={self.omps.pipe}", f"LD_PRELOAD={self.shim}", prog, *args]

    def as_omps_libpath(self, prog, *args):
        """The same without LD_PRELOAD: the shim is found as libcuda.so.1 through
        LD_LIBRARY_PATH (a directory of symlinks to it; Omps.make_libdir)."""
        old = os.environ.get("LD_LIBRARY_PATH", "")
        return ["timeout", "-k", "5", self.prog_timeout, "env", f"OMPS_PIPE_DIRECTORY={self.omps.pipe}",
                f"LD_LIBRARY_PATH={self.omps.libdir}{':' + old if old else ''}", prog, *args]

    def as_mps(self, prog, *args, timeout):
        return ["timeout", "-k", "5", timeout, "env", f"CUDA_MPS_PIPE_DIRECTORY={self.mps.pipe}", prog, *args]


H = Harness()


def rel(path):
    """A path as gpu-e2e.sh named it: relative to the repository when inside it."""
    p = str(path)
    return p[len(str(ROOT)) + 1:] if p.startswith(str(ROOT) + "/") else p


def nvidia_smi_ok():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def gpu_desc():
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_mode",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
        first = r.stdout.split("\n")[0].rstrip("\n") if r.stdout else ""
    except (OSError, subprocess.TimeoutExpired):
        first = ""
    return first or "unknown GPU"


def log(*parts):
    H.write_log(" ".join(str(p) for p in parts) + "\n")


def section(title):
    H.write_log(f"\n==================== {title} ====================\n")


def section_once(key, title):
    """A section header, printed by the first test of a family that runs."""
    if key not in H._sections:
        H._sections.add(key)
        section(title)


def indented(lines, limit=None):
    """Logs lines with four spaces before each (gpu-e2e.sh's `sed 's/^/    /'`)."""
    for line in lines[:limit] if limit is not None else lines:
        log("    " + line)


# ---------------------------------------------------------------- files

def read_bytes(path):
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def split_lines(text):
    """Lines without their ends, as sed or tail see them (a last line may lack its end)."""
    if not text:
        return []
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def lines_of(path):
    """The file's lines as text; [] if it cannot be read."""
    data = read_bytes(path)
    return split_lines(data.decode("utf-8", errors="replace")) if data else []


def last_line(path):
    """`$(tail -n 1 FILE 2>/dev/null)`."""
    lines = lines_of(path)
    return lines[-1] if lines else ""


def same(a, b):
    """`cmp -s a b`: both readable and equal."""
    da, db = read_bytes(a), read_bytes(b)
    return da is not None and db is not None and da == db


def grep_first(pattern, path):
    """The first line matching the regular expression, or None."""
    for line in lines_of(path):
        if re.search(pattern, line):
            return line
    return None


def log_diff(a, b, limit):
    """`diff a b | head -n LIMIT | sed 's/^/    /'`."""
    r = subprocess.run(["diff", str(a), str(b)], capture_output=True)
    indented(split_lines(r.stdout.decode("utf-8", errors="replace")), limit)


def show_output(title, path):
    """A program's stdout, and its stderr (first 60 lines) if any, into the log."""
    log(f"--- {title}: stdout")
    indented(lines_of(path))
    err = f"{path}.err"
    if os.path.exists(err) and os.path.getsize(err) > 0:
        log(f"--- {title}: stderr")
        indented(lines_of(err), 60)


# ---------------------------------------------------------------- processes

def bash_rc(p):
    """A reaped process's status as bash's $? gives it (128 + signal when killed)."""
    return 128 - p.returncode if p.returncode < 0 else p.returncode


def spawn(argv, out, err=None, env=None, append=False):
    """Starts argv with stdout to `out` and stderr to `err` (to `out` when None: 2>&1),
    stdin from /dev/null; `env`: variables to add to this process's environment."""
    o = open(out, "ab" if append else "wb")
    e = open(err, "wb") if err else subprocess.STDOUT
    try:
        full = dict(os.environ, **env) if env else None
        return subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=o, stderr=e, env=full)
    finally:
        o.close()
        if err:
            e.close()


def wait(p):
    p.wait()
    return bash_rc(p)


def run(argv, out, err=None, env=None, append=False):
    return wait(spawn(argv, out, err, env, append))


def alive(p):
    return p is not None and p.poll() is None


def verdict(rc, path):
    """PASS if rc is 0 and the output's last line is PASS; else a reason."""
    if rc == 0 and last_line(path) == "PASS":
        return "PASS"
    if rc in (124, 137):
        return "TIMEOUT"
    return f"FAIL(rc={rc})"


# ---------------------------------------------------------------- figures

def is_number(v):
    return bool(v) and re.fullmatch(r"[0-9.]+", v) is not None


def median(values):
    """The median of numbers (given as text, returned as given), or FAIL if any is not one."""
    if not values or not all(is_number(v) for v in values):
        return "FAIL"
    s = sorted(values, key=awk_num)
    return s[(len(s) + 1) // 2 - 1]


def awk_num(v):
    m = re.match(r"[0-9]*\.?[0-9]*", v)
    try:
        return float(m.group(0)) if m and m.group(0) not in ("", ".") else 0.0
    except ValueError:
        return 0.0


def ratio(a, b):
    """a / b to two places, or "-" unless both are numbers."""
    if not (a + b) or re.search(r"[^0-9.]", a + b):
        return "-"
    x, y = awk_num(a), awk_num(b)
    return f"{x / y:.2f}" if y > 0 else "-"


def check(ok, what):
    """Ends the calling test as failed (and notes it for the overall verdict) unless ok."""
    if not ok:
        import pytest
        H.fail(what)
        pytest.fail(what, pytrace=False)
