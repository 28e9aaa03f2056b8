"""Block-scaled fp8 GEMM family: C = Σ_b (A_b · B_bᵀ) ⊙ (SFA_b · SFB_b), A (M,K), B (N,K), bf16 out.

Each operand carries one scale per block of K (and, for the DeepSeek B, per 128 rows), so a GEMM
cannot apply the scales once in the epilogue: every K block's partial sum needs its own.

Input formats (all e4m3 values, quantized deterministically from the fp32 inputs; ``kernels.blockscaled_formats``,
which imports no kernel, defines them with their quantizers and the scale layouts the kernels and cuBLAS read):
``deepseek_1x128_128x128`` (A 1x128, B 128x128 fp32 scales), ``mxfp8_e4m3_b32`` (OCP MX v1.0, E8M0 per 32 K),
``generic_g128`` (per-row scales per 128 K for both operands).

Here: the emulations (promotion per K block, as the kernels do) and the registrations. The kernels:
``kernels.blockscaled_g128`` (generic recipe, pipelined, every target), ``kernels.blockscaled_sm100``
(MXFP8 on Blackwell's block-scaled MMA) and the warp-specialized ``blockscaled_sm90`` (DeepSeek recipe,
``kernels.blockscaled_sm90``, sm_90a only); the library peer ``cublas_blockwise_fp8`` (``torch._scaled_mm``
with 1x128 / 128x128 fp32 scales) is in ``kernels.peers``. Every kernel requires K to be a multiple of
128, which its factory raises as Unsupported and the CPU emulation also honours (the variant's
``shape_limit``); the quantizers accept any K.
TileLang evaluates a prim_func's annotations with the factory's closure variables, so this module
must not use ``from __future__ import annotations``.
"""
from functools import partial

import torch

from kernels.blockscaled_formats import DEEPSEEK_1X128_128X128, GENERIC_G128, MX_BLOCK_K, MXFP8_E4M3_B32, PROMOTION_K
from kernels.blockscaled_g128 import blockscaled_g128_kernel, blockscaled_g128_shape_limit, launch_blockscaled_g128
from kernels.blockscaled_sm90 import (
    BLOCKSCALED_SM90_TILES,
    blockscaled_sm90_kernel,
    blockscaled_sm90_shape_limit,
    blockscaled_sm90_tile_problem,
    launch_blockscaled_sm90,
)
from kernels.blockscaled_sm100 import blockscaled_sm100_kernel, blockscaled_sm100_shape_limit, launch_blockscaled_sm100
from kernels.formats import ceil_div, e8m0_decode, expand_blocks, format_operands
from kernels.fp8 import CUBLAS_FP8_E4M3, FP8_AS_F16_HMMA, FP8_QGMMA, FP8_QMMA
from kernels.peers import (
    CUBLAS_NOT_SUPPORTED,
    cublaslt_fp8_shape_limit,
    fbgemm_groupwise_fp8_shape_limit,
    launch_cublas_blockwise_fp8,
    launch_fbgemm_groupwise_fp8,
    prepare_cublas_blockwise_fp8,
    prepare_fbgemm_groupwise_fp8,
)
from kernels.registry import Operands, register
from kernels.warp_specialized import PASS_CONFIGS as WS_PASS_CONFIGS
from kernels.warp_specialized import WGMMA_ONLY

# ---- CPU emulation -------------------------------------------------------------------------------

def emulate_promoted(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, block: int) -> torch.Tensor:
    """Per K block: exact fp8 products summed in fp32, times sa·sb, fused-multiply-added to an fp32
    accumulator; bf16 at the end.

    sa (M, nblk) and sb (N, nblk) are fp32 scales per row of A and of B. The scale product is formed
    in fp32 first, as the kernel does; float64 makes acc + part·s one rounding, like the FFMA.
    """
    M, K = a.shape
    N = b.shape[0]
    acc = torch.zeros(M, N, dtype=torch.float32, device=a.device)
    for blk in range(ceil_div(K, block)):
        ks = slice(blk * block, min((blk + 1) * block, K))
        part = a[:, ks].float() @ b[:, ks].float().T
        s = sa[:, blk : blk + 1].float() * sb[:, blk][None, :].float()
        acc = (acc.double() + part.double() * s.double()).float()
    return acc.to(torch.bfloat16)


