"""int8_tilelang: the TileLang int8 GEMM, C = A · Bᵀ in int32, A (M,K), B (N,K) int8.

The int4 family's own-kernel peer: the TN mainloop (``kernels.tn_gemm``, s8 ``wgmma`` on Hopper) on the
int4 values already unpacked to int8 (format ``int4_tensor_unpacked_s8``), so it times the GEMM alone;
the int4 kernels' second column beside torch._int_mm.

TileLang evaluates a prim_func's annotations with the factory's closure variables, so this module
must not use ``from __future__ import annotations``.
"""
import torch

from kernels.formats import check_gemm_shape
from kernels.registry import Operands
from kernels.tiles import Tile
from kernels.tn_gemm import tn_mainloop


def int8_tilelang_kernel(M: int, N: int, K: int, tile: Tile):
    """TMA-fed pipelined ``T.gemm``, A (M,K), B (N,K) int8, int32 out."""
    check_gemm_shape("int8_tilelang_kernel", M, N, K)
    import tilelang.language as T

    bM, bN, bK = tile.block_M, tile.block_N, tile.block_K
    mainloop = tn_mainloop(tile, K)

    @T.prim_func
    def main(
        A: T.Tensor((M, K), "int8"),
        B: T.Tensor((N, K), "int8"),
        C: T.Tensor((M, N), "int32"),
    ):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=tile.threads) as (bx, by):
            A_shared = T.alloc_shared((bM, bK), "int8")
            B_shared = T.alloc_shared((bN, bK), "int8")
            C_local = T.alloc_fragment((bM, bN), "int32")
            mainloop(A, B, A_shared, B_shared, C_local, bx, by)
            T.copy(C_local, C[by * bM, bx * bN])

    return main


def launch_int8_tilelang(kernel, ops: Operands) -> torch.Tensor:
    return kernel(ops["A"], ops["B"])
