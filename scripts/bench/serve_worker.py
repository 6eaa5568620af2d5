#!/usr/bin/env python3
"""One replica of the serving benchmark (tests/gpu/test_serving.py, tests/gpu/serving.py):
a process that serves one request at a time under open-loop Poisson arrivals. It exists
because the benchmark's replicas must be separate processes (each its own CUDA client,
natively, under NVIDIA MPS or under omps) running the models of bench_models.py.

    serve_worker.py --model M --rate R --seed S --start-file PATH --out JSON [--warmup W]
    serve_worker.py --alone M1:N1:W1,M2:N2:W2,... --out JSON
    serve_worker.py --touch

Serving: builds model M, runs W untimed warm-up requests (the first one's end is the
replica's first result, `t_first_result`), prints READY and waits for the start file,
which holds two Unix times, the start and the end of the window. Arrivals begin at the
start, or at once for a replica that finds the window open (the one that joins later):
seeded exponential gaps of mean 1/R, fixed by the seed whatever the service does. Each
arrival is served when the previous request is done; its latency = completion - arrival,
so queueing counts. Arrivals stop at the end; the backlog is served for --grace seconds
more, and what is left is written as unfinished with its latency so far.
Alone: each model Mi in turn, Wi warm-up then Ni back-to-back requests, each timed; the
medians are the service times of the benchmark's interference-free limit.
Touch: initializes CUDA and exits (the first client of an MPS or omps server, untimed).

--fake-ms MS (with --fake-build-s S): no torch; building sleeps S and a request sleeps MS
(so the orchestration and the report can be tested on a machine without a GPU).
Times are time.time() (every process reads one clock); JSON is written atomically.
"""
import argparse
import json
import os
import random
import sys
import time


def sleep_until(t):
    """time.sleep to within half a millisecond of t, then a short spin (sleep overshoots)."""
    while True:
        left = t - time.time()
        if left <= 0:
            return
        if left > 0.0005:
            time.sleep(left - 0.0005)


def load(model, args):
    """(request, sync, info) of a model, real or fake."""
    if args.fake_ms is not None:
        time.sleep(args.fake_build_s)
        return (lambda: time.sleep(args.fake_ms / 1e3)), (lambda: None), {"fake_ms": args.fake_ms}
    import torch

    import bench_models

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # GPU inference: one CPU thread a replica, nine replicas
    request = bench_models.build(model, args.device)
    if args.device == "cuda":
        return request, torch.cuda.synchronize, {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    return request, (lambda: None), {"torch": torch.__version__, "device": args.device}


def warm(request, sync, n, info):
    """n untimed requests; the time the first one's result was there, or None if n == 0."""
    first, y = None, None
    for i in range(n):
        y = request()
        if i == 0:
            sync()
            first = time.time()
    sync()
    if y is not None and hasattr(y, "isfinite"):
        info["finite"] = bool(y.isfinite().all().item())
        if not info["finite"]:
            print("warning: the warm-up output is not finite", file=sys.stderr)
    return first


def read_window(path, timeout):
    """(start, end) from the start file, once it exists."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                a, b = f.read().split()
            return float(a), float(b)
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            sys.exit(f"start file {path} did not appear within {timeout} s")
        time.sleep(0.002)


def serve(request, sync, rate, seed, t0, t_end, grace):
    """Open-loop Poisson arrivals from max(t0, now) to t_end; (begin, done, unfinished):
    done = [[arrival - t0 (s), latency (ms), service (ms)], ...]."""
    rng = random.Random(seed)
    begin = max(t0, time.time())
    stop = t_end + grace
    done, unfinished = [], []
    a = begin + rng.expovariate(rate)
    while a < t_end:
        if time.time() > stop:
            break
        sleep_until(a)
        s = time.time()
        request()
        sync()
        e = time.time()
        done.append([round(a - t0, 6), round((e - a) * 1e3, 4), round((e - s) * 1e3, 4)])
        a += rng.expovariate(rate)
    now = time.time()
    while a < t_end:  # the backlog left at the end of the grace period
        unfinished.append([round(a - t0, 6), round((now - a) * 1e3, 4)])
        a += rng.expovariate(rate)
    return begin, done, unfinished


def alone(args, out):
    res = {}
    for spec in args.alone.split(","):
        model, n, w = spec.split(":")
        request, sync, info = load(model, args)
        warm(request, sync, int(w), info)
        lat = []
        for _ in range(int(n)):
            s = time.perf_counter()
            request()
            sync()
            lat.append((time.perf_counter() - s) * 1e3)
        srt = sorted(lat)
        res[model] = {"median_ms": srt[(len(srt) - 1) // 2], "per_request_ms": lat, **info}
        print(f"{model}: alone median {res[model]['median_ms']:.3f} ms over {len(lat)} requests", flush=True)
    out["alone"] = res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="resnet50, encoder, graph_decoder or decoder (bench_models.py)")
    ap.add_argument("--alone", help="model:requests:warmup,... to time alone, one after the other")
    ap.add_argument("--touch", action="store_true", help="initialize CUDA and exit")
    ap.add_argument("--rate", type=float, help="arrivals per second")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--start-file")
    ap.add_argument("--start-timeout", type=float, default=600.0)
    ap.add_argument("--grace", type=float, default=5.0, help="seconds after the end to serve the backlog")
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda", help="cuda (the benchmark); cpu only to test the code")
    ap.add_argument("--fake-ms", type=float, help="fake model: milliseconds a request (no torch)")
    ap.add_argument("--fake-build-s", type=float, default=0.2, help="fake model: seconds to build")
    args = ap.parse_args()
    t_main = time.time()

    if args.touch:
        import torch

        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        print("TOUCHED", flush=True)
        return
    if not args.out or not (args.alone or (args.model and args.rate and args.start_file)):
        ap.error("--out and either --alone or --model, --rate and --start-file are needed")

    out = {"pid": os.getpid(), "t_main": t_main}
    guard = None
    if args.fake_ms is None:
        import torch

        guard = torch.inference_mode()  # kept referenced: inference mode for the rest of main()
        guard.__enter__()
    if args.alone:
        alone(args, out)
    else:
        request, sync, info = load(args.model, args)
        first = warm(request, sync, max(args.warmup, 1), info)
        print("READY", flush=True)
        t_ready = time.time()
        t0, t_end = read_window(args.start_file, args.start_timeout)
        begin, done, unfinished = serve(request, sync, args.rate, args.seed, t0, t_end, args.grace)
        out.update(model=args.model, rate=args.rate, seed=args.seed, t_first_result=first, t_ready=t_ready,
                   t0=t0, t_end=t_end, begin=begin, requests=done, unfinished=unfinished, **info)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, args.out)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
