"""The serving benchmark's tests that need no GPU: the M/D/1 limit against what is known of
the queue (no waiting at light load, the Pollaczek-Khinchine mean, Erlang's closed-form
distribution), the mix settings, and the whole flow (alone latencies, native and omps
runs with a join, MPS reported as skipped, the report and its table) with fake replicas
that sleep, in about 15 seconds. It exists so that the orchestration and the math are
checked on any machine before a GPU run spends device time on them:

    python3 -m pytest tests/gpu --serving-fake
"""

import json
import math

import pytest

import serving
import serving_report as sr

pytestmark = [pytest.mark.group("host"), pytest.mark.phase(0)]


def test_percentile():
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert sr.pct(xs, 0) == 1.0 and sr.pct(xs, 50) == 3.0 and sr.pct(xs, 100) == 5.0
    assert sr.pct(xs, 99) == pytest.approx(4.96)
    assert sr.pct([], 50) is None


def test_md1_light_load_is_the_service_time():
    q = sr.md1_quantiles(0.001, 0.010, n=100_000)
    assert q[50] == pytest.approx(0.010, abs=1e-12)
    assert q[99] == pytest.approx(0.010, abs=1e-12)


def test_md1_no_steady_state():
    assert sr.md1_quantiles(100.0, 0.010) == {50: math.inf, 99: math.inf}
    assert sr.md1_mean_wait(100.0, 0.010) == math.inf


@pytest.mark.parametrize("rho, tol", [(0.3, 0.02), (0.5, 0.02), (0.8, 0.05)])
def test_md1_mean_wait_is_pollaczek_khinchine(rho, tol):
    d = 0.005
    rate = rho / d
    s = sr.md1_sojourns(rate, d, 1_000_000)
    mean_wait = math.fsum(s) / len(s) - d
    assert mean_wait == pytest.approx(sr.md1_mean_wait(rate, d), rel=tol)
    assert sr.md1_mean_wait(rate, d) == pytest.approx(rho * d / (2 * (1 - rho)))


def test_md1_distribution_is_erlangs():
    d, rho = 0.004, 0.5
    rate = rho / d
    waits = sorted(x - d for x in sr.md1_sojourns(rate, d, 1_000_000))
    n = len(waits)
    for t in (0.0, 0.5 * d, d, 1.5 * d, 2 * d, 3 * d):
        below = sum(1 for w in waits if w <= t + 1e-15) / n
        assert below == pytest.approx(sr.md1_wait_cdf(t, rate, d), abs=0.004), t
    assert sr.md1_wait_cdf(0.0, rate, d) == pytest.approx(1 - rho)
    # the quantiles the report prints sit where the closed form puts 50% and 99%
    q = sr.md1_quantiles(rate, d)
    assert sr.md1_wait_cdf(q[50] - d, rate, d) == pytest.approx(0.5, abs=0.002)  # P(no wait) = 1 - rho
    assert sr.md1_wait_cdf(q[99] - d, rate, d) == pytest.approx(0.99, abs=0.002)


def test_md1_scales_with_the_service_time():
    a = sr.md1_quantiles(100.0, 0.006, n=200_000)
    b = sr.md1_quantiles(50.0, 0.012, n=200_000)  # the same queue, time stretched 2x
    assert b[50] == pytest.approx(2 * a[50]) and b[99] == pytest.approx(2 * a[99])
    assert a[99] > a[50] >= 0.006


def test_mix_settings():
    cfg = serving.config_from_env({})
    assert [(e.model, e.count, e.rate) for e in cfg.mix] == [("resnet50", 4, 120.0), ("encoder", 2, 100.0),
                                                             ("graph_decoder", 2, 10.0)]
    assert (cfg.join.model, cfg.join.rate, cfg.seconds, cfg.join_at) == ("resnet50", 120.0, 60.0, 30.0)
    cfg = serving.config_from_env({"SERVE_MIX": "encoder:3:50", "SERVE_JOIN": "graph_decoder:5",
                                   "SERVE_SECONDS": "10", "SERVE_ALONE_REQUESTS": "7"})
    assert cfg.models == ["encoder", "graph_decoder"] and cfg.rate("graph_decoder") == 5.0
    assert cfg.alone_requests == {"encoder": 7, "graph_decoder": 7}
    assert serving.config_from_env({"SERVE_JOIN": "none"}).join is None
    for bad in ("resnet50:4", "gpt9:1:1", "resnet50:0:10", "resnet50:1:1,resnet50:2:2"):
        with pytest.raises(ValueError):
            serving.parse_mix(bad)
    with pytest.raises(ValueError):
        serving.config_from_env({"SERVE_MIX": "encoder:1:10", "SERVE_JOIN": "resnet50"})