def emulate_blockscaled_sm90(ops: Operands) -> torch.Tensor:
    """Promotion every 128 K, B's scale per 128-row block; also cublas_blockwise_fp8's emulation."""
    a, b, sfa, sfb = format_operands(ops, ("A", "B", "SFA", "SFB"), "emulate_blockscaled_sm90")
    N = b.shape[0]
    sb_rows = expand_blocks(sfb, PROMOTION_K, 1, N, sfb.shape[1])  # one B scale per row
    return emulate_promoted(a, b, sfa, sb_rows, PROMOTION_K)


def emulate_blockscaled_g128(ops: Operands, g: int) -> torch.Tensor:
    return emulate_promoted(*format_operands(ops, ("A", "B", "SFA", "SFB"), "emulate_blockscaled_g128"), g)


def emulate_blockscaled_sm100(ops: Operands) -> torch.Tensor:
    """The block-scaled MMA applies E8M0 scales per 32-K block inside fp32 accumulation."""
    a, b, sfa, sfb = format_operands(ops, ("A", "B", "SFA", "SFB"), "emulate_blockscaled_sm100")
    return emulate_promoted(a, b, e8m0_decode(sfa), e8m0_decode(sfb), MX_BLOCK_K)


# ---- registration --------------------------------------------------------------------------------

# instruction and operand dtypes, so that a fallback fails the compile step's check
_SM90_FP8_WGMMA = r"wgmma_ss<tl::DataType::kFloat8_e4m3, tl::DataType::kFloat8_e4m3, tl::DataType::kFloat32"
# off sm_90a blockscaled_g128's kernel lowers T.gemm to fp8 mma.sync (no wgmma there; sm_100a's tcgen05 needs C in
# tensor memory), which is what this pattern records
_FP8_MMA_SYNC = r"mma_sync<tl::DataType::kFloat8_e4m3, tl::DataType::kFloat8_e4m3, tl::DataType::kFloat32"
_G128_KERNEL_INSTRUCTIONS = {"sm_90a": _SM90_FP8_WGMMA, "sm_89": _FP8_MMA_SYNC, "sm_100a": _FP8_MMA_SYNC}
# in the SASS: as for the fp8 family (kernels/fp8.py), fp16 HMMA on sm_100a (no fp8 mma.sync there)
_G128_KERNEL_SASS = {"sm_90a": FP8_QGMMA["e4m3"], "sm_89": FP8_QMMA["e4m3"], "sm_100a": FP8_AS_F16_HMMA}
# the template names A's dtype only (B's is in the instruction descriptor it is passed)
_SM100_BLOCKSCALED_MMA = r"tcgen05mma_blockscaled_ss<tl::DataType::kFloat8_e4m3"
# tcgen05's fp8 MMA; its kind (mxf8f6f4.block_scale) is in the instruction descriptor, not the opcode
_SM100_BLOCKSCALED_SASS = r"UTCQMMA"
_NO_BLOCKSCALED_MMA = (
    "T.gemm_blockscaled lowers only to sm_100 tcgen05 (kind::mxf8f6f4.block_scale, scales in tensor memory) "
    "or sm_120 mma.sync; TileLang 0.1.15 on {arch}: \"Block-scaled GEMM requires either Blackwell SM100 "
    "TCGEN5MMA (A/B in shared memory, C in tensor memory) or SM120 mma.sync ...\"; Hopper does block "
    "scaling in software (blockscaled_sm90)"
)
# what every variant of the family shares, and what its TileLang kernels share (C is argument 4)
_BLOCKSCALED = dict(family="blockscaled", precision="fp8")
_KERNEL = dict(_BLOCKSCALED, out_idx=(4,))

