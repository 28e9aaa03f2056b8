"""The baseline family's input format: the unquantized inputs rounded to bf16 (``bf16``).

Formats only (why a formats module imports no kernel: ``kernels.formats``). ``kernels.baselines`` imports it.
"""
import torch

from kernels.formats import check_gemm_operands, format_operands, to_bf16
from kernels.registry import Format, Operands, register_format

BF16_FORMAT = "bf16"


def _to_bf16(A: torch.Tensor, B: torch.Tensor) -> Operands:
    check_gemm_operands(A, B, BF16_FORMAT)
    # a value beyond bf16's range is refused, not stored as Inf (formats.to_bf16 says why)
    return {"A": to_bf16(A, BF16_FORMAT, "A"), "B": to_bf16(B, BF16_FORMAT, "B")}


def _bf16_to_f64(ops: Operands) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = format_operands(ops, ("A", "B"), f"format {BF16_FORMAT}'s dequantize")
    return a.double(), b.double()


BF16 = register_format(Format(BF16_FORMAT, _to_bf16, _bf16_to_f64, reads=("A", "B"),
                              description="the unquantized inputs rounded to bf16"))
