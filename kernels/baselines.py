"""Precision-independent baselines: the unquantized GEMM every low-precision variant is compared to."""
from __future__ import annotations

import torch

from kernels.formats import check_gemm_operands, format_operands, to_bf16
from kernels.registry import Format, Operands, Variant, register_format, register_variant


def _to_bf16(A: torch.Tensor, B: torch.Tensor) -> Operands:
    check_gemm_operands(A, B, BF16.name)  # the format, registered below, names itself in the errors
    # a value beyond bf16's range is refused, not stored as Inf (formats.to_bf16 says why)
    return {"A": to_bf16(A, BF16.name, "A"), "B": to_bf16(B, BF16.name, "B")}


def _bf16_to_f64(ops: Operands) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = format_operands(ops, ("A", "B"), f"format {BF16.name}'s dequantize")
    return a.double(), b.double()


def launch_cublas_bf16(kernel, ops: Operands) -> torch.Tensor:
    """torch.matmul of the bf16 operands (cuBLAS on the GPU); with no kernel also cublas_bf16's emulation."""
    return torch.matmul(ops["A"], ops["B"].T)


def emulate_cublas_bf16(ops: Operands) -> torch.Tensor:
    """cublas_bf16's emulation: its launch without a kernel (torch's CPU bf16 matmul accumulates in fp32
    like cuBLAS), after the operand check the timed launch does without."""
    format_operands(ops, ("A", "B"), "emulate_cublas_bf16")
    return launch_cublas_bf16(None, ops)


BF16 = register_format(Format("bf16", _to_bf16, _bf16_to_f64, reads=("A", "B"),
                              description="the unquantized inputs rounded to bf16"))
CUBLAS_BF16 = register_variant(
    Variant(
        name="cublas_bf16",
        family="baseline",
        input_format=BF16.name,
        emulate=emulate_cublas_bf16,
        launch=launch_cublas_bf16,
        description="torch.matmul (cuBLAS) of the unquantized inputs in bf16",
    )
)
