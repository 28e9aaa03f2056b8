"""Block-scaled fp8 GEMM family: C = Σ_b (A_b · B_bᵀ) ⊙ (SFA_b · SFB_b), A (M,K), B (N,K), bf16 out.

Each operand carries one scale per block of K (and, for the DeepSeek B, per 128 rows), so a GEMM
cannot apply the scales once in the epilogue: every K block's partial sum needs its own.

Input formats (all e4m3 values, quantized deterministically from the fp32 inputs; ``kernels.blockscaled_formats``,
which imports no kernel, defines them with their quantizers and the scale layouts the kernels and cuBLAS read):
``deepseek_1x128_128x128`` (A 1x128, B 128x128 fp32 scales), ``mxfp8_e4m3_b32`` (OCP MX v1.0, E8M0 per 32 K),
``generic_g128`` (the seed's per-row scales per 128 K for both operands).

Variants:
- ``blockscaled_sm90`` (DeepSeek recipe) and ``blockscaled_g128`` (generic recipe): Hopper has no
  block-scaled MMA, so per 128-wide K block ``wgmma`` accumulates into a fresh fp32 partial sum that
  is multiplied by SFA·SFB and added to a second fp32 accumulator ("promotion", as in DeepGEMM).
  ``blockscaled_sm90``'s kernel is warp-specialized by hand (``kernels.blockscaled_ws``, sm_90a only);
  ``blockscaled_g128``'s is ``T.gemm`` in ``T.Pipelined`` (the seed's form, every target).
- ``blockscaled_sm100`` (MXFP8): the seed's ``T.gemm_blockscaled``; TileLang 0.1.15 lowers it only
  for sm_100 (``tcgen05.mma ... kind::mxf8f6f4.block_scale``, scales in tensor memory) and sm_120.
- ``cublas_blockwise_fp8``: ``torch._scaled_mm`` with 1x128 / 128x128 fp32 scales (DeepSeek recipe).

Every kernel requires K to be a multiple of 128 (one promotion, or one packed word of four E8M0
codes, per 128 K): ``kernel_shape_limit``, each TileLang variant's ``shape_limit``, which its factory
raises as ``Unsupported`` and the CPU emulation also honours; the quantizers accept any K. The number
formats' building blocks (the amax and OCP MX quantizers, E8M0 codes, block views) come from
``kernels.formats``.
TileLang evaluates a prim_func's annotations with the factory's closure variables, so this module
must not use ``from __future__ import annotations``.
"""
from functools import partial

import torch

from kernels.blockscaled_formats import (  # noqa: F401  (registers the formats; the quantizers kept importable here)
    DEEPSEEK_1X128_128X128,
    GENERIC_G128,
    MX_BLOCK_K,
    MXFP8_E4M3_B32,
    PROMOTION_K,
    UTCCP_ROWS,
    dequantize_deepseek,
    dequantize_generic,
    dequantize_mx,
    quantize_deepseek,
    quantize_e4m3_blocks,
    quantize_generic,
    quantize_mx,
    quantize_mxfp8,
    utccp_scale_layout,
)
from kernels.blockscaled_ws import blockscaled_ws_kernel, blockscaled_ws_tile_problem
from kernels.formats import ceil_div, check_gemm_shape, e8m0_decode, expand_blocks, format_operands, round_up
from kernels.fp8 import CUBLAS_FP8_E4M3, FP8_AS_F16_HMMA, FP8_QGMMA, FP8_QMMA, WGMMA_ONLY, cublaslt_fp8_shape_limit
from kernels.registry import Format, Operands, Unsupported, Variant, register_variant
from kernels.tiles import Tile
from kernels.ws_gemm import PASS_CONFIGS as WS_PASS_CONFIGS

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


# ---- TileLang kernels ----------------------------------------------------------------------------

def kernel_shape_limit(M: int, N: int, K: int) -> str | None:
    """Why no block-scaled TileLang kernel can run (M, N, K), or None: the ``shape_limit`` of every
    block-scaled TileLang variant, and the rule their factories raise (``_require_shape``)."""
    if K % PROMOTION_K:
        return (
            f"the block-scaled kernels need K divisible by {PROMOTION_K}: K={K} must be a multiple of "
            f"{PROMOTION_K} (one fp32 promotion / one packed scale word per {PROMOTION_K} K)"
        )
    return None


def _require_shape(M: int, N: int, K: int, who: str, limit=kernel_shape_limit) -> None:
    # the variants' declared shape_limit, raised by the factory itself: a known refusal, never drifting
    if reason := limit(M, N, K):
        raise Unsupported(f"{who}: {reason}")


def sm90_shape_limit(M: int, N: int, K: int) -> str | None:
    """``blockscaled_sm90``'s rule: K % 128, and N % 8 for the TMA store of its bf16 rows (16-byte pitch)."""
    if reason := kernel_shape_limit(M, N, K):
        return reason
    if N % 8:
        return f"the TMA store of the bf16 output needs N divisible by 8 (a 16-byte row pitch), got N={N}"
    return None


