"""int4_mma: the int4 GEMM on TileLang's own int4 type, C = A_int · B_intᵀ in int32, A (M,K), B (N,K).

``T.int4`` operands and the TN mainloop's ``T.gemm`` (``kernels.tn_gemm``); TileLang lowers it to the s4
``mma.sync``. On Hopper and Blackwell that instruction exists but is emulated (no int4 tensor cores:
ptxas issues s8 IMMA), and on Hopper it only builds with warp specialization off (``PASS_CONFIGS``):
the TMA lowering has no 4-bit type. The operands are the packed bytes of ``formats.pack_int4``.

TileLang evaluates a prim_func's annotations with the factory's closure variables, so this module
must not use ``from __future__ import annotations``.
"""
import torch

from kernels.formats import check_gemm_shape
from kernels.registry import Operands
from kernels.tiles import Tile
from kernels.tn_gemm import tn_mainloop

# The TMA lowering has no 4-bit type ("Check failed: (0) is false: int4"); without warp
# specialization the T.int4 copies use cp.async and the kernel builds (sm_90a, sm_100a).
PASS_CONFIGS = {"tl.disable_warp_specialized": True}


def int4_mma_kernel(M: int, N: int, K: int, tile: Tile):
    """``T.int4`` A (M,K), B (N,K), int32 accumulator, transpose_B=True.

    TileLang binds a ``T.int4`` (rows, K) tensor to an int8 torch tensor of shape (rows, K/2)
    holding two nibbles per byte (its host checks shape[1]·2 == K), i.e. ``pack_int4``'s output.
    """
    check_gemm_shape("int4_mma_kernel", M, N, K)
    import tilelang.language as T

    if K % 2:
        raise ValueError(f"int4_mma: K={K} must be even (two int4 values per byte)")
    if tile.block_K % 64:
        raise ValueError(f"int4_mma: block_K={tile.block_K} must be a multiple of 64 (s4 mma is m16n8k64)")
    bM, bN, bK = tile.block_M, tile.block_N, tile.block_K
    mainloop = tn_mainloop(tile, K)

    @T.prim_func
    def main(
        A: T.Tensor((M, K), T.int4),
        B: T.Tensor((N, K), T.int4),
        C: T.Tensor((M, N), T.int32),
    ):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=tile.threads) as (bx, by):
            A_shared = T.alloc_shared((bM, bK), T.int4)
            B_shared = T.alloc_shared((bN, bK), T.int4)
            C_local = T.alloc_fragment((bM, bN), T.int32)
            mainloop(A, B, A_shared, B_shared, C_local, bx, by)
            T.copy(C_local, C[by * bM, bx * bN])

    return main


def launch_int4_mma(kernel, ops: Operands) -> torch.Tensor:
    return kernel(ops["A_packed"], ops["B_packed"])
