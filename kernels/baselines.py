"""Precision-independent baselines: the unquantized GEMM every low-precision variant is compared to."""
from __future__ import annotations

from functools import partial

import torch

from kernels.formats import check_operand
from kernels.registry import Format, Operands, Variant, register_format, register_variant


def _to_bf16(A: torch.Tensor, B: torch.Tensor) -> Operands:
    check_operand(A, BF16.name, "A")  # the format, registered below, names itself in the errors
    check_operand(B, BF16.name, "B")
    return {"A": A.to(torch.bfloat16), "B": B.to(torch.bfloat16)}


def _bf16_to_f64(ops: Operands) -> tuple[torch.Tensor, torch.Tensor]:
    return ops["A"].double(), ops["B"].double()


def launch_cublas_bf16(kernel, ops: Operands) -> torch.Tensor:
    """torch.matmul of the bf16 operands (cuBLAS on the GPU); with no kernel also cublas_bf16's emulation."""
    return torch.matmul(ops["A"], ops["B"].T)


BF16 = register_format(Format("bf16", _to_bf16, _bf16_to_f64, reads=("A", "B"),
                              description="the unquantized inputs rounded to bf16"))
CUBLAS_BF16 = register_variant(
    Variant(
        name="cublas_bf16",
        family="baseline",
        input_format=BF16.name,
        emulate=partial(launch_cublas_bf16, None),  # torch's CPU bf16 matmul accumulates in fp32 like cuBLAS
        launch=launch_cublas_bf16,
        description="torch.matmul (cuBLAS) of the unquantized inputs in bf16",
    )
)
