"""deep (issue 8 item 2, a launch into a full queue): A runs a 1 s kernel and queues 5,000
empty launches behind it on the same stream (a CUDA stream holds about 1,000); B runs
small kernel + sync requests beside it. B's p99 and worst wait against B alone: under
omps the worker must not block in the driver on A's behalf."""

NAME = "deep"
SECONDS = 3


def run(clients):
    (alone,) = clients.together([["lc", 1, SECONDS]])
    b, a = clients.together([["lc", 1, SECONDS], ["deep", 1000, 5000]])
    return {"alone": [float(x) for x in alone[2:5]], "beside": [float(x) for x in b[2:5]], "a_ms": float(a[1])}


def report(by_mode):
    lines = ["deep | mode | B p50 / p99 / max alone (us) | B p50 / p99 / max beside A (us) | A's kernel + 5,000 launches + sync (ms)",
             "|---|---|---|---|---|"]
    for m in ("native", "mps", "omps"):
        f = by_mode.get(m)
        if f:
            fmt = lambda v: " / ".join(f"{x:.1f}" for x in v)  # noqa: E731
            lines.append(f"| deep | {m} | {fmt(f['alone'])} | {fmt(f['beside'])} | {f['a_ms']:.0f} |")
    return lines
