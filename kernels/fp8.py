"""fp8 GEMM family: C = (A_q · B_qᵀ) · (s_a · s_b), A (M,K), B (N,K), fp32 accumulator, bf16 out.

Hopper's fp8 wgmma adds into its fp32 accumulator with reduced precision (DeepSeek-V3 reports about
14 bits kept); cuBLAS's default call promotes the partial sums to full fp32 every few K blocks,
``use_fast_accum=True`` does not. A kernel that does not promote is matched with the fast-accumulation
call, one that promotes (``_p<n>`` tiles) with the default call.

Here: the emulation every fp8 variant shares and the registrations. Per-tensor scales (amax / fp8 max),
the formats ``fp8_e4m3_tensor`` and ``fp8_e5m2_tensor`` (``quantize_fp8``), are in ``kernels.fp8_formats``,
which imports no kernel. The kernels: ``kernels.fp8_pipelined`` (fp8_e4m3, fp8_e5m2) and the
warp-specialized ``kernels.fp8_ws`` (fp8_e4m3_ws, fp8_e5m2_ws, fp8_e4m3_ws_promoted); the cuBLAS
peers are in ``kernels.peers``. TileLang evaluates a prim_func's annotations with the factory's closure
variables, so this module must not use ``from __future__ import annotations``.
"""
from dataclasses import replace
from functools import partial

import torch

from kernels.formats import format_operands
from kernels.fp8_formats import FP8, FP8_E4M3_TENSOR, FP8_E5M2_TENSOR
from kernels.fp8_pipelined import fp8_pipelined_kernel, launch_fp8_pipelined, prepare_fp8_pipelined
from kernels.fp8_ws import FP8_WS_TILES, fp8_ws_kernel, fp8_ws_shape_limit, fp8_ws_tile_check
from kernels.peers import cublaslt_fp8_shape_limit, launch_cublas_fp8_e4m3
from kernels.registry import Operands, register
from kernels.warp_specialized import PASS_CONFIGS as WS_PASS_CONFIGS
from kernels.warp_specialized import WGMMA_ONLY


def emulate_fp8(ops: Operands) -> torch.Tensor:
    """The kernel's arithmetic on the CPU: exact fp8 products, fp32 accumulation, scaled epilogue, bf16.

    The emulation of every fp8 variant: the pipelined and warp-specialized kernels and both cuBLAS calls
    (promotion and fast accumulation differ only in how the tensor core rounds its adds)."""
    a, b, sa, sb = format_operands(ops, ("A", "B", "scale_a", "scale_b"), "emulate_fp8")
    acc = a.float() @ b.float().T
    return (acc * (sa * sb)).to(torch.bfloat16)


# What each target's build must contain, instruction and operand dtypes both, so that a fallback (to
# mma.sync, or to another dtype) fails the compile step: sm_90a wgmma from shared memory; sm_89 and
# sm_100a fp8 mma.sync (no wgmma there; TileLang lowers T.gemm to tcgen05 only with C in tensor memory).
FP8_TAGS = {"e4m3": "kFloat8_e4m3", "e5m2": "kFloat8_e5m2"}
FP8_WGMMA_SS = {k: rf"wgmma_ss<tl::DataType::{t}, tl::DataType::{t}, tl::DataType::kFloat32" for k, t in FP8_TAGS.items()}
FP8_MMA_SYNC = {k: rf"mma_sync<tl::DataType::{t}, tl::DataType::{t}, tl::DataType::kFloat32" for k, t in FP8_TAGS.items()}
# What ptxas made of them (SASS opcodes, seen on TileLang 0.1.15 cubins): QGMMA on sm_90a, QMMA on sm_89.
# sm_100a has no fp8 mma.sync: ptxas converts the operands and issues fp16 HMMA (correct results, no
# fp8 tensor-core rate), which is what its pattern records and the compile matrix shows.
FP8_SASS_TAGS = {"e4m3": "E4M3", "e5m2": "E5M2"}
FP8_QGMMA = {k: rf"QGMMA\.64x\d+x32\.F32\.{t}\.{t}" for k, t in FP8_SASS_TAGS.items()}
FP8_QMMA = {k: rf"QMMA\.16832\.F32\.{t}\.{t}" for k, t in FP8_SASS_TAGS.items()}
FP8_AS_F16_HMMA = r"HMMA\.16816\.F32"

# the cuBLAS peers (cuBLAS has no e5m2 x e5m2 GEMM: e4m3 is the nearest library peer for both kinds)
_CUBLAS = dict(family="fp8", input_format=FP8_E4M3_TENSOR.name, emulate=emulate_fp8, min_cc=89,
               shape_limit=cublaslt_fp8_shape_limit, precision="fp8")
