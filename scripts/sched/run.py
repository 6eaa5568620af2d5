#!/usr/bin/env python3
"""The scheduling measures of issue 8, natively, under NVIDIA MPS and under omps in one
run, with ratios. Each file in measures/ is one measure: it defines NAME, and
run(clients) -> dict of figures for one mode, and report(by_mode) -> table lines. The
harness grows by adding a file there.

    python3 scripts/sched/run.py [--modes native,mps,omps] [--only rate,hog] [--out DIR]

Needs nvcc and a GPU; the omps binaries in OMPS_BIN (default target/release).
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "torch"))
import harness  # noqa: E402  (the omps server and MPS daemon of the PyTorch suite)

ROLES_SRC = REPO / "tests" / "cuda" / "sched" / "roles.cu"


class Clients:
    """Starts role processes of one mode: together, at a common start time."""

    def __init__(self, roles, env, workdir, mode, daemon=None):
        self.roles, self.env, self.workdir, self.mode = roles, env, workdir, mode
        self.daemon = daemon
        self.n = 0

    def ctl(self, *args):
        """An omps-ctl command (omps mode only): (ok, output)."""
        r = self.daemon.ctl_run(*args)
        return r.returncode == 0, r.stdout + r.stderr

    def together(self, arg_lists, lead_s=2.0, timeout=120, program=None, tag=""):
        """Runs every argument list at once (their timed parts start together, lead_s
        from now); returns each one's last stdout line, split into words, or raises
        RuntimeError with its stderr (killing the others). An entry may be (args, env) to
        add environment variables to that process; `program` (a list) runs instead of
        the roles binary."""
        start_at = time.time_ns() + int(lead_s * 1e9)
        argv0 = [str(a) for a in (program or [self.roles])]
        procs = []
        for entry in arg_lists:
            args, extra = entry if isinstance(entry, tuple) else (entry, {})
            self.n += 1
            log = Path(self.workdir) / f"{self.mode}.{tag}{self.n}"
            with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
                p = subprocess.Popen([*argv0, *map(str, args), "--start-at", str(start_at)],
                                     env={**self.env, **extra}, stdout=out, stderr=err,
                                     stdin=subprocess.DEVNULL)
            procs.append((p, log))
        deadline = time.monotonic() + timeout
        results = []
        try:
            for p, log in procs:
                try:
                    rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                    rc = "timeout"
                lines = Path(f"{log}.out").read_text().strip().splitlines()
                if rc != 0 or not lines:
                    raise RuntimeError(f"{self.mode}: {' '.join(map(str, p.args))}: rc {rc}\n"
                                       f"{Path(f'{log}.err').read_text()[-2000:]}")
                results.append(lines[-1].split())
        finally:
            for p, _ in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return results


def load_measures(only):
    out = []
    for f in sorted((HERE / "measures").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f.stem, f)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        if not only or m.NAME in only:
            out.append(m)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="native,mps,omps")
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default=None)
    ap.add_argument("--roles", default=None, help="a prebuilt roles binary (default: build it)")
    args = ap.parse_args()
    work = Path(args.out or tempfile.mkdtemp(prefix="omps-sched."))
    work.mkdir(parents=True, exist_ok=True)
    roles = Path(args.roles) if args.roles else work / "roles"
    if not args.roles:
        subprocess.run(["nvcc", "-O2", "-arch=sm_90", "-o", str(roles), str(ROLES_SRC)], check=True)
    measures = load_measures([x for x in args.only.split(",") if x])
    by_measure = {m.NAME: {} for m in measures}
    for mode in args.modes.split(","):
        daemon, env = None, harness.base_env()
        try:
            if mode not in ("native", "mps", "omps"):
                raise ValueError(f"unknown mode {mode}")
            if mode == "mps":
                daemon = harness.MpsDaemon(work)
                daemon.start()
                env.update(daemon.env())
            elif mode == "omps":
                daemon = harness.OmpsServer(harness.omps_bin(), work / "omps")
                daemon.start()
                env.update(daemon.client_env(harness.Mode.OMPS_PRELOAD))
            clients = Clients(roles, env, work, mode, daemon)
            for m in measures:
                try:
                    by_measure[m.NAME][mode] = m.run(clients)
                except RuntimeError as e:
                    print(f"[{m.NAME}] {mode}: FAILED: {e}", flush=True)
                print(f"[{m.NAME}] {mode}: {by_measure[m.NAME].get(mode)}", flush=True)
        except (FileNotFoundError, RuntimeError, OSError, subprocess.SubprocessError) as e:
            print(f"{mode}: cannot run this mode: {e}", flush=True)
        finally:
            if daemon is not None:
                problem = daemon.stop()
                if problem:
                    print(f"{mode}: {problem}")
    print()
    for m in measures:
        for line in m.report(by_measure[m.NAME]):
            print(line)
        print()
    print(f"logs: {work}")


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "-"


if __name__ == "__main__":
    main()