def blockscaled_sm90_kernel(M: int, N: int, K: int, tile: Tile):
    """The DeepSeek-recipe kernel for Hopper: warp-specialized and persistent, one consumer warpgroup's
    promotion overlapped with the other's wgmma (``kernels.blockscaled_ws``)."""
    check_gemm_shape("blockscaled_sm90_kernel", M, N, K)
    _require_shape(M, N, K, BLOCKSCALED_SM90.name, sm90_shape_limit)  # registered below
    return blockscaled_ws_kernel(M, N, K, tile)


def _check_g128_tile(tile: Tile) -> None:
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
    """Hopper block-scaled fp8 GEMM with per-row scales for both operands and fp32 promotion every 128 K
    (the seed's form; ``blockscaled_sm90``'s kernel before it was warp-specialized by hand).

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

    _require_shape(M, N, K, BLOCKSCALED_G128.name)  # registered below
    _check_g128_tile(tile)
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


def _check_sm100_tile(tile: Tile) -> None:
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
    """Blackwell MXFP8 GEMM through the seed's ``T.gemm_blockscaled`` (sm_100a only).

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

    _require_shape(M, N, K, BLOCKSCALED_SM100.name)  # registered below
    _check_sm100_tile(tile)
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


# ---- launches (GPU) ------------------------------------------------------------------------------

def launch_blockscaled_sm90(kernel, ops: Operands) -> torch.Tensor:
    return kernel(ops["A"], ops["B"], ops["SFA_t"], ops["SFB"])


def launch_blockscaled_g128(kernel, ops: Operands) -> torch.Tensor:
    return kernel(ops["A"], ops["B"], ops["SFA_t"], ops["SFB_t"])


def launch_blockscaled_sm100(kernel, ops: Operands) -> torch.Tensor:
    return kernel(ops["A"], ops["B"], ops["SFA_words"], ops["SFB_words"])


_SCALE_B_ROW_PITCH: dict[str, int] = {"multiple": 1}  # set to 4 once a torch build asks for a padded pitch


