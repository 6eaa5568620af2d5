# torch.multiprocessing sharing a CUDA tensor allocated with expandable segments: the
# smallest program that shows how PyTorch's VMM sharing goes through omps.
import os
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
import torch
import torch.multiprocessing as tmp


def child(q_in, q_out):
    t = q_in.get()
    t.mul_(3)
    torch.cuda.synchronize()
    q_out.put(float(t[:8].sum()))


if __name__ == "__main__":
    mp = tmp.get_context("spawn")
    q_in, q_out = mp.Queue(), mp.Queue()
    p = mp.Process(target=child, args=(q_in, q_out))
    p.start()
    t = torch.arange(4096, device="cuda", dtype=torch.float32)
    q_in.put(t)
    print("child saw", q_out.get(timeout=30), flush=True)
    torch.cuda.synchronize()
    print("parent sees", float(t[:8].sum()), flush=True)
    p.join(timeout=30)
