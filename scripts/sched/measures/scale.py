"""scale (issue 8 item 3): start-up and client count.
- startup: 8 processes started at once; each does a cudaMalloc first thing and reports
  the time from just before its start. Target: the slowest within 20 ms.
- many: N processes at once (omps: 1,024; MPS stops at 48, native runs out of GPU memory
  long before), each allocating and running one 200 ms kernel: how many succeed, and
  the wall time of the slowest kernel+sync."""
import subprocess
import time
from pathlib import Path

NAME = "scale"
STARTUP_N = 8
MANY = {"native": 64, "mps": 48, "omps": 1024}


def startup(clients):
    procs = []
    for i in range(STARTUP_N):
        log = Path(clients.workdir) / f"{clients.mode}.startup.{i}"
        t0 = time.time_ns()
        procs.append((subprocess.Popen([str(clients.roles), "startup", str(t0)], env=clients.env,
                                       stdout=open(f"{log}.out", "w"), stderr=open(f"{log}.err", "w")), log))
    ms = []
    for p, log in procs:
        p.wait(timeout=60)
        out = Path(f"{log}.out").read_text().split()
        if p.returncode == 0 and out:
            ms.append(float(out[-1]))
    return ms


def run(clients):
    out = {"startup_ms": startup(clients)}
    n = MANY.get(clients.mode, 0)
    try:
        rows = clients.together([["tiny", 200]] * n, lead_s=max(2.0, n / 60), timeout=300)
        out["many"] = (n, sum(1 for r in rows if r[1] == "ok"), max(float(r[2]) for r in rows))
    except RuntimeError as e:
        ok = sum(1 for i in range(clients.n - n + 1, clients.n + 1)
                 if (Path(clients.workdir) / f"{clients.mode}.{i}.out").read_text().startswith("TINY ok"))
        out["many"] = (n, ok, None)
        print(f"[scale] {clients.mode}: {str(e).splitlines()[0]}")
    return out


def report(by_mode):
    lines = ["scale | mode | first cudaMalloc, 8 at once: fastest / slowest ms (target <= 20) | clients at once | worked | slowest kernel+sync ms",
             "|---|---|---|---|---|---|"]
    for m in ("native", "mps", "omps"):
        f = by_mode.get(m)
        if not f:
            continue
        s = f["startup_ms"]
        st = f"{min(s):.1f} / {max(s):.1f}" if s else "-"
        n, ok, slow = f.get("many", (0, 0, None))
        lines.append(f"| scale | {m} | {st} | {n} | {ok} | {slow if slow is not None else '-'} |")
    return lines
