"""The TN GEMM mainloop of the pipelined kernels (``fp8_pipelined``, ``int8_tilelang``, ``int4_mma``):
C = A·Bᵀ, A (M,K), B (N,K).

TMA-fed, software-pipelined ``T.gemm`` with ``transpose_B=True`` (the only layout TileLang lowers to
``wgmma`` on sm_90a); each kernel keeps its own signature, buffers and epilogue. Kernels using it
must not use ``from __future__ import annotations`` (TileLang reads annotations via closures).
"""
from kernels.tiles import Tile


def tn_mainloop(tile: Tile, K: int):
    """A TileLang macro accumulating one (block_M, block_N) tile of A·Bᵀ over all of K into C_local."""
    import tilelang.language as T

    bM, bN, bK = tile.block_M, tile.block_N, tile.block_K
    policy = getattr(T.GemmWarpPolicy, tile.policy)

    @T.macro
    def mainloop(A, B, A_shared, B_shared, C_local, bx, by):
        if tile.swizzle:
            T.use_swizzle(tile.swizzle)
        T.clear(C_local)
        for k in T.Pipelined(T.ceildiv(K, bK), num_stages=tile.num_stages):
            T.copy(A[by * bM, k * bK], A_shared)
            T.copy(B[bx * bN, k * bK], B_shared)
            T.gemm(A_shared, B_shared, C_local, transpose_B=True, policy=policy)

    return mainloop

