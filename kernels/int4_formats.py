"""The int4 family's input formats: symmetric per-tensor int4, packed two per byte along K
(``int4_tensor``) or already unpacked to int8 (``int4_tensor_unpacked_s8``, the int8 peers' input).

Formats only (why a formats module imports no kernel: ``kernels.formats``). ``kernels.int4`` imports it.
"""
from collections.abc import Mapping
from functools import partial

import torch

from kernels.formats import (
    INT4_MAX,
    check_gemm_operands,
    check_operand,
    encode_int4,
    format_operands,
    pack_int4,
    quantize_tensor,
    unpack_int4,
)
from kernels.registry import Format, Operands, register_format

PACKED_KEYS = ("A_packed", "B_packed")
UNPACKED_KEYS = ("A", "B")
SCALE_KEYS = ("scale_a", "scale_b")


def quantize_int4(x: torch.Tensor, *, operand: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-tensor int4: scale = amax / 7, q = clamp(round(x / scale), -8, 7).

    The scale comes from ``formats.amax_scale`` (never below fp32's smallest normal, 1 for an all-zero
    tensor). Rounding is torch.round (to nearest, ties to even). Returns (q int8, scale float32 of shape
    (1,)). ``operand`` (e.g. "A") names the tensor in error messages.
    """
    check_operand(x, "quantize_int4", operand)
    return quantize_tensor(x, INT4_MAX, encode_int4)


def _quantize_packed(A: torch.Tensor, B: torch.Tensor, name: str) -> Operands:
    check_gemm_operands(A, B, name)
    qa, sa = quantize_int4(A, operand="A")
    qb, sb = quantize_int4(B, operand="B")
    return {"A_packed": pack_int4(qa), "B_packed": pack_int4(qb), "scale_a": sa, "scale_b": sb}


def _quantize_unpacked(A: torch.Tensor, B: torch.Tensor, name: str) -> Operands:
    check_gemm_operands(A, B, name)
    qa, sa = quantize_int4(A, operand="A")
    qb, sb = quantize_int4(B, operand="B")
    return {"A": qa, "B": qb, "scale_a": sa, "scale_b": sb}


def int_operands(ops: Operands, who: str = "int_operands") -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 values (A (M,K), B (N,K)) of either int4 format: A_packed/B_packed unpacked, or A/B.
    ``who`` (the caller) names it in the error for a dict holding neither."""
    if isinstance(ops, Mapping) and PACKED_KEYS[0] in ops:
        return tuple(unpack_int4(t) for t in format_operands(ops, PACKED_KEYS, who))
    return format_operands(ops, UNPACKED_KEYS, f"{who} (A_packed and B_packed, or A and B)")


def _dequantize(ops: Operands, name: str, keys: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    who = f"format {name}'s dequantize"
    a, b, sa, sb = format_operands(ops, keys + SCALE_KEYS, who)
    if keys == PACKED_KEYS:
        a, b = unpack_int4(a), unpack_int4(b)
    return a.double() * sa.double(), b.double() * sb.double()


def _register(name: str, quantize, keys: tuple[str, ...], description: str) -> Format:
    return register_format(Format(
        name, partial(quantize, name=name), partial(_dequantize, name=name, keys=keys),
        reads=keys,  # the scales are applied to the int32 result, outside the kernel
        description=description,
    ))


INT4_TENSOR = _register(
    "int4_tensor", _quantize_packed, PACKED_KEYS,
    "int4 in [-8,7], one fp32 scale per tensor (amax/7, round to nearest, clamp), "
    "packed two per byte along K: A_packed (M,K/2), B_packed (N,K/2) int8",
)
INT4_TENSOR_UNPACKED_S8 = _register(
    "int4_tensor_unpacked_s8", _quantize_unpacked, UNPACKED_KEYS,
    "the int4_tensor values already unpacked to int8: A (M,K), B (N,K), same scales",
)