CUBLAS_BLOCKWISE_FP8 = register(
    name="cublas_blockwise_fp8", **_BLOCKSCALED, input_format=DEEPSEEK_1X128_128X128.name,
    emulate=emulate_blockscaled_sm90, launch=launch_cublas_blockwise_fp8, prepare=prepare_cublas_blockwise_fp8,
    run_refusals=(CUBLAS_NOT_SUPPORTED,), min_cc=90, shape_limit=cublaslt_fp8_shape_limit,
    description="torch._scaled_mm (cuBLASLt) e4m3 with 1x128 (A) and 128x128 (B) fp32 block scales, bf16 out",
)
# fbgemm-gpu-genai (optional, GPU hosts): FBGEMM's CUTLASS kernels of the same recipe on the same operands, a second
# library peer row of the family, compared with cuBLAS's blockwise call; not a column of the TileLang variants
FBGEMM_GROUPWISE_FP8 = register(
    name="fbgemm_groupwise_fp8", **_BLOCKSCALED, input_format=DEEPSEEK_1X128_128X128.name,
    emulate=emulate_blockscaled_sm90, launch=launch_fbgemm_groupwise_fp8, prepare=prepare_fbgemm_groupwise_fp8,
    baseline=CUBLAS_BLOCKWISE_FP8.name, min_cc=90, shape_limit=fbgemm_groupwise_fp8_shape_limit,
    description="fbgemm-gpu-genai 1.6.0 torch.ops.fbgemm.f8f8bf16_groupwise: CUTLASS sm90 warp-specialized e4m3 GEMM "
    "(sm_90a only), DeepSeek recipe (1x128 A and 128x128 B fp32 scales, promoted to fp32 every 128 K), its kernel "
    "chosen by a heuristic on M (128x16 ping-pong tiles for M <= 16, else 128x128 cooperative), bf16 out",
)
BLOCKSCALED_SM90 = register(
    name="blockscaled_sm90", **_KERNEL, input_format=DEEPSEEK_1X128_128X128.name, emulate=emulate_blockscaled_sm90,
    launch=launch_blockscaled_sm90, kernel=blockscaled_sm90_kernel,
    instructions={"sm_90a": _SM90_FP8_WGMMA}, sass={"sm_90a": FP8_QGMMA["e4m3"]},
    unsupported={"sm_89": WGMMA_ONLY, "sm_100a": WGMMA_ONLY}, pass_configs={"sm_90a": WS_PASS_CONFIGS},
    shape_limit=blockscaled_sm90_shape_limit, tile_check=blockscaled_sm90_tile_problem,
    tile_space=BLOCKSCALED_SM90_TILES,
    # promoted every 128 K into full fp32, like cuBLAS's blockwise call (which forbids fast
    # accumulation); the tensorwise promoted cuBLAS call is the second column
    baseline=CUBLAS_BLOCKWISE_FP8.name, second_baseline=CUBLAS_FP8_E4M3.name,
    description="TileLang DeepSeek-recipe fp8 GEMM for Hopper, warp-specialized and persistent "
    "(kernels/blockscaled_sm90.py): a TMA producer warpgroup fills a ring with A, B and A's row scales; one or two "
    "consumer warpgroups issue each 128-K block's wgmma into a fresh fp32 partial and promote the previous "
    "block's partial with SFA·SFB into the fp32 accumulator while it runs; bf16 out through a TMA store",
)
BLOCKSCALED_G128 = register(
    name="blockscaled_g128", **_KERNEL, input_format=GENERIC_G128.name,
    emulate=partial(emulate_blockscaled_g128, g=PROMOTION_K), launch=launch_blockscaled_g128,
    kernel=blockscaled_g128_kernel, shape_limit=blockscaled_g128_shape_limit,
    instructions=_G128_KERNEL_INSTRUCTIONS, sass=_G128_KERNEL_SASS,
    baseline=CUBLAS_BLOCKWISE_FP8.name,  # cuBLAS has no per-row B scales: the DeepSeek recipe is the nearest peer
    second_baseline=CUBLAS_FP8_E4M3.name,
    description="TileLang pipelined fp8 GEMM (T.gemm in T.Pipelined), per-row-per-128-K scales for both operands, "
    f"promoted every 128 K like {BLOCKSCALED_SM90.name}, bf16 out",
)
BLOCKSCALED_SM100 = register(
    name="blockscaled_sm100", **_KERNEL, input_format=MXFP8_E4M3_B32.name, emulate=emulate_blockscaled_sm100,
    launch=launch_blockscaled_sm100, kernel=blockscaled_sm100_kernel, shape_limit=blockscaled_sm100_shape_limit,
    instructions={"sm_100a": _SM100_BLOCKSCALED_MMA}, sass={"sm_100a": _SM100_BLOCKSCALED_SASS},
    unsupported={arch: _NO_BLOCKSCALED_MMA.format(arch=arch) for arch in ("sm_89", "sm_90a")},
    # tcgen05 applies the block scales and accumulates in fp32 tensor memory: the nearest library
    # peer is cuBLAS's blockwise-scaled (promoted) call
    baseline=CUBLAS_BLOCKWISE_FP8.name,
    description="TileLang MXFP8 GEMM through T.gemm_blockscaled (tcgen05 block_scale MMA, E8M0 scales per "
    "32 K in tensor memory), unpipelined; runs on sm_100 GPUs only",
)
