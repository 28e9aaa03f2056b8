"""fp8 GEMM family: C = (A_q · B_qᵀ) · (s_a · s_b), A (M,K), B (N,K), fp32 accumulator, bf16 out.

Hopper's fp8 wgmma adds into its fp32 accumulator with reduced precision (DeepSeek-V3 reports about
14 bits kept); cuBLAS's default call promotes the partial sums to full fp32 every few K blocks,
``use_fast_accum=True`` does not. The TileLang kernel here does not promote, so its matched peer is
the fast-accumulation call.

Per-tensor scales (amax / fp8 max) are applied in the epilogue. The formats (``fp8_e4m3_tensor``,
``fp8_e5m2_tensor``: ``quantize_fp8``) are in ``kernels.fp8_formats``, which imports no kernel. On sm_90a the kernel must lower to
``wgmma``: TileLang does so only for A (M,K), B (N,K) with ``transpose_B=True`` and otherwise
falls back to ``mma.sync`` silently, which the compile step's instruction check turns into a failure.
TileLang evaluates a prim_func's annotations with the factory's closure variables, so this module must
not use ``from __future__ import annotations`` (string annotations would lose e.g. ``out_dtype``).
"""
from functools import partial

import torch

from kernels.formats import check_gemm_shape, format_operands
from kernels.fp8_formats import FP8, FP8_E4M3_TENSOR, FP8_E5M2_TENSOR, quantize_fp8  # noqa: F401  (registers the formats)
from kernels.registry import Format, Operands, Unsupported, Variant, register_variant
from kernels.tiles import Tile
from kernels.tn_gemm import tn_mainloop
from kernels.ws_gemm import PASS_CONFIGS as WS_PASS_CONFIGS
from kernels.ws_gemm import ws_gemm_kernel, ws_tile_problem


def emulate_fp8(ops: Operands) -> torch.Tensor:
    """The kernel's arithmetic on the CPU: exact fp8 products, fp32 accumulation, scaled epilogue, bf16.

    The emulation of every fp8 variant: the seed-form and warp-specialized kernels and both cuBLAS calls
    (promotion and fast accumulation differ only in how the tensor core rounds its adds)."""
    a, b, sa, sb = format_operands(ops, ("A", "B", "scale_a", "scale_b"), "emulate_fp8")
    acc = a.float() @ b.float().T
    return (acc * (sa * sb)).to(torch.bfloat16)


def fp8_kernel(M: int, N: int, K: int, tile: Tile, in_dtype: str, out_dtype: str = "bfloat16"):
    """TileLang fp8 GEMM: TMA-fed pipelined ``T.gemm`` with A (M,K), B (N,K), transpose_B=True.

    The kernel of fp8_e4m3 and fp8_e5m2 (``in_dtype`` "float8_e4m3fn" / "float8_e5m2")."""
    check_gemm_shape("fp8_kernel", M, N, K)
    import tilelang.language as T

    bM, bN, bK = tile.block_M, tile.block_N, tile.block_K
    mainloop = tn_mainloop(tile, K)

    @T.prim_func
    def main(
        A: T.Tensor((M, K), in_dtype),
        B: T.Tensor((N, K), in_dtype),
        scale: T.Tensor((1,), "float32"),  # s_a * s_b
        C: T.Tensor((M, N), out_dtype),
    ):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=tile.threads) as (bx, by):
            A_shared = T.alloc_shared((bM, bK), in_dtype)
            B_shared = T.alloc_shared((bN, bK), in_dtype)
            C_local = T.alloc_fragment((bM, bN), "float32")
            mainloop(A, B, A_shared, B_shared, C_local, bx, by)
            for i, j in T.Parallel(bM, bN):
                C_local[i, j] = C_local[i, j] * scale[0]
            T.copy(C_local, C[by * bM, bx * bN])

    return main


