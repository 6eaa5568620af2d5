"""torch_qos (issue 8, PyTorch variant of qos): a latency-critical client (LC) runs
ResNet-50 fp16 batch-1 inferences back to back, each timed with a sync, beside a
best-effort client (BE) that keeps the GPU queue full of bf16 8192^3 matmuls (a sync every
4). LC p99 must be at most 1.1x LC alone, while BE keeps at least 0.8x the TFLOP/s it gets
beside LC under MPS with no cap. Variants: omps with LC marked latency-critical
(OMPS_CLIENT_QOS); MPS with BE capped at 30% of the threads. The roles are
scripts/sched/torch_roles.py (needs torch and torchvision)."""
import sys
from pathlib import Path

NAME = "torch_qos"
SECONDS = 8
LEAD_S = 25.0  # PyTorch import, model build and warm-up of every process fit before the start
TIMEOUT_S = 180
ROLES = Path(__file__).resolve().parents[1] / "torch_roles.py"
LC = ["lc", SECONDS]
BE = ["be", SECONDS]

VARIANTS = {
    "native": {"plain": ({}, {})},
    "mps": {
        "plain": ({}, {}),
        "BE at 30% threads": ({}, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}),
    },
    "omps": {
        "plain": ({}, {}),
        "LC latency-critical": ({"OMPS_CLIENT_QOS": "latency-critical"}, {}),
    },
}


def together(clients, entries):
    return clients.together(entries, lead_s=LEAD_S, timeout=TIMEOUT_S,
                            program=[sys.executable, ROLES], tag="torch.")


def run(clients):
    (alone,) = together(clients, [LC])
    out = {"lc_alone_p99": float(alone[3]), "variants": {}}
    for name, (lc_env, be_env) in VARIANTS.get(clients.mode, {}).items():
        lc, be = together(clients, [(LC, lc_env), (BE, be_env)])
        out["variants"][name] = {"lc_p50": float(lc[2]), "lc_p99": float(lc[3]), "be_tflops": float(be[2])}
    return out


def report(by_mode):
    from run import ratio
    lines = ["torch_qos | mode | variant | LC p99 alone (ms) | LC p50 / p99 beside BE (ms) | p99 ratio (target <= 1.1) | BE TFLOP/s | BE vs MPS plain (target >= 0.8)",
             "|---|---|---|---|---|---|---|---|"]
    mps = by_mode.get("mps", {}).get("variants", {}).get("plain", {}).get("be_tflops")
    for m in ("native", "mps", "omps"):
        f = by_mode.get(m)
        if not f:
            continue
        for name, v in f["variants"].items():
            lines.append(f"| torch_qos | {m} | {name} | {f['lc_alone_p99'] / 1e3:.2f} | "
                         f"{v['lc_p50'] / 1e3:.2f} / {v['lc_p99'] / 1e3:.2f} | "
                         f"{ratio(v['lc_p99'], f['lc_alone_p99'])} | {v['be_tflops']:.1f} | {ratio(v['be_tflops'], mps)} |")
    return lines
