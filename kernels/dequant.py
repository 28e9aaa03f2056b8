"""Dequantize GEMM family (W4A16): C (M,N) = A · Ŵᵀ, A bf16 (M,K), W 4-bit (N,K) with group scales.

Only the weight is quantized; A is rounded to bf16. Formats (``kernels.dequant_formats``, which imports
no kernel: the quantizers, ``dequantize``, the bf16 decode the emulation and the torch peers share):
``w4_int4_sym_g128`` (int4, bf16 scale amax/7 per 128 K), ``w4_uint4_zp_g128`` (uint4 with a bf16 scale
and integer zero point per 128 K), ``w4_e2m1_g32`` (fp4 e2m1, bf16 scale amax/6 per 32 K), ``w4_mxfp4``
(OCP MX fp4, E8M0 scale per 32 K), tinygemm's own ``w4_tinygemm_g128``, and ``w4_humming_int4_g128`` (the
codes and scales of ``w4_int4_sym_g128`` in humming-kernels' layout).

Here: the emulations and the registrations. Per format, a TileLang variant ``dequant_w4_<format>``
(the kernel: ``kernels.dequant_w4``) and a torch decode-then-matmul peer ``torch_dequant_matmul_<format>``;
the unquantized bf16 GEMM is the matched peer, torch's own W4A16 kernel (tinygemm,
``torch._weight_int4pack_mm``, on its own format) the second column. humming-kernels' W4A16 GEMM (optional:
where it is installed) runs beside them as a library peer on the same weights as ``dequant_w4_int4_sym_g128``.
The peers' launches are in ``kernels.peers``.
"""
from functools import partial

import torch

from kernels.baselines import CUBLAS_BF16
from kernels.dequant_formats import (
    HUMMING_FORMAT,
    TINYGEMM_FORMAT,
    W4_E2M1_G32,
    W4_INT4_SYM_G128,
    W4_MXFP4,
    W4_UINT4_ZP_G128,
    W4Format,
    decode_weight_bf16,
    humming_as_int4_sym,
    tinygemm_weight,
)
from kernels.dequant_w4 import (
    dequant_w4_kernel,
    dequant_w4_pass_configs,
    dequant_w4_tile_space,
    launch_dequant_w4,
    prepare_dequant_w4,
)
from kernels.formats import format_operands
from kernels.peers import (
    humming_shape_limit,
    launch_humming,
    launch_tinygemm,
    launch_torch_dequant_matmul_w4,
    precompile_humming,
    prepare_humming,
    prepare_tinygemm,
    tinygemm_shape_limit,
)
from kernels.registry import Operands, register


def emulate_dequant_w4(ops: Operands, fmt: W4Format) -> torch.Tensor:
    """The kernels' arithmetic on the CPU: bf16 decoded weights, fp32 accumulation, one bf16 rounding.

    The emulation of every variant of the family but tinygemm (``fmt`` their format): each
    dequant_w4_<format> and torch_dequant_matmul_<format>."""
    A = format_operands(ops, ("A",), "emulate_dequant_w4")[0]
    w = decode_weight_bf16(ops, fmt, "emulate_dequant_w4")
    return (A.float() @ w.float().T).to(torch.bfloat16)


def emulate_tinygemm(ops: Operands) -> torch.Tensor:
    """tinygemm's arithmetic on the CPU: bf16 weights bf16_rn((q - 8)·s + z) (one fma), fp32 accumulation,
    one bf16 rounding of the output (checked against torch's CPU ``_weight_int4pack_mm_for_cpu`` in the tests)."""
    A = format_operands(ops, ("A",), "emulate_tinygemm")[0]
    return (A.float() @ tinygemm_weight(ops, "emulate_tinygemm").to(torch.bfloat16).float().T).to(torch.bfloat16)


# sm_90a: bf16 wgmma with A from registers (the decoded weight fragment). sm_89 and sm_100a build the
# same kernel with bf16 mma.sync (the per-warp A fragment layout is the same); not tuned there.
WGMMA_RS_BF16 = r"wgmma_rs<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32"
MMA_SYNC_BF16 = r"mma_sync<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32"
# ... and in the SASS (wgmma_rs and wgmma_ss share the opcode; k is 16 for bf16)
HGMMA_BF16 = r"HGMMA\.64x\d+x16\.F32\.BF16"
HMMA_BF16 = r"HMMA\.16816\.F32\.BF16"

TINYGEMM = register(
    name="tinygemm_w4_g128", family="dequant", input_format=TINYGEMM_FORMAT, emulate=emulate_tinygemm,
    launch=launch_tinygemm, prepare=prepare_tinygemm, baseline=CUBLAS_BF16.name, min_cc=80,
    shape_limit=tinygemm_shape_limit,
    description="torch._weight_int4pack_mm (tinygemm): torch's W4A16 kernel, int4 g128 with scale and zero, bf16",
)