_CUBLAS_CALL = "torch._scaled_mm (cuBLASLt) e4m3, tensorwise scales, bf16 out, "
CUBLAS_FP8_E4M3 = register(
    name="cublas_fp8_e4m3", **_CUBLAS, launch=partial(launch_cublas_fp8_e4m3, fast_accum=False),
    description=_CUBLAS_CALL + "default accumulation: the partial sums are promoted to full fp32 every few K blocks",
)
CUBLAS_FP8_E4M3_FASTACC = register(
    name="cublas_fp8_e4m3_fastacc", **_CUBLAS, launch=partial(launch_cublas_fp8_e4m3, fast_accum=True),
    description=_CUBLAS_CALL + "use_fast_accum=True: accumulates like wgmma, no promotion",
)


def _tilelang(kind: str) -> dict:
    """What the TileLang variants on ``kind`` ("e4m3", "e5m2") operands share: format, operands, epilogue."""
    fmt = {"e4m3": FP8_E4M3_TENSOR, "e5m2": FP8_E5M2_TENSOR}[kind]
    # the warp-specialized kernels take the pipelined kernel's operands and apply the same scale
    return dict(family="fp8", input_format=fmt.name, emulate=emulate_fp8, launch=launch_fp8_pipelined,
                prepare=prepare_fp8_pipelined, out_idx=(3,), precision="fp8")


def _pipelined(kind: str) -> dict:
    return dict(
        **_tilelang(kind), kernel=partial(fp8_pipelined_kernel, in_dtype=FP8[kind][1]),
        # T.gemm's fp8 wgmma keeps the tensor core's accumulator (no promotion to fp32 every few K
        # blocks), which is cuBLAS's fast accumulation; the promoted call is the second column.
        baseline=CUBLAS_FP8_E4M3_FASTACC.name, second_baseline=CUBLAS_FP8_E4M3.name,
        instructions={"sm_90a": FP8_WGMMA_SS[kind], "sm_89": FP8_MMA_SYNC[kind], "sm_100a": FP8_MMA_SYNC[kind]},
        sass={"sm_90a": FP8_QGMMA[kind], "sm_89": FP8_QMMA[kind], "sm_100a": FP8_AS_F16_HMMA},
        description=f"TileLang {kind}×{kind} GEMM, accumulated in wgmma's fp8 accumulator (fp32 registers, "
        "reduced-precision adds) without promotion, like cuBLAS fast accumulation; per-tensor scales in the "
        "epilogue, bf16 out",
    )


def _ws(name: str, kind: str, promoted: bool) -> dict:
    peers = (CUBLAS_FP8_E4M3.name, CUBLAS_FP8_E4M3_FASTACC.name)
    accumulation = ("promoted to a second fp32 accumulator every n K blocks (n = the tile's _p<n>), like cuBLAS's "
                    "default call" if promoted else "without promotion, like cuBLAS fast accumulation")
    return dict(
        **_tilelang(kind), kernel=partial(fp8_ws_kernel, in_dtype=FP8[kind][1]),
        baseline=peers[0] if promoted else peers[1], second_baseline=peers[1] if promoted else peers[0],
        instructions={"sm_90a": FP8_WGMMA_SS[kind]}, sass={"sm_90a": FP8_QGMMA[kind]},
        unsupported={"sm_89": WGMMA_ONLY, "sm_100a": WGMMA_ONLY}, pass_configs={"sm_90a": WS_PASS_CONFIGS},
        shape_limit=fp8_ws_shape_limit, tile_check=partial(fp8_ws_tile_check, name=name, promoted=promoted),
        # the promoted kernel's tiles promote every 2 K blocks (256 products at block_K 128, cuBLAS: 128)
        tile_space=replace(FP8_WS_TILES, promote=2) if promoted else FP8_WS_TILES,
        description=f"TileLang {kind}×{kind} GEMM, warp-specialized and persistent (kernels/fp8_ws.py): a TMA "
        "producer warpgroup feeds one or two wgmma consumer warpgroups that keep one batch in flight; grouped "
        f"raster, TMA-store epilogue (a _swapab tile computes Cᵀ for small M); accumulated {accumulation}; "
        "per-tensor scales in the epilogue, bf16 out",
    )


FP8_E4M3 = register(name="fp8_e4m3", **_pipelined("e4m3"))
FP8_E5M2 = register(name="fp8_e5m2", **_pipelined("e5m2"))
# each name written once (the tile check's messages name the variant too)
FP8_E4M3_WS = register(name=(_name := "fp8_e4m3_ws"), **_ws(_name, "e4m3", promoted=False))
FP8_E5M2_WS = register(name=(_name := "fp8_e5m2_ws"), **_ws(_name, "e5m2", promoted=False))
FP8_E4M3_WS_PROMOTED = register(name=(_name := "fp8_e4m3_ws_promoted"), **_ws(_name, "e4m3", promoted=True))
