"""ResNet-50 fp16 inference loop for the sharing tests (test_sharing.py).

    python3 infer_loop.py --iters N --out FILE [--barrier PATH]

Prints "ready" once the model has run once, waits for PATH to exist if --barrier is given
(so the test can line several clients up), prints "running" after the first timed
iteration has finished on the GPU, then "done". Saves the first iteration's output and how
many later iterations differed from it (each must be bit-identical: same input, same kernels).
"""

import argparse
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torchvision  # noqa: E402

from registry import DEV, gen, setup_determinism  # noqa: E402


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--barrier")
    args = ap.parse_args()

    setup_determinism()
    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval().to(DEV, torch.float16)
    x = torch.randn(2, 3, 224, 224, generator=gen(1)).to(DEV, torch.float16)
    with torch.no_grad():
        first = model(x)
        sync()
        print("ready", flush=True)
        if args.barrier:
            t0 = time.time()
            while not os.path.exists(args.barrier):
                if time.time() - t0 > 120:
                    raise SystemExit("barrier file never appeared")
                time.sleep(0.01)
        mismatches = torch.zeros((), dtype=torch.int64, device=DEV)
        for i in range(args.iters):
            y = model(x)
            # Counted on the GPU: no synchronisation per iteration.
            mismatches += (y.view(torch.int16) != first.view(torch.int16)).any()
            if i == 0:
                sync()
                print("running", flush=True)
        torch.save({"out": first.cpu(), "last": y.cpu(), "mismatches": int(mismatches.item()),
                    "iters": args.iters}, args.out)
    print("done", flush=True)


if __name__ == "__main__":
    main()
