"""limits (issue 8 item 5): a client at 25% of the threads sees 25% of the SMs, and its
kernel (264 blocks of 1024 threads spinning 1 ms: one wave on the whole H100) takes the
time that share implies; a static partition's client runs on the partition's SMs only.
Native ignores the limit; MPS is the reference for the thread limit (its static
partitions need a daemon started with -S, so omps alone runs that row)."""

NAME = "limits"


def run(clients):
    rows = {}
    (full,) = clients.together([["limit"]])
    rows["whole device"] = full
    (q,) = clients.together([(["limit"], {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"})])
    rows["25% threads"] = q
    if clients.mode == "omps":
        ok, out = clients.ctl("status")
        uuid = next((w for w in out.split() if w.startswith("GPU-")), None)
        ok, pid = clients.ctl("sm_partition", "add", uuid or "GPU-", "4")
        if ok:
            (p,) = clients.together([(["limit"], {"CUDA_MPS_SM_PARTITION": pid.strip()})])
            rows["partition of 4 chunks"] = p
            clients.ctl("sm_partition", "rm", pid.strip())
        else:
            print(f"[limits] sm_partition add failed: {pid}")
    return {k: {"seen": int(v[1]), "used": int(v[2]), "ms": float(v[3])} for k, v in rows.items()}


def report(by_mode):
    lines = ["limits | mode | setting | SMs seen | distinct SMs used | kernel ms | vs whole device (expected about 132 / SMs seen / 2, rounded up, x1 ms)",
             "|---|---|---|---|---|---|---|"]
    for m in ("native", "mps", "omps"):
        f = by_mode.get(m)
        if not f:
            continue
        base = f.get("whole device", {}).get("ms")
        for name, v in f.items():
            r = f"{v['ms'] / base:.2f}x" if base else "-"
            lines.append(f"| limits | {m} | {name} | {v['seen']} | {v['used']} | {v['ms']:.2f} | {r} |")
    return lines
