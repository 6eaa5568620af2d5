"""qos (issue 8): a latency-critical client (LC) sends requests of 20 kernels (8 blocks x
128 threads, 20 us each) + a stream sync, beside a best-effort client (BE) that keeps
every SM full (16 blocks of 128 threads per SM, 100 us each, four kernels queued). LC p99
must be at most 1.1x LC alone, while BE keeps at least 0.8x the work (blocks) it does
beside LC under MPS with no cap (BE sizes its kernels by the SM count it sees). Variants: omps with LC marked latency-critical (OMPS_CLIENT_QOS) or
BE below normal (CUDA_MPS_CLIENT_PRIORITY=1); MPS with BE capped at 30% of the threads."""

NAME = "qos"
SECONDS = 4
LC = ["lc", 20, SECONDS, 8, 20]
BE = ["be", SECONDS, 16, 100]

VARIANTS = {
    "native": {"plain": ({}, {})},
    "mps": {
        "plain": ({}, {}),
        "BE below normal": ({}, {"CUDA_MPS_CLIENT_PRIORITY": "1"}),
        "BE at 30% threads": ({}, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}),
    },
    "omps": {
        "plain": ({}, {}),
        "LC latency-critical": ({"OMPS_CLIENT_QOS": "latency-critical"}, {}),
        "BE below normal": ({}, {"CUDA_MPS_CLIENT_PRIORITY": "1"}),
    },
}


def run(clients):
    clients.together([["lc", 20, 1, 8, 20]])  # warm-up: a fresh server's first client
    (alone,) = clients.together([LC])
    out = {"lc_alone_p99": float(alone[3]), "variants": {}}
    for name, (lc_env, be_env) in VARIANTS.get(clients.mode, {}).items():
        lc, be = clients.together([(LC, lc_env), (BE, be_env)])
        out["variants"][name] = {"lc_p50": float(lc[2]), "lc_p99": float(lc[3]), "be_blocks": int(be[2])}
    return out


def report(by_mode):
    from run import ratio
    lines = ["qos | mode | variant | LC p99 alone (us) | LC p50 / p99 beside BE (us) | p99 ratio (target <= 1.1) | BE blocks done | BE vs MPS plain (target >= 0.8)",
             "|---|---|---|---|---|---|---|---|"]
    mps = by_mode.get("mps", {}).get("variants", {}).get("plain", {}).get("be_blocks")
    for m in ("native", "mps", "omps"):
        f = by_mode.get(m)
        if not f:
            continue
        for name, v in f["variants"].items():
            lines.append(f"| qos | {m} | {name} | {f['lc_alone_p99']:.1f} | {v['lc_p50']:.1f} / {v['lc_p99']:.1f} | "
                         f"{ratio(v['lc_p99'], f['lc_alone_p99'])} | {v['be_blocks']} | {ratio(v['be_blocks'], mps)} |")
    return lines
