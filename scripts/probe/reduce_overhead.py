# torch.compile(mode="reduce-overhead") and the empty capture its cudagraph trees make
# first: the smallest programs that show how each step goes through omps.
import torch

s = torch.cuda.Stream()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle(), stream=s,
                      capture_error_mode="thread_local"):
    pass
print("empty capture ok", flush=True)
mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                          torch.nn.Linear(512, 256)).cuda()
f = torch.compile(mlp, mode="reduce-overhead")
with torch.no_grad():
    for i in range(6):
        y = f(torch.randn(32, 256, device="cuda"))
        print(i, float(y.sum()), flush=True)