def cublas_blockwise_scales(ops: Operands, pitch_multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale views in the layouts torch._scaled_mm accepts for the DeepSeek recipe.

    From ScaledBlas.cpp (is_blockwise_1x128_scaling / is_blockwise_128x128_scaling): scale_a
    (BlockWise1x128) shape (M, ⌈K/128⌉), strides (1, M) ("outer-dim major") -- a view of ``SFA_t``
    when M % 4 == 0, else a fresh copy (an extra small kernel per call); scale_b (BlockWise128x128,
    checked as scale_bᵀ against B (N, K)): scale_bᵀ shape (⌈N/128⌉, ⌈K/128⌉), strides (pitch, 1),
    where pitch is ⌈K/128⌉ in most versions of that file and ⌈K/128⌉ rounded up to 4 in one
    (``pitch_multiple=4``); both agree when K % 512 == 0.
    """
    M = ops["A"].shape[0]
    sfa_t = ops["SFA_t"]
    scale_a = sfa_t[:, :M].T
    if scale_a.stride() != (1, M):
        scale_a = ops["SFA"].T.contiguous().T
    sfb = ops["SFB"]
    nb, kb = sfb.shape
    pitch = round_up(kb, pitch_multiple)
    if pitch != kb:
        padded = torch.zeros(nb, pitch, dtype=sfb.dtype, device=sfb.device)
        padded[:, :kb] = sfb
        sfb = padded[:, :kb]
    return scale_a, sfb.T


def prepare_cublas_blockwise_fp8(ops: Operands) -> Operands:
    # the scale views (or, for M % 4 != 0, the one copy) cuBLAS wants, made once with the operands so
    # that no layout change runs inside the timed window
    scale_a, scale_b = cublas_blockwise_scales(ops, _SCALE_B_ROW_PITCH["multiple"])
    return {"scale_a_blockwise": scale_a, "scale_b_blockwise": scale_b}


def launch_cublas_blockwise_fp8(kernel, ops: Operands) -> torch.Tensor:
    def call() -> torch.Tensor:
        # B (N,K) row-major transposed is the column-major (K,N) operand cuBLASLt wants; blockwise
        # scaling forbids fast accumulation
        return torch._scaled_mm(ops["A"], ops["B"].T, scale_a=ops["scale_a_blockwise"],
                                scale_b=ops["scale_b_blockwise"], out_dtype=torch.bfloat16, use_fast_accum=False)

    try:
        return call()
    except RuntimeError:
        kb = ops["SFB"].shape[1]
        if _SCALE_B_ROW_PITCH["multiple"] != 1 or kb % 4 == 0:
            raise
        # this torch build wants scale_b's row pitch padded to a multiple of 4: re-prepare once (the
        # operands dict keeps the padded copy, so later, timed calls pay nothing)
        _SCALE_B_ROW_PITCH["multiple"] = 4
        ops.update(prepare_cublas_blockwise_fp8(ops))
        return call()


# CUBLAS_STATUS_NOT_SUPPORTED: cuBLASLt has no blockwise kernel for some small-M / short-K shapes
# (seen on the H200 at 1x7168x2048 and 333x8192x1024); it is cuBLAS's refusal, not a failure
CUBLAS_NOT_SUPPORTED = (r"CUBLAS_STATUS_NOT_SUPPORTED", "cuBLASLt has no blockwise-scaled kernel for this shape")


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


def _register(name: str, fmt: Format, emulate, launch, **fields) -> Variant:
    return register_variant(Variant(name=name, family="blockscaled", input_format=fmt.name, emulate=emulate, launch=launch,
                                    precision="fp8", **fields))


def _register_kernel(name: str, fmt: Format, emulate, launch, kernel, shape_limit=kernel_shape_limit, **fields) -> Variant:
    return _register(name, fmt, emulate, launch, kernel=kernel, out_idx=(4,), shape_limit=shape_limit, **fields)


CUBLAS_BLOCKWISE_FP8 = _register(
    "cublas_blockwise_fp8", DEEPSEEK_1X128_128X128, emulate_blockscaled_sm90, launch_cublas_blockwise_fp8,
    prepare=prepare_cublas_blockwise_fp8, run_refusals=(CUBLAS_NOT_SUPPORTED,), min_cc=90,
    shape_limit=cublaslt_fp8_shape_limit,
    description="torch._scaled_mm (cuBLASLt) e4m3 with 1x128 (A) and 128x128 (B) fp32 block scales, bf16 out",
)
BLOCKSCALED_SM90 = _register_kernel(
    "blockscaled_sm90", DEEPSEEK_1X128_128X128, emulate_blockscaled_sm90, launch_blockscaled_sm90,
    blockscaled_sm90_kernel, instructions={"sm_90a": _SM90_FP8_WGMMA}, sass={"sm_90a": FP8_QGMMA["e4m3"]},
    unsupported={"sm_89": WGMMA_ONLY, "sm_100a": WGMMA_ONLY}, pass_configs={"sm_90a": WS_PASS_CONFIGS},
    shape_limit=sm90_shape_limit, tile_check=blockscaled_ws_tile_problem,
    # promoted every 128 K into full fp32, like cuBLAS's blockwise call (which forbids fast
    # accumulation); the tensorwise promoted cuBLAS call is the second column
    baseline=CUBLAS_BLOCKWISE_FP8.name, second_baseline=CUBLAS_FP8_E4M3.name,
    description="TileLang DeepSeek-recipe fp8 GEMM for Hopper, warp-specialized and persistent "
    "(kernels/blockscaled_ws.py): a TMA producer warpgroup fills a ring with A, B and A's row scales; one or two "
    "consumer warpgroups issue each 128-K block's wgmma into a fresh fp32 partial and promote the previous "
    "block's partial with SFA·SFB into the fp32 accumulator while it runs; bf16 out through a TMA store",
)
BLOCKSCALED_G128 = _register_kernel(
    "blockscaled_g128", GENERIC_G128, partial(emulate_blockscaled_g128, g=PROMOTION_K), launch_blockscaled_g128,
    blockscaled_g128_kernel, instructions=_G128_KERNEL_INSTRUCTIONS, sass=_G128_KERNEL_SASS,
    baseline=CUBLAS_BLOCKWISE_FP8.name,  # cuBLAS has no per-row B scales: the DeepSeek recipe is the nearest peer
    second_baseline=CUBLAS_FP8_E4M3.name,
    description="TileLang seed-form fp8 GEMM, per-row-per-128-K scales for both operands, promoted every "
    f"128 K like {BLOCKSCALED_SM90.name}, bf16 out",
)
BLOCKSCALED_SM100 = _register_kernel(
    "blockscaled_sm100", MXFP8_E4M3_B32, emulate_blockscaled_sm100, launch_blockscaled_sm100, blockscaled_sm100_kernel,
    instructions={"sm_100a": _SM100_BLOCKSCALED_MMA}, sass={"sm_100a": _SM100_BLOCKSCALED_SASS},
    unsupported={arch: _NO_BLOCKSCALED_MMA.format(arch=arch) for arch in ("sm_89", "sm_90a")},
    # tcgen05 applies the block scales and accumulates in fp32 tensor memory: the nearest library
    # peer is cuBLAS's blockwise-scaled (promoted) call
    baseline=CUBLAS_BLOCKWISE_FP8.name,
    description="TileLang MXFP8 GEMM through T.gemm_blockscaled (tcgen05 block_scale MMA, E8M0 scales per "
    "32 K in tensor memory), unpipelined; runs on sm_100 GPUs only",
)
