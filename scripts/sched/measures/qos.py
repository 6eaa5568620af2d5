"""qos (issue 8): a latency-critical client runs requests of 20 small kernels + sync beside
a best-effort client that keeps every SM busy. LC p99 must be at most 1.1x its latency
alone, while BE keeps at least 0.8x the throughput it has beside LC under MPS."""

NAME = "qos"
SECONDS = 4


def run(clients):
    (alone,) = clients.together([["lc", 20, SECONDS]])
    lc, be = clients.together([["lc", 20, SECONDS], ["be", SECONDS]])
    return {"lc_alone_p99": float(alone[3]), "lc_beside_p99": float(lc[3]), "be_kernels": int(be[1])}


def report(by_mode):
    from run import ratio
    lines = ["qos | mode | LC p99 alone (us) | LC p99 beside BE (us) | ratio (target <= 1.1) | BE kernels | BE vs MPS (target >= 0.8)",
             "|---|---|---|---|---|---|---|"]
    mps = by_mode.get("mps", {}).get("be_kernels")
    for m in ("native", "mps", "omps"):
        f = by_mode.get(m)
        if not f:
            continue
        lines.append(f"| qos | {m} | {f['lc_alone_p99']:.1f} | {f['lc_beside_p99']:.1f} | "
                     f"{ratio(f['lc_beside_p99'], f['lc_alone_p99'])} | {f['be_kernels']} | {ratio(f['be_kernels'], mps)} |")
    return lines
