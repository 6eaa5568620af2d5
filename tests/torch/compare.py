"""Comparing two workload result dicts (CPU tensors, numbers, strings).

exact: every value must be bit-identical (floats compared as their bit patterns, so NaN
payloads and -0.0 count too). Integer and bool tensors (token ids, indices) are always
compared this way, whatever the workload declares.

tolerance: per key, |got - native| <= max(1e-6 * max|native|, 4 * spread, 4 * eps(dtype) * max|native|)
where spread is the largest difference between two native runs of that key: the tolerance
follows what the hardware itself varies by, with a floor for keys that happened not to vary.
"""

import math
from dataclasses import dataclass, field

import torch

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _is_meta(key):
    return key.startswith("__")


def _bitwise_equal(a, b):
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point():
        a, b = a.contiguous().view(_BITS[a.element_size()]), b.contiguous().view(_BITS[b.element_size()])
    return torch.equal(a, b)


def _max_abs_diff(a, b):
    """Largest |a - b| over positions finite in both; inf if NaN or inf positions differ."""
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    a, b = a.double(), b.double()  # float8 and bf16 convert via double too
    if a.numel() == 0:
        return 0.0
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(fa, fb) or not torch.equal(a[~fa].nan_to_num(), b[~fb].nan_to_num()):
        return math.inf
    return (a[fa] - b[fb]).abs().max().item() if fa.any() else 0.0


def _scale(t):
    t = torch.view_as_real(t) if t.is_complex() else t
    t = t.double()
    t = t[torch.isfinite(t)]
    return t.abs().max().item() if t.numel() else 0.0


def value_diff(a, b):
    """Largest difference between two values of one key (inf when they cannot be compared)."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return math.inf
        return _max_abs_diff(a, b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b)) if a == a or b == b else 0.0
    return 0.0 if a == b else math.inf


def spread(run1, run2):
    """Per key, how far two native runs are apart."""
    return {k: value_diff(v, run2.get(k)) for k, v in run1.items() if not _is_meta(k)}


def nonfinite(result):
    """Keys whose floating tensors hold NaN or inf (a comparison of NaNs proves little)."""
    bad = []
    for k, v in result.items():
        if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex()):
            if not torch.isfinite(torch.view_as_real(v) if v.is_complex() else v).all():
                bad.append(k)
    return bad


@dataclass
class Outcome:
    ok: bool = True
    max_diff: float = 0.0
    max_tol: float = 0.0
    problems: list = field(default_factory=list)


def compare(native, got, exact, spreads=None):
    out = Outcome()
    keys = [k for k in native if not _is_meta(k)]
    extra = sorted(k for k in got if not _is_meta(k) and k not in native)
    if extra:
        out.problems.append(f"keys not in the native result: {extra}")
    for k in keys:
        a, b = native[k], got.get(k)
        d = value_diff(a, b) if k in got else math.inf
        out.max_diff = max(out.max_diff, d)
        if k not in got:
            out.problems.append(f"{k}: missing")
            continue
        if isinstance(a, torch.Tensor) and d == math.inf:
            desc = f"{tuple(b.shape)} {b.dtype}" if isinstance(b, torch.Tensor) else type(b).__name__
            out.problems.append(f"{k}: native {tuple(a.shape)} {a.dtype}, got {desc} (or NaN/inf placement differs)")
            continue
        bitwise = exact or not isinstance(a, (torch.Tensor, float)) or (
            isinstance(a, torch.Tensor) and not (a.is_floating_point() or a.is_complex()))
        if bitwise:
            same = _bitwise_equal(a, b) if isinstance(a, torch.Tensor) else (a == b or (a != a and b != b))
            if not same:
                out.problems.append(f"{k}: not bit-identical (max abs diff {d:.3g})")
            continue
        scale = _scale(a) if isinstance(a, torch.Tensor) else abs(a)
        eps = torch.finfo(a.dtype).eps if isinstance(a, torch.Tensor) else torch.finfo(torch.float64).eps
        tol = max(1e-6 * scale, 4 * (spreads or {}).get(k, 0.0), 4 * eps * scale)
        out.max_tol = max(out.max_tol, tol)
        if not d <= tol:
            out.problems.append(f"{k}: max abs diff {d:.3g} > tolerance {tol:.3g} "
                                f"(native spread {(spreads or {}).get(k, 0.0):.3g}, max|native| {scale:.3g})")
    out.ok = not out.problems
    return out