def fp8_ws_kernel(M: int, N: int, K: int, tile: Tile, in_dtype: str):
    """The warp-specialized persistent fp8 GEMM (``kernels.ws_gemm``): the kernel of fp8_e4m3_ws,
    fp8_e5m2_ws and, with ``_p<n>`` tiles, fp8_e4m3_ws_promoted. Same operands and epilogue as fp8_kernel."""
    check_gemm_shape("fp8_ws_kernel", M, N, K)
    if why := ws_shape_limit(M, N, K):
        raise Unsupported(why)
    return ws_gemm_kernel(M, N, K, tile, in_dtype)


def ws_shape_limit(M: int, N: int, K: int) -> str | None:
    """TMA moves rows whose byte stride is a multiple of 16: fp8 A and B rows (K bytes) and bf16 C rows."""
    if K % 16 or N % 8:
        return f"the TMA loads and store need K divisible by 16 and N by 8 (N={N}, K={K})"
    return None


def ws_tile_check(tile: Tile, name: str, promoted: bool) -> str | None:
    """The kernel's own rules (``ws_gemm.ws_tile_problem``), and promotion exactly where the name says so."""
    if promoted and not tile.promote:
        return f"tile {tile.name}: {name} promotes to fp32 every n K blocks, so its tiles name n (_p<n>)"
    if tile.promote and not promoted:
        return (f"tile {tile.name}: {name} accumulates without promotion (its peer is cuBLAS fast accumulation);"
                " a _p<n> tile belongs to fp8_e4m3_ws_promoted")
    return ws_tile_problem(tile)


def prepare_fp8(ops: Operands) -> Operands:
    """The epilogue's one scale, s_a·s_b, made once with the operands (also fp8_e5m2's): a product per
    call would be a second kernel inside the timed window that the cuBLAS peer does not pay."""
    return {"scale": (ops["scale_a"] * ops["scale_b"]).reshape(1)}


def launch_fp8(kernel, ops: Operands) -> torch.Tensor:
    """The launch of fp8_e4m3 and fp8_e5m2."""
    return kernel(ops["A"], ops["B"], ops["scale"])


def cublaslt_fp8_shape_limit(M: int, N: int, K: int) -> str | None:
    """cuBLASLt fp8 GEMMs need 16-element aligned leading dimensions; torch checks N and K. The shape
    limit of cublas_fp8_e4m3, cublas_fp8_e4m3_fastacc and kernels.blockscaled's cublas_blockwise_fp8."""
    if N % 16 or K % 16:
        return f"cuBLASLt fp8 needs N and K divisible by 16 (N={N}, K={K})"
    return None


def launch_cublas_fp8_e4m3(kernel, ops: Operands, fast_accum: bool) -> torch.Tensor:
    """torch._scaled_mm, tensorwise scales; also cublas_fp8_e4m3_fastacc's launch (``fast_accum`` True)."""
    # B (N,K) row-major transposed is the column-major (K,N) operand cuBLASLt wants.
    return torch._scaled_mm(
        ops["A"],
        ops["B"].T,
        scale_a=ops["scale_a"].reshape(()),
        scale_b=ops["scale_b"].reshape(()),
        out_dtype=torch.bfloat16,
        use_fast_accum=fast_accum,
    )


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


def _register_cublas(name: str, fast_accum: bool, how: str) -> Variant:
    return register_variant(Variant(
        name=name, family="fp8", input_format=FP8_E4M3_TENSOR.name, emulate=emulate_fp8,
        launch=partial(launch_cublas_fp8_e4m3, fast_accum=fast_accum), min_cc=89, shape_limit=cublaslt_fp8_shape_limit,
        precision="fp8", description=f"torch._scaled_mm (cuBLASLt) e4m3, tensorwise scales, bf16 out, {how}",
    ))


