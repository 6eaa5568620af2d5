"""graph (issue 9): launch and synchronize a captured graph of 100 small kernels, 2,000
times, one client alone. Target: omps no slower than MPS."""

NAME = "graph"


def run(clients):
    (g,) = clients.together([["graph", 100, 2000]])
    return {"p50": float(g[1]), "p99": float(g[2])}


def report(by_mode):
    from run import ratio
    lines = ["graph of 100 kernels, launch + sync | native p50 / p99 (us) | MPS | omps | omps / MPS p50 (target <= 1.0)",
             "|---|---|---|---|---|"]
    cell = lambda f: f"{f['p50']:.1f} / {f['p99']:.1f}" if f else "-"  # noqa: E731
    n, m, o = (by_mode.get(k) for k in ("native", "mps", "omps"))
    lines.append(f"| graph | {cell(n)} | {cell(m)} | {cell(o)} | {ratio(o and o['p50'], m and m['p50'])} |")
    return lines
