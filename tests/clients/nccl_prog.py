"""torch.distributed over NCCL, two ranks on two GPUs (one process per rank, spawned), as
scripts/clients/run.sh runs it natively and through omps and compares the output.

Every rank fills seeded tensors; rank 0 prints one line per collective: its name, the
result's shape and dtype and a hash of its bytes (what every rank got must agree: a rank
whose result differs from rank 0's makes the program fail). Deterministic for a given
world size: sums of integers and of floats in a fixed order (NCCL's reductions of two
ranks add the same two numbers whichever way the ring runs).

NCCL's default transport between the two GPUs of one machine is P2P over cuMem (VMM
memory exported as POSIX descriptors, mapped by the peer process, cuMemSetAccess for the
peer device): under omps that is the path docs/design.md "Peer access between GPUs"
describes. NVLink SHARP (NVLS) needs multicast objects, which omps refuses
(cuMulticastCreate answers CUDA_ERROR_NOT_SUPPORTED; NCCL falls back), and which on the
lent machines must stay off: NCCL_NVLS_ENABLE=0 is set unless the caller set it, so
native and omps runs take the same algorithms. NCCL_DEBUG=INFO (or any NCCL variable)
passes through; its logs go to stderr.

  python3 tests/clients/nccl_prog.py
"""

import hashlib
import os
import sys
import tempfile

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 2
N = 1 << 20  # elements: large enough for NCCL's P2P/ring paths, not only its LL protocol


def digest(t):
    return hashlib.sha256(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def seeded(rank, n, dtype, salt):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype.is_floating_point:
        # Multiples of 1/256 in a small range: sums of two are exact in float32.
        return (torch.randint(-512, 512, (n,), generator=g).to(dtype) / 256).cuda()
    return torch.randint(-(1 << 20), 1 << 20, (n,), generator=g, dtype=dtype).cuda()


def run(rank, store_path, out_path):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    lines = []

    def report(name, t):
        d = digest(t)
        # Every rank must hold the same result where the collective gives all the same.
        if name.startswith(("all_reduce", "broadcast", "all_gather")):
            mine = torch.tensor([int(d, 16) >> 1], dtype=torch.int64, device="cuda")
            theirs = [torch.zeros_like(mine) for _ in range(WORLD)]
            dist.all_gather(theirs, mine)
            if any(int(x.item()) != int(mine.item()) for x in theirs):
                raise SystemExit(f"rank {rank}: {name} differs between ranks")
        lines.append(f"{name} {tuple(t.shape)} {str(t.dtype).replace('torch.', '')} {d}")

    for dtype in (torch.float32, torch.int64):
        tag = str(dtype).replace("torch.", "")
        x = seeded(rank, N, dtype, 1)
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        report(f"all_reduce_sum_{tag}", x)
        y = seeded(rank, N, dtype, 2)
        dist.all_reduce(y, op=dist.ReduceOp.MAX)
        report(f"all_reduce_max_{tag}", y)
        b = seeded(rank, N, dtype, 3)
        dist.broadcast(b, src=1)
        report(f"broadcast_from_1_{tag}", b)
        parts = [torch.empty(N // 4, dtype=dtype, device="cuda") for _ in range(WORLD)]
        dist.all_gather(parts, seeded(rank, N // 4, dtype, 4))
        report(f"all_gather_{tag}", torch.cat(parts))
        out = torch.empty(N // WORLD, dtype=dtype, device="cuda")
        dist.reduce_scatter_tensor(out, seeded(rank, N, dtype, 5), op=dist.ReduceOp.SUM)
        # Each rank has its own shard: rank 0 prints its own; rank 1's is checked below.
        report(f"reduce_scatter_rank{rank}_{tag}", out)
        # Point to point: rank 0 sends to 1, then 1 sends back what it got, doubled.
        p = seeded(rank, N, dtype, 6)
        if rank == 0:
            dist.send(p, dst=1)
            back = torch.empty_like(p)
            dist.recv(back, src=1)
            if not torch.equal(back, p * 2):
                raise SystemExit(f"send/recv {tag}: rank 1 did not get rank 0's tensor")
            report(f"send_recv_{tag}", back)
        else:
            got = torch.empty_like(p)
            dist.recv(got, src=0)
            dist.send(got * 2, dst=0)
    torch.cuda.synchronize()
    # Rank 1's own results (its reduce-scatter shard) reach the parent through a file.
    with open(f"{out_path}.{rank}", "w") as f:
        f.write("\n".join(lines) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def main():
    if torch.cuda.device_count() < WORLD:
        print(f"needs {WORLD} GPUs, sees {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        store, out = os.path.join(d, "store"), os.path.join(d, "out")
        mp.spawn(run, args=(store, out), nprocs=WORLD, join=True)
        mine = open(f"{out}.0").read().splitlines()
        theirs = [l for l in open(f"{out}.1").read().splitlines() if "reduce_scatter_rank1" in l]
    print(f"world {WORLD} backend nccl")
    for line in mine + theirs:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