def _register_tilelang(name: str, fmt: Format, kind: str) -> Variant:
    return register_variant(Variant(
        name=name, family="fp8", input_format=fmt.name, emulate=emulate_fp8, launch=launch_fp8,
        prepare=prepare_fp8, kernel=partial(fp8_kernel, in_dtype=FP8[kind][1]), out_idx=(3,), precision="fp8",
        # T.gemm's fp8 wgmma keeps the tensor core's accumulator (no promotion to fp32 every few K
        # blocks), which is cuBLAS's fast accumulation; the promoted call is the second column.
        # cuBLAS has no e5m2 x e5m2 GEMM: e4m3 is the nearest library peer for both.
        baseline=CUBLAS_FP8_E4M3_FASTACC.name,
        second_baseline=CUBLAS_FP8_E4M3.name,
        instructions={"sm_90a": FP8_WGMMA_SS[kind], "sm_89": FP8_MMA_SYNC[kind], "sm_100a": FP8_MMA_SYNC[kind]},
        sass={"sm_90a": FP8_QGMMA[kind], "sm_89": FP8_QMMA[kind], "sm_100a": FP8_AS_F16_HMMA},
        description=f"TileLang {kind}×{kind} GEMM, accumulated in wgmma's fp8 accumulator (fp32 registers, "
        "reduced-precision adds) without promotion, like cuBLAS fast accumulation; per-tensor scales in the "
        "epilogue, bf16 out",
    ))


WGMMA_ONLY = "the warp-specialized kernel is built on wgmma and setmaxnreg, which exist on sm_90a only"


def _register_ws(name: str, fmt: Format, kind: str, promoted: bool) -> Variant:
    peers = (CUBLAS_FP8_E4M3.name, CUBLAS_FP8_E4M3_FASTACC.name)
    accumulation = ("promoted to a second fp32 accumulator every n K blocks (n = the tile's _p<n>), like cuBLAS's "
                    "default call" if promoted else "without promotion, like cuBLAS fast accumulation")
    return register_variant(Variant(
        name=name, family="fp8", input_format=fmt.name, emulate=emulate_fp8, launch=launch_fp8,
        prepare=prepare_fp8, kernel=partial(fp8_ws_kernel, in_dtype=FP8[kind][1]), out_idx=(3,), precision="fp8",
        baseline=peers[0] if promoted else peers[1], second_baseline=peers[1] if promoted else peers[0],
        instructions={"sm_90a": FP8_WGMMA_SS[kind]}, sass={"sm_90a": FP8_QGMMA[kind]},
        unsupported={"sm_89": WGMMA_ONLY, "sm_100a": WGMMA_ONLY}, pass_configs={"sm_90a": WS_PASS_CONFIGS},
        shape_limit=ws_shape_limit, tile_check=partial(ws_tile_check, name=name, promoted=promoted),
        description=f"TileLang {kind}×{kind} GEMM, warp-specialized and persistent (kernels/ws_gemm.py): a TMA "
        "producer warpgroup feeds one or two wgmma consumer warpgroups that keep one batch in flight; grouped "
        f"raster, TMA-store epilogue (a _swapab tile computes Cᵀ for small M); accumulated {accumulation}; "
        "per-tensor scales in the epilogue, bf16 out",
    ))


CUBLAS_FP8_E4M3 = _register_cublas(
    "cublas_fp8_e4m3", False, "default accumulation: the partial sums are promoted to full fp32 every few K blocks")
CUBLAS_FP8_E4M3_FASTACC = _register_cublas("cublas_fp8_e4m3_fastacc", True, "use_fast_accum=True: accumulates like wgmma, no promotion")
FP8_E4M3 = _register_tilelang("fp8_e4m3", FP8_E4M3_TENSOR, "e4m3")
FP8_E5M2 = _register_tilelang("fp8_e5m2", FP8_E5M2_TENSOR, "e5m2")
FP8_E4M3_WS = _register_ws("fp8_e4m3_ws", FP8_E4M3_TENSOR, "e4m3", promoted=False)
FP8_E5M2_WS = _register_ws("fp8_e5m2_ws", FP8_E5M2_TENSOR, "e5m2", promoted=False)
FP8_E4M3_WS_PROMOTED = _register_ws("fp8_e4m3_ws_promoted", FP8_E4M3_TENSOR, "e4m3", promoted=True)
