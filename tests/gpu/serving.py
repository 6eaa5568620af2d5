"""The serving benchmark's orchestration (issue 25): its settings from the environment, the
alone latencies, and one mode's run of replicas under open-loop Poisson traffic with a
replica that joins half-way. It exists apart from test_serving.py so that the same code
runs on the GPU (natively, under NVIDIA MPS, under omps) and on any host with fake
replicas that only sleep (test_serving_host.py); it knows no server: a mode is a function
that wraps a worker's argv (`timeout ... env ... python3 serve_worker.py ...`).

A replica is scripts/bench/serve_worker.py. A run: every replica of the mix is started at
once, builds and warms up, prints READY; then the start file gets the window (start, end),
half a second ahead, and every replica's arrivals begin at its start; at the window's
middle one more replica (SERVE_JOIN) is started, which serves from its first result to
the end. Settings (environment, all optional):

  SERVE_MIX="resnet50:4:120,encoder:2:100,graph_decoder:2:10"   model:replicas:requests/s
  SERVE_SECONDS=60        the window; the join is at its middle
  SERVE_JOIN=resnet50     model[:rate] of the replica that joins ("none": no join); its
                          rate is the mix's for that model unless given
  SERVE_ALONE_REQUESTS    timed requests a model for the alone latency (default per model)
  SERVE_READY_TIMEOUT=180 seconds for every replica to be READY
  SERVE_GRACE=5           seconds after the window to serve the backlog
  SERVE_SEED=0            arrivals are seeded: the same in every mode
  SERVE_PYTHON            the replicas' python (default: the one running pytest)
  SERVE_FAKE=1            fake replicas (they sleep; no torch): the harness's glue tested
                          without a GPU (`--serving-only --gpu-required` on any machine)
"""

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from e2e import spawn

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "scripts" / "bench" / "serve_worker.py"
MODELS = ("resnet50", "encoder", "graph_decoder", "decoder")
DEFAULT_MIX = "resnet50:4:120,encoder:2:100,graph_decoder:2:10"
WARMUP = {"resnet50": 20, "encoder": 20, "graph_decoder": 3, "decoder": 3}
ALONE_REQUESTS = {"resnet50": 200, "encoder": 200, "graph_decoder": 50, "decoder": 30}
FAKE_MS = {"resnet50": 4.0, "encoder": 2.0, "graph_decoder": 20.0, "decoder": 30.0}  # fake service times
START_LEAD_S = 0.5


@dataclass
class Entry:
    model: str
    count: int
    rate: float

    def label(self):
        return f"{self.model} x{self.count} at {self.rate:g}/s"


@dataclass
class Config:
    mix: list
    seconds: float = 60.0
    join: Entry = None
    alone_requests: dict = field(default_factory=dict)
    ready_timeout: float = 180.0
    grace: float = 5.0
    seed: int = 0
    python: str = sys.executable
    fake: bool = False          # replicas sleep FAKE_MS instead of running a model
    md1_samples: int = 1_000_000

    @property
    def join_at(self):
        return self.seconds / 2

    @property
    def models(self):
        """The models of the mix, in its order (then the joiner's, if it is not in the mix)."""
        out = [e.model for e in self.mix]
        if self.join and self.join.model not in out:
            out.append(self.join.model)
        return out

    def rate(self, model):
        return next(e.rate for e in self.mix + ([self.join] if self.join else []) if e.model == model)

    def describe(self):
        s = ", ".join(e.label() for e in self.mix) + f"; window {self.seconds:g} s"
        if self.join:
            s += f"; one more {self.join.model} at {self.join.rate:g}/s joins at {self.join_at:g} s"
        return s + (" (fake replicas: no GPU)" if self.fake else "")


def parse_mix(text):
    """"model:count:rate,..." -> [Entry]; ValueError on anything else."""
    out = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        f = part.split(":")
        if len(f) != 3 or f[0] not in MODELS:
            raise ValueError(f"SERVE_MIX: '{part}' is not model:replicas:rate (models: {', '.join(MODELS)})")
        e = Entry(f[0], int(f[1]), float(f[2]))
        if e.count < 1 or e.rate <= 0:
            raise ValueError(f"SERVE_MIX: '{part}': replicas >= 1 and rate > 0")
        out.append(e)
    if not out:
        raise ValueError("SERVE_MIX is empty")
    if len({e.model for e in out}) != len(out):
        raise ValueError("SERVE_MIX names a model twice")
    return out


