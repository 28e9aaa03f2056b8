"""Precision-independent baselines: the unquantized GEMM every low-precision variant is compared to.

Its format (``bf16``) is in ``kernels.baselines_formats``, its launch in ``kernels.peers``."""
from __future__ import annotations

import torch

from kernels.baselines_formats import BF16
from kernels.formats import format_operands
from kernels.peers import launch_cublas_bf16
from kernels.registry import Operands, register


def emulate_cublas_bf16(ops: Operands) -> torch.Tensor:
    """cublas_bf16's emulation: its launch without a kernel (torch's CPU bf16 matmul accumulates in fp32
    like cuBLAS), after the operand check the timed launch does without."""
    format_operands(ops, ("A", "B"), "emulate_cublas_bf16")
    return launch_cublas_bf16(None, ops)


CUBLAS_BF16 = register(
    name="cublas_bf16", family="baseline", input_format=BF16.name, emulate=emulate_cublas_bf16,
    launch=launch_cublas_bf16, description="torch.matmul (cuBLAS) of the unquantized inputs in bf16",
)
