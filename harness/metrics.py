"""Scale-free error metrics, all computed in float64."""
from __future__ import annotations

import math

import torch


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity gap: 1 - 2<x,y> / (|x|^2 + |y|^2); 0 for identical tensors."""
    x = x.double()
    y = y.double()
    denom = (x * x).sum() + (y * y).sum()
    if denom == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denom)


def rel_fro(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F."""
    ref = ref.double()
    num = torch.linalg.vector_norm(out.double() - ref)
    den = torch.linalg.vector_norm(ref)
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return float(num / den)


def error_metrics(out: torch.Tensor, ref: torch.Tensor, prefix: str) -> dict[str, float]:
    """rel. Frobenius, calc_diff and max abs error of ``out`` against ``ref``, keys prefixed."""
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from reference {tuple(ref.shape)}")
    o = out.double()
    finite = bool(torch.isfinite(o).all())
    return {
        f"{prefix}_rel_fro": rel_fro(o, ref),
        f"{prefix}_calc_diff": calc_diff(o, ref),
        f"{prefix}_max_abs": float((o - ref.double()).abs().max()) if o.numel() else 0.0,
        f"{prefix}_finite": finite,
    }


# The error metrics a result can be gated on (a config tolerance each: variants.<name>.tolerance)
TOLERANCE_KEYS = ("total_rel_fro", "total_calc_diff", "kernel_rel_fro", "kernel_calc_diff")


def gated_metrics(variant) -> tuple[str, ...]:
    """The metrics a variant's results are judged by, each of which needs a tolerance (a metric without
    one passes any error): all of them; for an integer GEMM (``exact_reference``), whose product is checked
    bit for bit and whose total error is its format's (reported, not gated), the kernel error only."""
    return ("kernel_rel_fro",) if variant.exact_reference is not None else TOLERANCE_KEYS
