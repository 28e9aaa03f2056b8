"""blockscaled_sm100: the Blackwell MXFP8 GEMM, C = Σ_b (A_b · B_bᵀ) ⊙ (SFA_b · SFB_b), A (M,K), B (N,K)
e4m3 with one E8M0 scale per row per 32 K (format ``mxfp8_e4m3_b32``, OCP MX v1.0), bf16 out.

Built on TileLang's ``T.gemm_blockscaled``, which TileLang 0.1.15 lowers only for sm_100
(``tcgen05.mma ... kind::mxf8f6f4.block_scale``, scales in tensor memory) and sm_120: the tensor core
applies the block scales and accumulates in fp32 tensor memory. The scale codes travel four to a
32-bit word (one word per row per 128 K), so K must be a multiple of 128
(``blockscaled_sm100_shape_limit``, which the factory raises as Unsupported).

TileLang evaluates a prim_func's annotations with the factory's closure variables, so this module
must not use ``from __future__ import annotations``.
"""
import torch

from kernels.blockscaled_formats import MX_BLOCK_K, PROMOTION_K, UTCCP_ROWS
from kernels.formats import check_gemm_shape, round_up
from kernels.registry import Operands, refuse_shape
from kernels.tiles import Tile


def blockscaled_sm100_shape_limit(M: int, N: int, K: int) -> str | None:
    """One packed word of four E8M0 codes per row per ``PROMOTION_K`` of K: K must be whole words (the
    quantizers accept any K; the emulation honours this rule too)."""
    if K % PROMOTION_K:
        return (f"the MXFP8 kernel needs K divisible by {PROMOTION_K}: K={K} must be a multiple of "
                f"{PROMOTION_K} (one packed word of four scale codes per {PROMOTION_K} K)")
    return None


def check_blockscaled_sm100_tile(tile: Tile) -> None:
    """Raise ValueError when the tile does not fit the kernel."""
    problems = []
    if tile.block_M != 128:
        problems.append(f"block_M must be 128 (tensor memory has 128 lanes), got {tile.block_M}")
    if tile.block_N not in (128, 256):
        problems.append(f"block_N must be 128 or 256 (whole 128-row scale chunks), got {tile.block_N}")
    if tile.block_K != PROMOTION_K:
        problems.append(f"block_K must be {PROMOTION_K} (one packed scale word per row), got {tile.block_K}")
    if tile.threads != 128:
        problems.append(f"threads must be 128 (one warpgroup reads the 128 TMEM lanes), got {tile.threads}")
    if tile.num_stages != 1:
        problems.append(f"num_stages must be 1: this kernel is not pipelined, got {tile.num_stages}")
    if problems:
        raise ValueError("blockscaled_sm100: " + "; ".join(problems))


def blockscaled_sm100_kernel(M: int, N: int, K: int, tile: Tile):
    """Blackwell MXFP8 GEMM through ``T.gemm_blockscaled`` (sm_100a only).

    What TileLang 0.1.15 accepts on sm_100a: A and B e4m3 in shared memory, C in tensor memory,
    SFA/SFB E8M0 codes already in tensor memory, four codes per 32-bit word (byte j = K block 4w+j),
    ``sf_*_granularity_k=32`` (scale_vec 1X: one code per 32 K per row), ``k_start`` the tile's
    K offset (it selects the byte), and an ``mbar`` the MMA completes on (waited implicitly). Scale
    words reach tensor memory with ``tcgen05.cp 32x128b.warpx4`` in 128-row chunks; the host stores
    them already in that chunk order (``utccp_scale_layout``), one word per row per K block.

    The loop is deliberately serial (``num_stages`` 1): TileLang's automatic pipelining does not see
    that the asynchronous ``tcgen05.cp`` still reads a stage's shared scale buffer and would overwrite
    it early. Here each step's MMA, which the same thread issues after the copies, has completed
    (mbarrier wait) before the next step refills shared memory and tensor memory. A fast version
    needs explicit warp roles (a TMA warp, an MMA warp) and per-stage mbarriers.
    """
    check_gemm_shape("blockscaled_sm100_kernel", M, N, K)
    import tilelang.language as T

    refuse_shape(blockscaled_sm100_shape_limit, M, N, K, "blockscaled_sm100_kernel")
    check_blockscaled_sm100_tile(tile)
    bM, bN, bK = tile.block_M, tile.block_N, tile.block_K
    kw = K // PROMOTION_K
    M128, N128 = round_up(M, UTCCP_ROWS), round_up(N, UTCCP_ROWS)
    fp8 = "float8_e4m3fn"

    @T.prim_func
    def main(
        A: T.Tensor((M, K), fp8),
        B: T.Tensor((N, K), fp8),
        SFA_words: T.Tensor((kw, M128), "int32"),
        SFB_words: T.Tensor((kw, N128), "int32"),
        C: T.Tensor((M, N), "bfloat16"),
    ):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=tile.threads) as (bx, by):
            A_s = T.alloc_shared((bM, bK), fp8)
            B_s = T.alloc_shared((bN, bK), fp8)
            SFA_s = T.alloc_shared((bM,), "int32")
            SFB_s = T.alloc_shared((bN,), "int32")
            C_tmem = T.alloc_tmem([bM, bN], "float32")
            SFA_tmem = T.alloc_tmem([bM, bM // UTCCP_ROWS * 4], "uint32")  # 4 columns per 128 rows
            SFB_tmem = T.alloc_tmem([bM, bN // UTCCP_ROWS * 4], "uint32")
            mma_done = T.alloc_barrier(1)
            C_local = T.alloc_fragment((bM, bN), "float32")
            C_s = T.alloc_shared((bM, bN), "bfloat16")
            tx = T.get_thread_binding()
            for k in T.serial(kw):
                T.copy(A[by * bM, k * bK], A_s)
                T.copy(B[bx * bN, k * bK], B_s)
                T.copy(SFA_words[k, by * bM], SFA_s)
                T.copy(SFB_words[k, bx * bN], SFB_s)
                # generic-proxy stores -> async-proxy readers (tcgen05.cp, the MMA's smem descriptors)
                T.fence_proxy_async()
                T.sync_threads()
                if tx < 32:  # warp 0 issues the copies and (below) the MMA, so both are ordered
                    T.tcgen05_cp_warpx4(SFA_s, SFA_tmem)
                    T.tcgen05_cp_warpx4(SFB_s, SFB_tmem)
                T.gemm_blockscaled(
                    A_s,
                    B_s,
                    C_tmem,
                    SFA_tmem,
                    SFB_tmem,
                    transpose_B=True,
                    clear_accum=k == 0,
                    k_start=k * bK,
                    sf_a_granularity_k=MX_BLOCK_K,
                    sf_b_granularity_k=MX_BLOCK_K,
                    mbar=mma_done,
                )
            T.copy(C_tmem, C_local)
            T.copy(C_local, C_s)
            T.copy(C_s, C[by * bM, bx * bN])

    return main


def launch_blockscaled_sm100(kernel, ops: Operands) -> torch.Tensor:
    return kernel(ops["A"], ops["B"], ops["SFA_words"], ops["SFB_words"])