def _wrap(argv, t):
    return ["timeout", "-k", "5", str(t), *argv]


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    """The whole flow with fake replicas: alone, native, MPS skipped, omps."""
    work = tmp_path_factory.mktemp("serving")
    cfg = serving.config_from_env({"SERVE_SECONDS": "4", "SERVE_ALONE_REQUESTS": "30", "SERVE_GRACE": "2",
                                   "SERVE_READY_TIMEOUT": "60"}, fake=True)
    cfg.md1_samples = 200_000
    logged = []
    alone = serving.measure_alone(cfg, _wrap, work / "alone", logged.append)
    runs = {"native": serving.run_mode(cfg, "native", _wrap, work / "native", logged.append),
            "mps": serving.skipped("mps", "nvidia-cuda-mps-control not found (fake run)")}
    assert serving.touch(cfg, _wrap, work / "omps", logged.append)
    runs["omps"] = serving.run_mode(cfg, "omps", _wrap, work / "omps", logged.append)
    report = sr.build(cfg, alone, runs, "fake GPU")
    lines = sr.render(report)
    (work / "serving.txt").write_text("\n".join(lines))
    print("\n".join(lines))
    return cfg, alone, runs, report, lines, logged


def test_fake_flow_runs(fake_run):
    cfg, alone, runs, report, _, logged = fake_run
    assert set(alone) == {"resnet50", "encoder", "graph_decoder"}
    for m, v in alone.items():
        assert serving.FAKE_MS[m] <= v < serving.FAKE_MS[m] + 5, (m, v)
    assert runs["native"]["status"] == "OK", runs["native"]["reason"]
    assert runs["omps"]["status"] == "OK", runs["omps"]["reason"]
    assert [r["model"] for r in runs["native"]["replicas"]] == (["resnet50"] * 4 + ["encoder"] * 2
                                                                  + ["graph_decoder"] * 2 + ["resnet50"])
    assert [r["joined"] for r in runs["native"]["replicas"]].count(True) == 1
    assert any("all READY" in line for line in logged)
    json.dumps({"report": report, "runs": runs})  # what $OUT/serving.json holds


def test_fake_flow_arrivals(fake_run):
    cfg, _, runs, _, _, _ = fake_run
    native, omps = ({r["name"].split("-", 1)[1]: r["result"] for r in runs[m]["replicas"]} for m in ("native", "omps"))
    # seeded: the same arrivals in every mode
    a = [x[0] for x in native["resnet50-0"]["requests"]][:50]
    b = [x[0] for x in omps["resnet50-0"]["requests"]][:50]
    assert a == pytest.approx(b, abs=1e-5)
    # Poisson at 120/s over 4 s: about 480 each (a wide margin: 5 standard deviations)
    for name in ("resnet50-0", "resnet50-3"):
        n = len(native[name]["requests"]) + len(native[name]["unfinished"])
        assert abs(n - 480) < 5 * math.sqrt(480), (name, n)
    # the joiner serves from its first result, after the middle of the window
    j = native["resnet50-join"]
    assert j["requests"] and j["requests"][0][0] >= cfg.join_at
    assert native["resnet50-0"]["requests"][0][0] < 0.5  # the others from the start
    for r in native.values():
        for arr, lat, svc in r["requests"]:
            assert lat >= svc - 1e-3 and lat > 0