def parse_join(text, mix):
    if text.strip().lower() in ("", "none", "0", "no"):
        return None
    f = text.strip().split(":")
    if f[0] not in MODELS or len(f) > 2:
        raise ValueError(f"SERVE_JOIN: '{text}' is not model[:rate]")
    if len(f) == 2:
        return Entry(f[0], 1, float(f[1]))
    rate = next((e.rate for e in mix if e.model == f[0]), None)
    if rate is None:
        raise ValueError(f"SERVE_JOIN: {f[0]} is not in the mix: give its rate (model:rate)")
    return Entry(f[0], 1, rate)


def config_from_env(env=None, fake=False):
    env = os.environ if env is None else env
    mix = parse_mix(env.get("SERVE_MIX") or DEFAULT_MIX)
    cfg = Config(mix=mix, fake=fake or env.get("SERVE_FAKE") == "1")
    cfg.seconds = float(env.get("SERVE_SECONDS") or 60)
    default_join = "resnet50" if any(e.model == "resnet50" for e in mix) else mix[0].model
    cfg.join = parse_join(env.get("SERVE_JOIN", default_join), mix)
    n = env.get("SERVE_ALONE_REQUESTS")
    cfg.alone_requests = {m: int(n) if n else ALONE_REQUESTS[m] for m in cfg.models}
    cfg.ready_timeout = float(env.get("SERVE_READY_TIMEOUT") or 180)
    cfg.grace = float(env.get("SERVE_GRACE") or 5)
    cfg.seed = int(env.get("SERVE_SEED") or 0)
    cfg.python = env.get("SERVE_PYTHON") or sys.executable
    return cfg


# ---------------------------------------------------------------- processes

class Proc:
    """A worker started in the background: its argv, output files and start time."""

    def __init__(self, name, argv, workdir, **tags):
        self.name, self.tags = name, tags
        self.out, self.err, self.json = (workdir / f"{name}.out", workdir / f"{name}.err", workdir / f"{name}.json")
        self.t_spawn = time.time()
        self.p = spawn(argv, self.out, self.err)

    def said(self, word):
        try:
            return any(line.strip() == word for line in self.out.read_text(errors="replace").splitlines())
        except OSError:
            return False

    def alive(self):
        return self.p.poll() is None

    def stop(self):
        """TERM (the `timeout` wrapper passes it on), KILL 5 s later; reaped."""
        if self.alive():
            self.p.terminate()
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                self.p.kill()
        self.p.wait()

    def result(self):
        try:
            return json.loads(self.json.read_text())
        except (OSError, ValueError):
            return None

    def tail(self, n=15):
        try:
            return self.err.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return []


def _worker(cfg, wrap, timeout, *args, model=None):
    """argv of one worker through the mode's wrapper; fake replicas get their sleep."""
    fake = ["--fake-ms", str(FAKE_MS[model]), "--fake-build-s", "0.3"] if cfg.fake and model else []
    return wrap([cfg.python, WORKER, *args, *fake], int(timeout))


def touch(cfg, wrap, workdir, log):
    """An untimed first client (it makes MPS start its server); True if it worked."""
    if cfg.fake:
        return True
    workdir.mkdir(parents=True, exist_ok=True)
    p = Proc("touch", _worker(cfg, wrap, 120, "--touch"), workdir)
    rc = p.p.wait()
    log(f"warm-up client: rc={rc} {'TOUCHED' if p.said('TOUCHED') else ''}")
    return rc == 0


def measure_alone(cfg, wrap, workdir, log):
    """{model: median ms} of each model alone: natively, one process timing one model after
    the other (fake: a process a model, each with its own sleep); RuntimeError if it fails."""
    workdir.mkdir(parents=True, exist_ok=True)
    res = {}
    for ms in ([m] for m in cfg.models) if cfg.fake else [cfg.models]:
        name = "alone-" + ms[0] if cfg.fake else "alone"
        spec = ",".join(f"{m}:{cfg.alone_requests[m]}:{WARMUP[m]}" for m in ms)
        p = Proc(name, _worker(cfg, wrap, 600, "--alone", spec, "--seed", cfg.seed, "--out", workdir / f"{name}.json",
                               model=ms[0]), workdir)
        rc = p.p.wait()
        r = p.result()
        if rc != 0 or not r or "alone" not in r:
            raise RuntimeError(f"alone measure failed (rc={rc}): " + " | ".join(p.tail(8)))
        for m, v in r["alone"].items():
            res[m] = v["median_ms"]
            log(f"alone: {m} median {v['median_ms']:.3f} ms over {len(v['per_request_ms'])} requests"
                + (f" ({v.get('device')}, torch {v.get('torch')})" if v.get("torch") else ""))
    return res


