"""The fp8 family's input formats: per-tensor fp8 (e4m3, e5m2), one fp32 scale per operand.

Formats only (why a formats module imports no kernel: ``kernels.formats``). ``kernels.fp8`` imports it.
"""
from functools import partial

import torch

from kernels.formats import (
    E4M3,
    E4M3_MAX,
    E5M2,
    E5M2_MAX,
    check_gemm_operands,
    check_operand,
    format_operands,
    quantize_tensor,
    saturate_fp8,
)
from kernels.registry import Format, Operands, register_format

# kind -> (torch dtype, TileLang dtype, largest finite value)
FP8 = {
    "e4m3": (E4M3, "float8_e4m3fn", E4M3_MAX),
    "e5m2": (E5M2, "float8_e5m2", E5M2_MAX),
}
FP8_KEYS = ("A", "B", "scale_a", "scale_b")


def quantize_fp8(x: torch.Tensor, kind: str, *, operand: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor fp8 quantization: scale = amax / fp8_max (``formats.amax_scale``: never below fp32's
    smallest normal, 1 for an all-zero tensor); values clamped before the cast (``formats.saturate_fp8``).

    torch's fp8 casts need not saturate (out of range, e5m2 gives Inf; e4m3fn NaN on some builds), hence the clamp.
    Returns (q, scale) with ``q.float() * scale ≈ x`` and scale a float32 tensor of shape (1,).
    ``operand`` (e.g. "A") names the tensor in error messages.
    """
    if kind not in FP8:
        raise ValueError(f"unknown fp8 kind {kind!r}; expected one of {sorted(FP8)}")
    check_operand(x, "quantize_fp8", operand)
    torch_dtype, _, fmax = FP8[kind]
    return quantize_tensor(x, fmax, partial(saturate_fp8, dtype=torch_dtype))


def _quantize_pair(A: torch.Tensor, B: torch.Tensor, kind: str, name: str) -> Operands:
    check_gemm_operands(A, B, name)
    a, sa = quantize_fp8(A, kind, operand="A")
    b, sb = quantize_fp8(B, kind, operand="B")
    return {"A": a, "B": b, "scale_a": sa, "scale_b": sb}


def _dequantize_pair(ops: Operands, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    a, b, sa, sb = format_operands(ops, FP8_KEYS, f"format {name}'s dequantize")
    return a.double() * sa.double(), b.double() * sb.double()


def _register_format(name: str, kind: str) -> Format:
    return register_format(Format(
        name=name, quantize=partial(_quantize_pair, kind=kind, name=name), dequantize=partial(_dequantize_pair, name=name),
        reads=FP8_KEYS, description=f"{kind} values, one fp32 scale per tensor (amax/{FP8[kind][2]:g}), clamped before the cast",
    ))


FP8_E4M3_TENSOR = _register_format("fp8_e4m3_tensor", "e4m3")
FP8_E5M2_TENSOR = _register_format("fp8_e5m2_tensor", "e5m2")
