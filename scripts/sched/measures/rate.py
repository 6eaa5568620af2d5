"""Aggregate empty-kernel launches per second, all clients together (issue 8 item 3):
N = 1, 8, 32 and 256 (omps only) processes, each launching on its own stream for 3 s. Target: omps at
least MPS at N = 8 and 32."""

NAME = "rate"
NS = [1, 8, 32, 256]
# Native runs out of GPU memory and MPS refuses clients beyond 48 long before 256.
MAX_N = {"native": 32, "mps": 32}
SECONDS = 3


def run(clients):
    out = {}
    for n in NS:
        if n > MAX_N.get(clients.mode, n):
            continue
        rows = clients.together([["rate", SECONDS]] * n, lead_s=max(2.0, n / 60))
        rates = [int(r[1]) / float(r[2]) for r in rows]
        out[n] = sum(rates)
        out[f"fair{n}"] = min(rates) / max(rates)
    return out


def report(by_mode):
    from run import ratio
    lines = ["launches/s, all clients | N | native | MPS | omps | omps/MPS | omps/native | omps slowest/fastest client (target >= 0.5 at 256)",
             "|---|---|---|---|---|---|---|---|"]
    for n in NS:
        f = {m: by_mode.get(m, {}).get(n) for m in ("native", "mps", "omps")}
        cell = lambda v: f"{v / 1e3:.0f}k" if v else "-"  # noqa: E731
        lines.append(f"| rate | {n} | {cell(f['native'])} | {cell(f['mps'])} | {cell(f['omps'])} | "
                     f"{ratio(f['omps'], f['mps'])} | {ratio(f['omps'], f['native'])} | "
                     f"{by_mode.get('omps', {}).get(f'fair{n}', 0):.2f} |")
    return lines
