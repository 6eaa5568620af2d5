#!/usr/bin/env python3
"""One inference client of scripts/bench/infer-bench.sh.

    python3 infer_worker.py --model resnet50|decoder|fake --requests R --warmup W \
        --start-file PATH --out JSON

Builds the model on CUDA with seeded random weights (nothing is downloaded), runs W
untimed warm-up requests, prints READY (flushed) and waits until the start file exists,
so that N workers start together. Then it runs R requests, each timed with
time.perf_counter() around the request and the torch.cuda.synchronize() that ends it,
and writes {model, requests, wall_s, per_request_ms, ...} to --out.

Models (built by bench_models.py, beside this file, which the serving benchmark shares):
  resnet50  torchvision ResNet-50, fp16, eval, channels-last, batch 1, 224x224.
  decoder   a GPT-2-small-shaped decoder built from torch.nn (12 layers, d_model 768,
            12 heads, vocab 50257, 1024 positions, tied LM head), fp16, with a KV cache
            kept by hand. One request = prefill of a 16-token prompt, then greedy decoding
            until 32 tokens are generated (the tokens stay on the GPU: no host sync per
            token, one at the end of the request).
  fake      no torch at all: a request sleeps --fake-ms (to test the orchestration).
"""
import argparse
import json
import os
import sys
import time

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, choices=["resnet50", "decoder", "fake"])
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--start-file", required=True)
    ap.add_argument("--start-timeout", type=float, default=600.0, help="seconds to wait for the start file")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", help="cuda (the benchmark); cpu only to test the code")
    ap.add_argument("--fake-ms", type=float, default=5.0, help="--model fake: milliseconds per request")
    args = ap.parse_args()

    info = {}
    if args.model == "fake":
        request = lambda: time.sleep(args.fake_ms / 1e3)  # noqa: E731
        sync = lambda: None  # noqa: E731
    else:
        import torch

        torch.manual_seed(args.seed)
        guard = torch.inference_mode()  # kept referenced: inference mode for the rest of main()
        guard.__enter__()
        import bench_models

        request = bench_models.build(args.model, args.device)
        if args.device == "cuda":
            sync = torch.cuda.synchronize
            info = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
        else:  # only to check the models' code on a machine without a GPU
            sync = lambda: None  # noqa: E731
            info = {"torch": torch.__version__, "device": args.device}

    y = None
    for _ in range(args.warmup):
        y = request()
    sync()
    if y is not None:
        info["finite"] = bool(y.isfinite().all().item())
        if not info["finite"]:
            print("warning: the warm-up output is not finite", file=sys.stderr)

    print("READY", flush=True)
    deadline = time.monotonic() + args.start_timeout
    while not os.path.exists(args.start_file):
        if time.monotonic() > deadline:
            sys.exit(f"start file {args.start_file} did not appear within {args.start_timeout} s")
        time.sleep(0.0005)

    lat = []
    t_start = time.time()
    w0 = time.perf_counter()
    for _ in range(args.requests):
        t0 = time.perf_counter()
        request()
        sync()
        lat.append((time.perf_counter() - t0) * 1e3)
    wall = time.perf_counter() - w0
    t_end = time.time()

    res = {"model": args.model, "requests": args.requests, "wall_s": wall, "per_request_ms": lat,
           "warmup": args.warmup, "t_start_unix": t_start, "t_end_unix": t_end, "pid": os.getpid(), **info}
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f)
    os.replace(tmp, args.out)
    print(f"DONE {args.requests} requests in {wall:.3f} s", flush=True)


if __name__ == "__main__":
    main()
