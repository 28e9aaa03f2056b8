"""blockscaled_g128: the pipelined block-scaled fp8 GEMM for Hopper, C = Σ_b (A_b · B_bᵀ) ⊙ (SFA_b · SFB_b),
A (M,K), B (N,K) e4m3 with one fp32 scale per row per 128 K for both operands (format ``generic_g128``),
bf16 out.

Hopper has no block-scaled MMA, and every K block's partial sum needs its own scales, so per 128-wide
K block ``wgmma`` accumulates into a fresh fp32 partial sum that is multiplied by SFA·SFB and added to
a second fp32 accumulator ("promotion", as in DeepGEMM). Here that is ``T.gemm`` in ``T.Pipelined``,
which builds for every target (fp8 ``mma.sync`` off sm_90a); ``blockscaled_sm90`` is the same recipe
warp-specialized by hand. K must be whole promotion blocks (``blockscaled_g128_shape_limit``, which the
factory raises as Unsupported).

TileLang evaluates a prim_func's annotations with the factory's closure variables, so this module
must not use ``from __future__ import annotations``.
"""
import torch

from kernels.blockscaled_formats import PROMOTION_K
from kernels.formats import check_gemm_shape, round_up
from kernels.registry import Operands, refuse_shape
from kernels.tiles import Tile


def blockscaled_g128_shape_limit(M: int, N: int, K: int) -> str | None:
    """One fp32 promotion per ``PROMOTION_K`` of K: K must be whole promotion blocks (the quantizers accept
    any K; the emulation honours this rule too). Also the rule of blockscaled_sm90's promotion."""
    if K % PROMOTION_K:
        return (f"the promoted kernels need K divisible by {PROMOTION_K}: K={K} must be a multiple of "
                f"{PROMOTION_K} (one fp32 promotion per {PROMOTION_K} K)")
    return None


def check_blockscaled_g128_tile(tile: Tile) -> None:
    """Raise ValueError when the tile does not fit the kernel."""
    if tile.block_K != PROMOTION_K:
        raise ValueError(
            f"blockscaled_g128: block_K must be {PROMOTION_K} (the promotion interval), got {tile.block_K}"
        )
    if tile.block_M % 64:
        raise ValueError(f"blockscaled_g128: block_M must be a multiple of 64 (wgmma M), got {tile.block_M}")
    if tile.block_N not in (64, 128, 256):
        raise ValueError(
            f"blockscaled_g128: block_N must be 64, 128 or 256 (a partial sum of at most 128 columns), "
            f"got {tile.block_N}"
        )


def blockscaled_g128_kernel(M: int, N: int, K: int, tile: Tile):
    """Hopper block-scaled fp8 GEMM with per-row scales for both operands and fp32 promotion every 128 K.

    Per K block: TMA brings A, B and the tile's A and B row scales (from the M- and N-major ``SFA_t``,
    ``SFB_t``) into a ``num_stages`` pipeline; ``T.gemm`` (wgmma, clear_accum: a fresh partial sum)
    computes the block's product and ``C_acc += C_part * SFA * SFB`` promotes it. TileLang
    warp-specializes the loop (a TMA producer warpgroup, ``threads`` consumer threads).

    With block_N 256 the tile is computed as two 128-wide halves that reuse one partial-sum fragment
    (each half keeps its own accumulator): a 128x256 fp32 partial plus a 128x256 accumulator would
    not fit in two consumer warpgroups' registers and would spill.
    Use the FullRow policy (``_wrow``): each consumer warpgroup then issues m64n128 wgmma; Square splits
    a 128x128 tile along N into m64n64 ones.
    """
    check_gemm_shape("blockscaled_g128_kernel", M, N, K)
    import tilelang.language as T

    refuse_shape(blockscaled_g128_shape_limit, M, N, K, "blockscaled_g128_kernel")
    check_blockscaled_g128_tile(tile)
    bM, bN, bK = tile.block_M, tile.block_N, tile.block_K
    sub_N = min(bN, 128)  # wgmma N of one partial sum
    n_sub = bN // sub_N
    parts = list(range(n_sub))  # a Python list: TileLang unrolls a for over it at trace time (range -> T.serial)
    kb = K // PROMOTION_K
    M4, N4 = round_up(M, 4), round_up(N, 4)
    policy = getattr(T.GemmWarpPolicy, tile.policy)
    fp8, f32 = "float8_e4m3fn", "float32"

    @T.prim_func
    def main(
        A: T.Tensor((M, K), fp8),
        B: T.Tensor((N, K), fp8),
        SFA_t: T.Tensor((kb, M4), f32),  # A scales, M-major
        SFB: T.Tensor((kb, N4), f32),  # SFB_t: B scales, N-major
        C: T.Tensor((M, N), "bfloat16"),
    ):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=tile.threads) as (bx, by):
            A_s = T.alloc_shared((bM, bK), fp8)
            B_s = [T.alloc_shared((sub_N, bK), fp8) for _ in range(n_sub)]
            SFA_s = T.alloc_shared((bM,), f32)
            SFB_s = T.alloc_shared((bN,), f32)
            C_part = T.alloc_fragment((bM, sub_N), f32)
            C_acc = [T.alloc_fragment((bM, sub_N), f32) for _ in range(n_sub)]
            C_s = T.alloc_shared((bM, bN), "bfloat16")
            if tile.swizzle:
                T.use_swizzle(tile.swizzle)
            for h in parts:
                T.clear(C_acc[h])
            for k in T.Pipelined(kb, num_stages=tile.num_stages):
                T.copy(A[by * bM, k * bK], A_s)
                for h in parts:
                    T.copy(B[bx * bN + h * sub_N, k * bK], B_s[h])
                T.copy(SFA_t[k, by * bM], SFA_s)
                T.copy(SFB[k, bx * bN], SFB_s)
                for h in parts:
                    T.gemm(A_s, B_s[h], C_part, transpose_B=True, clear_accum=True, policy=policy)
                    for i, j in T.Parallel(bM, sub_N):
                        C_acc[h][i, j] += C_part[i, j] * (SFA_s[i] * SFB_s[h * sub_N + j])
            for h in parts:
                T.copy(C_acc[h], C_s[:, h * sub_N : (h + 1) * sub_N])
            T.copy(C_s, C[by * bM, bx * bN])

    return main


def launch_blockscaled_g128(kernel, ops: Operands) -> torch.Tensor:
    return kernel(ops["A"], ops["B"], ops["SFA_t"], ops["SFB_t"])
