"""The serving benchmark's figures and table (issue 25): per-model p50, p99 and max latency
before and after the join, time to ready, and beside each row the interference-free
limit, the p50 and p99 of an M/D/1 queue's sojourn time at the row's arrival rate with the
model's alone latency as its service time: the best any sharing system can do for a
replica that serves one request at a time. It exists apart from the orchestration so that
the math and the layout are unit-tested on any host (test_serving_host.py).

M/D/1 quantiles come from the Lindley recursion W' = max(0, W + D - A) over 10^6 seeded
exponential gaps A (the same seed every run, so a limit is a pure function of rate and
service time); md1_wait_cdf is Erlang's closed form, numerically fit only for waits of a
few service times, to check the simulation against.
"""

import math
import random

GOAL = 1.3          # omps p99 within 1.3x of the limit, every model (before the join)
JOIN_RISE = 1.10    # while a replica joins, the others' p99 rises by at most 10%
WINDOWS = (("before", "before join"), ("after", "after join"))
MODES = (("native", "native"), ("mps", "MPS"), ("omps", "omps"))


def pct(xs, q):
    """The q-th percentile of sorted xs, interpolated between order statistics (numpy's default)."""
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100.0
    f = math.floor(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


# ---------------------------------------------------------------- M/D/1

def md1_sojourns(rate, d, n, seed=25):
    """n sojourn times (wait + d) of an M/D/1 queue, arrivals at `rate`, service `d`."""
    rng = random.Random(seed)
    w, out = 0.0, []
    for _ in range(n):
        out.append(w + d)
        w = w + d - rng.expovariate(rate)
        if w < 0.0:
            w = 0.0
    return out


def md1_quantiles(rate, d, qs=(50, 99), n=1_000_000, seed=25):
    """{q: sojourn quantile} in the units of d; inf for every q where rate * d >= 1 (no
    steady state)."""
    if rate * d >= 1.0:
        return {q: math.inf for q in qs}
    s = sorted(md1_sojourns(rate, d, n, seed))
    return {q: pct(s, q) for q in qs}


def md1_mean_wait(rate, d):
    """Pollaczek-Khinchine for deterministic service: rho * d / (2 (1 - rho))."""
    rho = rate * d
    return rho * d / (2 * (1 - rho)) if rho < 1 else math.inf


def md1_wait_cdf(t, rate, d):
    """P(wait <= t), Erlang's closed form: (1 - rho) sum_{k=0}^{floor(t/d)} (lam (k d - t))^k
    / k! e^{-lam (k d - t)}. Alternating terms: use it for t up to a few d."""
    rho = rate * d
    if t < 0:
        return 0.0
    terms = [(rate * (k * d - t)) ** k / math.factorial(k) * math.exp(-rate * (k * d - t))
             for k in range(int(math.floor(t / d)) + 1)]
    return (1 - rho) * math.fsum(terms)


def limits(cfg, alone_ms):
    """{model: {rate, service_ms, rho, p50_ms, p99_ms}} for every model of the run."""
    out = {}
    for m in cfg.models:
        if m not in alone_ms:
            continue
        rate, d = cfg.rate(m), alone_ms[m] / 1e3
        q = md1_quantiles(rate, d, n=cfg.md1_samples)
        out[m] = {"rate": rate, "service_ms": alone_ms[m], "rho": rate * d,
                  "p50_ms": q[50] * 1e3, "p99_ms": q[99] * 1e3}
    return out


# ---------------------------------------------------------------- one mode's figures

def stats(lat_ms, unfinished):
    s = sorted(lat_ms)
    return {"n": len(s), "unfinished": unfinished, "p50_ms": pct(s, 50), "p99_ms": pct(s, 99),
            "max_ms": s[-1] if s else None}


def mode_figures(cfg, run):
    """Rows {"MODEL/before", "MODEL/after", "MODEL/joined"} and time-to-ready figures of one
    mode's run (serving.run_mode's dict). Unfinished requests count with their latency so
    far (a lower bound), so a backlog cannot flatter a percentile."""
    rows, ready, join_ready = {}, {}, None
    half = cfg.join_at
    for m in cfg.models:
        for w, _ in WINDOWS:
            lat, unf = [], 0
            for r in run["replicas"]:
                res = r.get("result")
                if r["model"] != m or r["joined"] or not res:
                    continue
                inside = (lambda a: a < half) if w == "before" else (lambda a: half <= a)
                lat += [x[1] for x in res["requests"] if inside(x[0])]
                late = [x[1] for x in res["unfinished"] if inside(x[0])]
                lat += late
                unf += len(late)
            if any(r["model"] == m and not r["joined"] for r in run["replicas"]):
                rows[f"{m}/{w}"] = stats(lat, unf)
        each = [r["result"]["t_first_result"] - r["t_spawn"] for r in run["replicas"]
                if r["model"] == m and not r["joined"] and r.get("result")]
        if each:
            times = sorted(each)
            ready[m] = {"median_s": pct(times, 50), "max_s": times[-1], "n": len(times), "each_s": each}
    for r in run["replicas"]:
        res = r.get("result")
        if r["joined"] and res:
            join_ready = res["t_first_result"] - r["t_spawn"]
            late = [x[1] for x in res["unfinished"]]
            rows[f"{r['model']}/joined"] = stats([x[1] for x in res["requests"]] + late, len(late))
    return {"rows": rows, "ready": ready, "join_ready_s": join_ready}


def build(cfg, alone_ms, runs, gpu=""):
    """The report: config, limits, each mode's status and figures, the ratios to the limit
    and the goals. runs: {mode: serving.run_mode's dict or serving.skipped's}."""
    lim = limits(cfg, alone_ms)
    modes = {}
    for mode, run in runs.items():
        m = {"status": run["status"], "reason": run.get("reason", "")}
        if run["status"] == "OK":
            m.update(mode_figures(cfg, run))
            m["p99_over_limit"] = {k: ratio(v["p99_ms"], lim.get(k.split("/")[0], {}).get("p99_ms"))
                                   for k, v in m["rows"].items()}
        modes[mode] = m
    return {"gpu": gpu, "config": config_dict(cfg), "alone_ms": alone_ms, "limits": lim, "modes": modes,
            "goals": goals(cfg, modes)}


def ratio(a, b):
    if a is None or b is None or b <= 0 or math.isinf(b):
        return None
    return a / b


def config_dict(cfg):
    return {"mix": [vars(e) for e in cfg.mix], "seconds": cfg.seconds, "join_at_s": cfg.join_at,
            "join": vars(cfg.join) if cfg.join else None, "grace_s": cfg.grace, "seed": cfg.seed, "fake": cfg.fake,
            "alone_requests": cfg.alone_requests, "md1_samples": cfg.md1_samples}


def goals(cfg, modes):
    """The issue's goals that this run can judge: met (True/False) or None (not measured)."""
    def p99_ratios(mode):
        m = modes.get(mode, {})
        return {k: v for k, v in m.get("p99_over_limit", {}).items() if k.endswith("/before")}

    g = {}
    om = p99_ratios("omps")
    if om and None not in om.values():
        worst = max(om, key=om.get)
        g["omps_p99_within_limit"] = {"met": om[worst] <= GOAL, "worst": worst.split("/")[0], "ratio": om[worst]}
    else:
        g["omps_p99_within_limit"] = {"met": None}
    mp = p99_ratios("mps")
    if mp and None not in mp.values():
        worst = max(mp, key=mp.get)
        g["mps_p99_over_10x"] = {"met": mp[worst] > 10, "worst": worst.split("/")[0], "ratio": mp[worst]}
    else:
        g["mps_p99_over_10x"] = {"met": None}
    oj, mj = (modes.get(x, {}).get("join_ready_s") for x in ("omps", "mps"))
    g["join_ready_vs_mps"] = {"met": oj <= mj if oj is not None and mj is not None else None,
                              "omps_s": oj, "mps_s": mj}
    rows = modes.get("omps", {}).get("rows", {})
    rise = {m: ratio(rows[f"{m}/after"]["p99_ms"], rows[f"{m}/before"]["p99_ms"])
            for m in cfg.models if f"{m}/after" in rows and f"{m}/before" in rows}
    ok = [v for v in rise.values() if v is not None]
    g["join_p99_rise"] = {"met": max(ok) <= JOIN_RISE if ok and cfg.join else None, "rise": rise}
    return g


# ---------------------------------------------------------------- text

def ms(v):
    if v is None:
        return "-"
    if math.isinf(v):
        return "inf"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def fx(v):
    return "-" if v is None else f"{v:.2f}x"


def _cell(report, mode, key):
    m = report["modes"].get(mode)
    if m is None:
        return "not run"
    if m["status"] != "OK":
        return m["status"]
    r = m["rows"].get(key)
    return "-" if r is None else f"{ms(r['p50_ms'])} / {ms(r['p99_ms'])} / {ms(r['max_ms'])}"


def _ratio_cell(report, mode, key):
    m = report["modes"].get(mode)
    return fx(m.get("p99_over_limit", {}).get(key)) if m and m["status"] == "OK" else "-"


def _verdict(v):
    return "not measured" if v is None else "met" if v else "MISSED"


def render(report):
    """The table, as lines ($OUT/serving.txt, and table.txt's serving section)."""
    cfg, lim = report["config"], report["limits"]
    lines = [f"## serving benchmark (issue 25): {report['gpu'] or 'unknown GPU'}", ""]
    mix = ", ".join(f"{e['model']} x{e['count']} at {e['rate']:g}/s" for e in cfg["mix"])
    lines.append(f"mix: {mix}; open-loop Poisson arrivals; window {cfg['seconds']:g} s"
                 + (f"; one more {cfg['join']['model']} joins at {cfg['join_at_s']:g} s" if cfg["join"] else "")
                 + ("; FAKE replicas (sleep, no GPU)" if cfg["fake"] else ""))
    lines.append("alone latency (native, median): "
                 + ", ".join(f"{m} {ms(v)} ms" for m, v in report["alone_ms"].items()))
    lines.append("")
    lines.append("| model | window | limit p50 / p99 | native p50 / p99 / max | MPS p50 / p99 / max | "
                 "omps p50 / p99 / max | MPS p99 / limit | omps p99 / limit |")
    lines.append("|---|---|---|---|---|---|---|---|")
    keys = [(f"{e['model']}/{w}", e, wl) for e in cfg["mix"] for w, wl in WINDOWS]
    if cfg["join"]:
        keys.append((f"{cfg['join']['model']}/joined", cfg["join"], "joined, from ready"))
    for key, e, wl in keys:
        m, lm = e["model"], lim.get(e["model"])
        limit = f"{ms(lm['p50_ms'])} / {ms(lm['p99_ms'])}" if lm else "-"
        rho = f" (rho {lm['rho']:.2f})" if lm else ""
        lines.append(f"| {m} x{e['count']} at {e['rate']:g}/s{rho} | {wl} | {limit} | "
                     + " | ".join(_cell(report, mode, key) for mode, _ in MODES)
                     + f" | {_ratio_cell(report, 'mps', key)} | {_ratio_cell(report, 'omps', key)} |")
    lines += ["", "latencies in ms: completion - arrival (queueing counts); limit = M/D/1 sojourn at the "
              "row's rate with the alone latency as service time (Lindley recursion, "
              f"{cfg['md1_samples']:,} arrivals)"]
    lines += ["", "| time to ready, s (exec to first result), each replica | native | MPS | omps | omps / MPS |",
              "|---|---|---|---|---|"]
    for m in (e["model"] for e in cfg["mix"]):
        cells = []
        for mode, _ in MODES:
            md = report["modes"].get(mode, {})
            r = md.get("ready", {}).get(m)
            cells.append(md.get("status", "not run") if md.get("status") != "OK"
                         else "-" if r is None else ", ".join(f"{t:.2f}" for t in r["each_s"]))
        om, mp = (report["modes"].get(k, {}).get("ready", {}).get(m) for k in ("omps", "mps"))
        rt = ratio(om["max_s"], mp["max_s"]) if om and mp else None
        lines.append(f"| {m}, started together | " + " | ".join(cells) + f" | {fx(rt)}{' (slowest)' if rt else ''} |")
    if cfg["join"]:
        jr = {mode: report["modes"].get(mode, {}).get("join_ready_s") for mode, _ in MODES}
        st = {mode: report["modes"].get(mode, {}).get("status", "not run") for mode, _ in MODES}
        cells = [st[mode] if st[mode] != "OK" else ms(None) if jr[mode] is None else f"{jr[mode]:.2f}"
                 for mode, _ in MODES]
        lines.append(f"| {cfg['join']['model']} joining at {cfg['join_at_s']:g} s | " + " | ".join(cells)
                     + f" | {fx(ratio(jr['omps'], jr['mps']))} |")
    g = report["goals"]
    lines.append("")
    w = g["omps_p99_within_limit"]
    lines.append(f"goal, omps p99 within {GOAL}x of the limit for every model (before the join): {_verdict(w['met'])}"
                 + (f" (worst {w['worst']} {w['ratio']:.2f}x)" if w["met"] is not None else ""))
    w = g["mps_p99_over_10x"]
    lines.append(f"at this load MPS's p99 is over 10x the limit: {_verdict(w['met'])}"
                 + (f" (worst {w['worst']} {w['ratio']:.2f}x)" if w["met"] is not None else ""))
    w = g["join_ready_vs_mps"]
    lines.append(f"goal, the joining replica ready no slower than under MPS: {_verdict(w['met'])}"
                 + (f" (omps {w['omps_s']:.2f} s, MPS {w['mps_s']:.2f} s)" if w["met"] is not None else ""))
    w = g["join_p99_rise"]
    lines.append(f"goal, under omps the others' p99 after the join at most {JOIN_RISE:.2f}x before: "
                 f"{_verdict(w['met'])}" + (" (" + ", ".join(f"{m} {fx(v)}" for m, v in w["rise"].items()) + ")"
                                           if w["rise"] else ""))
    for mode, label in MODES:
        md = report["modes"].get(mode)
        if md and md["status"] != "OK":
            lines.append(f"{label}: {md['status']}: {md['reason']}")
        elif md:
            unf = {k: v["unfinished"] for k, v in md["rows"].items() if v["unfinished"]}
            if unf:
                lines.append(f"{label}: unfinished at the end of the grace period (counted with their latency "
                             "so far): " + ", ".join(f"{k} {v}" for k, v in unf.items()))
    return lines + [""]
