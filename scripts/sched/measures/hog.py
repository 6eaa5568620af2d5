"""hog (issue 8): A runs 40 streams of 200 ms single-block kernels; B runs requests of one
small kernel + sync. B's p99 beside A must be within 1.1x of B alone, and A's kernel
count within 0.95x of MPS's."""

NAME = "hog"
SECONDS = 4


def run(clients):
    (alone,) = clients.together([["lc", 1, SECONDS]])
    a, b = clients.together([["hog", 40, 200, SECONDS], ["lc", 1, SECONDS]])
    return {"b_alone_p99": float(alone[3]), "b_beside_p99": float(b[3]), "a_kernels": int(a[1])}


def report(by_mode):
    from run import ratio
    lines = ["hog | mode | B p99 alone (us) | B p99 beside A (us) | ratio (target <= 1.1) | A kernels | A vs MPS (target >= 0.95)",
             "|---|---|---|---|---|---|---|"]
    mps = by_mode.get("mps", {}).get("a_kernels")
    for m in ("native", "mps", "omps"):
        f = by_mode.get(m)
        if not f:
            continue
        lines.append(f"| hog | {m} | {f['b_alone_p99']:.1f} | {f['b_beside_p99']:.1f} | "
                     f"{ratio(f['b_beside_p99'], f['b_alone_p99'])} | {f['a_kernels']} | {ratio(f['a_kernels'], mps)} |")
    return lines