def run_mode(cfg, mode, wrap, workdir, log):
    """One run of the mix (and the joiner) in one mode; a dict: status OK or FAIL, reason,
    t0, t_end, t_join, and replicas: [{model, index, joined, t_spawn, result}]."""
    workdir.mkdir(parents=True, exist_ok=True)
    start_file = workdir / "start"
    start_file.unlink(missing_ok=True)
    timeout = cfg.ready_timeout + cfg.seconds + cfg.grace + 60
    common = ["--start-file", start_file, "--start-timeout", timeout, "--grace", cfg.grace]
    procs = []

    def start(e, i, joined):
        mi = cfg.models.index(e.model)
        seed = cfg.seed * 1000 + mi * 100 + (99 if joined else i)
        name = f"{mode}-{e.model}-{'join' if joined else i}"
        argv = _worker(cfg, wrap, timeout, "--model", e.model, "--rate", e.rate, "--seed", seed,
                       "--warmup", WARMUP[e.model], "--out", workdir / f"{name}.json", *common, model=e.model)
        procs.append(Proc(name, argv, workdir, model=e.model, index=i, joined=joined))

    res = {"mode": mode, "status": "FAIL", "reason": "", "replicas": []}
    try:
        for e in cfg.mix:
            for i in range(e.count):
                start(e, i, False)
        log(f"[{mode}] {len(procs)} replicas started: {cfg.describe()}")
        t_launch = time.time()
        while True:
            ready = [p for p in procs if p.said("READY")]
            dead = [p for p in procs if p not in ready and not p.alive()]
            if dead or len(ready) == len(procs) or time.time() - t_launch > cfg.ready_timeout:
                break
            time.sleep(0.05)
        if dead or len(ready) != len(procs):
            why = (f"{', '.join(p.name for p in dead)} exited before READY" if dead
                   else f"only {len(ready)} of {len(procs)} READY after {cfg.ready_timeout:g} s")
            for p in dead or [p for p in procs if p not in ready]:
                log(f"[{mode}] {p.name} stderr: " + " | ".join(p.tail(8)))
            res["reason"] = why
            return res
        log(f"[{mode}] all READY after {time.time() - t_launch:.1f} s")
        t0 = time.time() + START_LEAD_S
        t_end = t0 + cfg.seconds
        tmp = workdir / "start.tmp"
        tmp.write_text(f"{t0:.6f} {t_end:.6f}\n")
        os.replace(tmp, start_file)
        res.update(t0=t0, t_end=t_end, t_join=None)
        if cfg.join:
            time.sleep(max(0.0, t0 + cfg.join_at - time.time()))
            res["t_join"] = time.time()
            start(cfg.join, 0, True)
            log(f"[{mode}] {procs[-1].name} started at {res['t_join'] - t0:.2f} s")
        deadline = t_end + cfg.grace + 60
        for p in procs:
            try:
                p.p.wait(max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                log(f"[{mode}] {p.name} still running 60 s after the window and its grace: stopped")
        bad = []
        for p in procs:
            p.stop()
            r = p.result()
            if p.p.returncode != 0 or r is None:
                bad.append(f"{p.name} rc={p.p.returncode}" + ("" if r else " (no result)"))
                log(f"[{mode}] {p.name} rc={p.p.returncode}: " + " | ".join(p.tail(8)))
            res["replicas"].append({"name": p.name, **p.tags, "t_spawn": p.t_spawn, "result": r})
        res["status"], res["reason"] = ("FAIL", "; ".join(bad)) if bad else ("OK", "")
        log(f"[{mode}] {res['status']} {res['reason']}")
        return res
    finally:
        for p in procs:
            p.stop()


def skipped(mode, why):
    return {"mode": mode, "status": "SKIP", "reason": why, "replicas": []}
