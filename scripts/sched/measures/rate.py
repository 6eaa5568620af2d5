"""Aggregate empty-kernel launches per second, all clients together (issue 8 item 3):
N = 1, 8 and 32 processes, each launching on its own stream for 3 s. Target: omps at
least MPS at N = 8 and 32."""

NAME = "rate"
NS = [1, 8, 32]
SECONDS = 3


def run(clients):
    out = {}
    for n in NS:
        rows = clients.together([["rate", SECONDS]] * n)
        out[n] = sum(int(r[1]) / float(r[2]) for r in rows)
    return out


def report(by_mode):
    from run import ratio
    lines = ["launches/s, all clients | N | native | MPS | omps | omps/MPS | omps/native", "|---|---|---|---|---|---|---|"]
    for n in NS:
        f = {m: by_mode.get(m, {}).get(n) for m in ("native", "mps", "omps")}
        cell = lambda v: f"{v / 1e3:.0f}k" if v else "-"  # noqa: E731
        lines.append(f"| rate | {n} | {cell(f['native'])} | {cell(f['mps'])} | {cell(f['omps'])} | "
                     f"{ratio(f['omps'], f['mps'])} | {ratio(f['omps'], f['native'])} |")
    return lines