def emulate_humming(ops: Operands) -> torch.Tensor:
    """humming's arithmetic on the CPU: the family's (bf16 weights bf16_rn(q·s), fp32 accumulation, one bf16
    rounding), on the codes and scales it shares with w4_int4_sym_g128. Its bf16 path has no exponent offset
    (humming's get_mainloop_exp_offset is 0 for bf16 scales), so each weight is one rounding of q·s. Where its
    heuristics split a tile's K over several CTAs (stream-K), their partial sums meet in the bf16 output (a bf16
    add): a few more roundings than here, which depend on the GPU's SM count (H200: kernel error up to 0.0035 at
    the configured shapes against about 0.0022 for one rounding, within the family's tolerance)."""
    return emulate_dequant_w4(humming_as_int4_sym(ops, "emulate_humming"), W4_INT4_SYM_G128)


# humming-kernels (optional, GPU hosts): its bf16 path runs from sm_80 (mma.sync; wgmma on sm_90); not a second
# column of the TileLang variants (tinygemm is), a peer row of the family on the same weights as int4_sym
HUMMING = register(
    name="humming_w4_int4_g128", family="dequant", input_format=HUMMING_FORMAT, emulate=emulate_humming,
    launch=launch_humming, prepare=prepare_humming, prepare_compiles=True, precompile=precompile_humming,
    baseline=CUBLAS_BF16.name, min_cc=80, shape_limit=humming_shape_limit,
    description="humming-kernels 0.1.20 (HummingLayer, kernel JIT-compiled with NVRTC, heuristic config per M): a "
    "Marlin-class W4A16 GEMM on the codes and bf16 scales of w4_int4_sym_g128, fp32 accumulation, bf16 out",
)


def _torch_dequant_matmul(fmt: W4Format) -> dict:
    """The fields of format ``fmt``'s torch decode-then-matmul peer."""
    return dict(
        family="dequant", input_format=fmt.name, emulate=partial(emulate_dequant_w4, fmt=fmt),
        launch=partial(launch_torch_dequant_matmul_w4, fmt=fmt), baseline=CUBLAS_BF16.name,
        description=f"torch ops decode the {fmt.name} weight to bf16 (bf16_rn(value·scale)), then torch.matmul",
    )


def _dequant_w4(fmt: W4Format) -> dict:
    """The fields of format ``fmt``'s TileLang variant."""
    return dict(
        family="dequant", input_format=fmt.name, emulate=partial(emulate_dequant_w4, fmt=fmt),
        launch=launch_dequant_w4, prepare=partial(prepare_dequant_w4, fmt=fmt),
        kernel=partial(dequant_w4_kernel, fmt=fmt), out_idx=(4,), pass_configs={"sm_90a": dequant_w4_pass_configs},
        split_k=True, tile_space=dequant_w4_tile_space(fmt),
        # bf16 wgmma accumulates in full fp32 like cuBLAS's bf16 GEMM: the unquantized GEMM is the
        # matched peer; torch's own W4A16 kernel (tinygemm, on its own int4 format) is the second column
        baseline=CUBLAS_BF16.name, second_baseline=TINYGEMM.name,
        instructions={"sm_90a": WGMMA_RS_BF16, "sm_89": MMA_SYNC_BF16, "sm_100a": MMA_SYNC_BF16},
        sass={"sm_90a": HGMMA_BF16, "sm_89": HMMA_BF16, "sm_100a": HMMA_BF16},
        description=f"TileLang W4A16 ({fmt.name}): packed weight decoded in registers straight into the "
        "wgmma_rs A operand (Cᵀ = Ŵ·Aᵀ), bf16_rn(value·scale), fp32 accumulation, bf16 out",
    )


# each format (kernels.dequant_formats, registered there) with its two variants
register(name="torch_dequant_matmul_w4_int4_sym_g128", **_torch_dequant_matmul(W4_INT4_SYM_G128))
register(name="dequant_w4_int4_sym_g128", **_dequant_w4(W4_INT4_SYM_G128))
register(name="torch_dequant_matmul_w4_uint4_zp_g128", **_torch_dequant_matmul(W4_UINT4_ZP_G128))
register(name="dequant_w4_uint4_zp_g128", **_dequant_w4(W4_UINT4_ZP_G128))
register(name="torch_dequant_matmul_w4_e2m1_g32", **_torch_dequant_matmul(W4_E2M1_G32))
register(name="dequant_w4_e2m1_g32", **_dequant_w4(W4_E2M1_G32))
register(name="torch_dequant_matmul_w4_mxfp4", **_torch_dequant_matmul(W4_MXFP4))
register(name="dequant_w4_mxfp4", **_dequant_w4(W4_MXFP4))
