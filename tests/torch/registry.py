"""The workload registry and what every workload shares: seeded inputs, the device,
the deterministic settings. Workloads live in wl_models.py and wl_libs.py; workloads.py
runs one of them."""

import os
from dataclasses import dataclass, field

# Before torch: cuBLAS reads this at its first handle (deterministic workspace use).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

# TORCH_SUITE_DEVICE=cpu only serves to check the workloads' Python without a GPU.
DEV = os.environ.get("TORCH_SUITE_DEVICE", "cuda")


class SkipWorkload(Exception):
    """Raised when the GPU cannot run the workload (saved as {"__skip__": reason})."""


@dataclass
class Workload:
    name: str
    fn: object
    exact: bool
    env: dict = field(default_factory=dict)  # set in the process env before torch is imported
    known_broken: str = ""  # under omps, for now: the tests mark it xfail (not strict)


REGISTRY = {}


def workload(name, exact, env=None, known_broken=""):
    def deco(fn):
        REGISTRY[name] = Workload(name, fn, exact, dict(env or {}), known_broken)
        return fn
    return deco


def setup_determinism():
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)


def gen(seed):
    """A CPU generator: inputs are made on the CPU and copied, so they never depend on
    GPU random kernels (cuRAND-style generation has its own workload)."""
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=gen(seed)).to(DEV, dtype)


def cpu(t):
    return t.detach().cpu()