def test_fake_flow_report(fake_run):
    cfg, alone, _, report, _, _ = fake_run
    lim = report["limits"]
    for m in cfg.models:
        q = sr.md1_quantiles(cfg.rate(m), alone[m] / 1e3, n=cfg.md1_samples)
        assert lim[m]["p50_ms"] == pytest.approx(q[50] * 1e3) and lim[m]["p99_ms"] == pytest.approx(q[99] * 1e3)
        assert lim[m]["rho"] == pytest.approx(cfg.rate(m) * alone[m] / 1e3)
    assert report["modes"]["mps"] == {"status": "SKIP", "reason": "nvidia-cuda-mps-control not found (fake run)"}
    for mode in ("native", "omps"):
        md = report["modes"][mode]
        keys = {f"{e.model}/{w}" for e in cfg.mix for w in ("before", "after")} | {"resnet50/joined"}
        assert set(md["rows"]) == keys
        for k, row in md["rows"].items():
            m = k.split("/")[0]
            assert row["n"] > 0, k
            assert alone[m] * 0.9 <= row["p50_ms"] <= row["p99_ms"] <= row["max_ms"], (k, row)
            assert md["p99_over_limit"][k] == pytest.approx(row["p99_ms"] / lim[m]["p99_ms"])
        # fake replicas do not interfere: what they see is the M/D/1 queue itself
        assert 0.8 <= md["rows"]["resnet50/before"]["p50_ms"] / lim["resnet50"]["p50_ms"] <= 2.0
        assert set(md["ready"]) == {"resnet50", "encoder", "graph_decoder"}
        for r in md["ready"].values():
            assert 0.3 <= r["median_s"] <= r["max_s"] < 30
        assert 0.3 <= md["join_ready_s"] < 30
    g = report["goals"]
    assert g["omps_p99_within_limit"]["met"] in (True, False)
    assert g["mps_p99_over_10x"]["met"] is None and g["join_ready_vs_mps"]["met"] is None
    assert set(g["join_p99_rise"]["rise"]) == {"resnet50", "encoder", "graph_decoder"}


def test_fake_flow_table(fake_run):
    cfg, _, _, report, lines, _ = fake_run
    text = "\n".join(lines)
    assert lines[0].startswith("## serving benchmark")
    head = [line for line in lines if line.startswith("| model | window |")]
    assert len(head) == 1 and "limit p50 / p99" in head[0] and "omps p99 / limit" in head[0]
    rows = [line for line in lines if line.startswith("| resnet50 x") or line.startswith("| encoder x")
            or line.startswith("| graph_decoder x")]
    assert len(rows) == 2 * len(cfg.mix) + 1
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 8 and cells[4] == "SKIP", line
        assert cells[3].count("/") == 2 and cells[5].count("/") == 2 and cells[7].endswith("x"), line
    assert "| resnet50 joining at 2 s |" in text
    assert "goal, omps p99 within 1.3x of the limit for every model (before the join):" in text
    assert "MPS: SKIP: nvidia-cuda-mps-control not found (fake run)" in text


def test_fake_flow_goals_with_every_mode(fake_run):
    """The MPS column and the goals that need it, with the native run standing in for MPS."""
    cfg, alone, runs, _, _, _ = fake_run
    rep = sr.build(cfg, alone, {"native": runs["native"], "mps": runs["native"], "omps": runs["omps"]})
    g = rep["goals"]
    mps, omps = rep["modes"]["mps"], rep["modes"]["omps"]
    worst = max((k for k in omps["p99_over_limit"] if k.endswith("/before")), key=omps["p99_over_limit"].get)
    assert g["omps_p99_within_limit"]["ratio"] == omps["p99_over_limit"][worst]
    assert g["omps_p99_within_limit"]["met"] == (omps["p99_over_limit"][worst] <= sr.GOAL)
    assert g["mps_p99_over_10x"]["met"] is False  # sleeping replicas do not interfere
    assert g["join_ready_vs_mps"] == {"met": omps["join_ready_s"] <= mps["join_ready_s"],
                                      "omps_s": omps["join_ready_s"], "mps_s": mps["join_ready_s"]}
    rise = g["join_p99_rise"]["rise"]
    rows = omps["rows"]
    assert rise["encoder"] == pytest.approx(rows["encoder/after"]["p99_ms"] / rows["encoder/before"]["p99_ms"])
    text = "\n".join(sr.render(rep))
    assert "SKIP" not in text and "not measured" not in text
    assert "| resnet50 joining at 2 s |" in text and "x (slowest) |" in text
