"""Precision-independent baselines: the unquantized GEMM every low-precision variant is compared to."""
from __future__ import annotations

from functools import partial

import torch

from kernels.registry import Format, Operands, Variant, register_format, register_variant
from kernels.scales import check_operand


def _to_bf16(A: torch.Tensor, B: torch.Tensor) -> Operands:
    check_operand(A, "bf16", "A")
    check_operand(B, "bf16", "B")
    return {"A": A.to(torch.bfloat16), "B": B.to(torch.bfloat16)}


def _bf16_to_f64(ops: Operands) -> tuple[torch.Tensor, torch.Tensor]:
    return ops["A"].double(), ops["B"].double()


def _matmul_bf16(kernel, ops: Operands) -> torch.Tensor:
    return torch.matmul(ops["A"], ops["B"].T)


register_format(Format("bf16", _to_bf16, _bf16_to_f64, reads=("A", "B"),
                       description="the unquantized inputs rounded to bf16"))
register_variant(
    Variant(
        name="cublas_bf16",
        family="baseline",
        input_format="bf16",
        emulate=partial(_matmul_bf16, None),  # torch's CPU bf16 matmul accumulates in fp32 like cuBLAS
        launch=_matmul_bf16,
        description="torch.matmul (cuBLAS) of the unquantized inputs in bf16",
    )
)
