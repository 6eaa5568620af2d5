"""fair (issue 25 item 2): fairness and the server's memory with many clients.
N processes at once each run the same short job (`roles fair`: 100 launches of a 64-thread
kernel, a cudaStreamSynchronize after every 10). Reported per mode and N: the fastest,
median and slowest client's time from its first launch to its end, slowest / median
(target: at most 2), the median and slowest from the common start instant (a client whose
start-up ran past it counts that lateness; "late" counts those more than 50 ms late), and
the server's memory, sampled from /proc/<pid>/status while the clients run: the peak
VmRSS with its RssAnon / RssShmem / RssFile, the peak of each alone, and VmHWM at the end
(omps: the omps-server; MPS: its nvidia-cuda-mps-server; natively there is none).
Target: at most 1 GB at 1,024 clients. omps runs 1,024; MPS stops at 48 clients and
natively 64 contexts are about what fits, so every mode also runs 48, for ratios."""
import os
import subprocess
import threading
import time
from pathlib import Path

NAME = "fair"
LAUNCHES, EVERY = 100, 10
NS = {"native": [48, 64], "mps": [48], "omps": [48, 1024]}
# Seconds from spawning the processes to their common start: natively each makes a
# context (seconds when 64 do at once), under MPS each connects, under omps 1,024 start.
LEAD = {"native": lambda n: 3 + n / 8, "mps": lambda n: 3 + n / 16, "omps": lambda n: 3 + n / 60}
LATE_S = 0.05
FIELDS = ("VmRSS", "RssAnon", "RssShmem", "RssFile", "VmHWM")
SAMPLE_S = 0.02


def read_status(pid):
    """The memory lines of /proc/<pid>/status in KiB ({} when the process is gone)."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in FIELDS:
                out[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    return out


def mps_servers():
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.path.basename(os.readlink(d / "exe")) == "nvidia-cuda-mps-server":
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


class Sampler(threading.Thread):
    """Samples the server's memory until stopped: `find()` names its PIDs (summed), asked
    again now and then (MPS starts its server at the first client)."""

    def __init__(self, find):
        super().__init__(daemon=True)
        self.find, self.pids, self.found_at = find, [], 0.0
        self.peak = {}   # the sample with the highest VmRSS
        self.most = {}   # each field's highest value
        self.hwm = 0
        self.stop_ev = threading.Event()

    def sample(self):
        if time.monotonic() - self.found_at > 0.5:
            self.pids, self.found_at = self.find(), time.monotonic()
        tot = {}
        for pid in self.pids:
            for k, v in read_status(pid).items():
                tot[k] = tot.get(k, 0) + v
        if "VmRSS" not in tot:
            return
        if tot["VmRSS"] > self.peak.get("VmRSS", -1):
            self.peak = tot
        for k, v in tot.items():
            self.most[k] = max(self.most.get(k, 0), v)
        self.hwm = max(self.hwm, tot.get("VmHWM", 0))

    def run(self):
        while not self.stop_ev.is_set():
            self.sample()
            self.stop_ev.wait(SAMPLE_S)

    def finish(self):
        self.stop_ev.set()
        self.join()
        self.sample()
        if not self.peak:
            return None
        return {"peak": self.peak, "most": self.most, "hwm": self.hwm}


def server_finder(clients):
    if clients.mode == "omps" and getattr(clients.daemon, "proc", None) is not None:
        pid = clients.daemon.proc.pid
        return lambda: [pid]
    if clients.mode == "mps":
        return mps_servers
    return lambda: []


def one(clients, n):
    sampler = Sampler(server_finder(clients))
    sampler.sample()
    before = dict(sampler.peak)
    sampler.peak, sampler.most = {}, {}
    sampler.start()
    try:
        rows = clients.together([["fair", LAUNCHES, EVERY]] * n, lead_s=LEAD[clients.mode](n),
                                timeout=120, tag=f"fair{n}.")
    finally:
        mem = sampler.finish()
    own = sorted(float(r[2]) for r in rows)
    start = sorted(float(r[1]) for r in rows)
    late = sum(1 for r in rows if float(r[1]) - float(r[2]) > LATE_S)
    # Every client's times beside the logs; the figures keep the order statistics.
    with open(Path(clients.workdir) / f"fair.{clients.mode}.{n}.times", "w") as f:
        f.writelines(f"{r[1]} {r[2]}\n" for r in rows)
    if clients.mode == "omps":
        # The lanes' records and time since the server started (cumulative), to tell
        # uneven lanes apart from uneven clients.
        try:
            _, text = clients.ctl("stats")
        except subprocess.SubprocessError as e:
            text = f"omps-ctl stats: {e}\n"
        (Path(clients.workdir) / f"fair.omps.{n}.stats").write_text(text)
    return {"own": (own[0], median(own), own[-1]), "start": (median(start), start[-1]), "late": late,
            "mem": mem, "idle": before.get("VmRSS")}


def run(clients):
    out = {}
    for n in NS.get(clients.mode, []):
        try:
            out[n] = one(clients, n)
        except RuntimeError as e:
            print(f"[fair] {clients.mode} N={n}: {str(e).splitlines()[0]}")
    return out


def median(v):
    return v[len(v) // 2] if v else None


def mib(kib):
    return f"{kib / 1024:,.0f}" if kib else "-"


def report(by_mode):
    lines = ["fair | mode | N | own time s: fastest / median / slowest | slowest / median (target <= 2) | "
             "from the start instant s: median / slowest | late | server peak RSS MiB (anon / shmem / file) | "
             "VmHWM MiB (target <= 1 GB at 1,024) | idle RSS MiB",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m in ("native", "mps", "omps"):
        for n, f in sorted(by_mode.get(m, {}).items()):
            own, start = f["own"], f["start"]
            med = own[1]
            spread = f"{own[2] / med:.1f}" if med else "-"
            mem = f["mem"]
            if mem:
                p = mem["peak"]
                rss = f"{mib(p.get('VmRSS'))} ({mib(p.get('RssAnon'))} / {mib(p.get('RssShmem'))} / {mib(p.get('RssFile'))})"
                hwm = mib(mem["hwm"])
            else:
                rss = hwm = "-"
            lines.append(f"| fair | {m} | {n} | {own[0]:.3f} / {med:.3f} / {own[2]:.3f} | {spread} | "
                         f"{start[0]:.3f} / {start[1]:.3f} | {f['late']} | {rss} | {hwm} | {mib(f['idle'])} |")
    o, p = by_mode.get("omps", {}).get(48), by_mode.get("mps", {}).get(48)
    if o and p:
        from run import ratio
        lines.append(f"| fair | omps / MPS | 48 | median {ratio(o['own'][1], p['own'][1])}, "
                     f"slowest {ratio(o['own'][2], p['own'][2])} | | | | | | |")
    return lines
