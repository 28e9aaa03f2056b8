"""int4 GEMM family: C = A_int · B_intᵀ in int32, A (M,K), B (N,K) holding int4 values in [-8, 7].

Operands are quantized per tensor (symmetric, scale = amax / 7) and packed two per byte along K with
``formats.pack_int4`` (element 2i in the low nibble, 2i+1 in the high nibble), the seed's convention.
The formats (``quantize_int4``, ``int_operands``) are in ``kernels.int4_formats``, which imports no kernel.
Every variant returns the exact int32 product; ``to_real`` applies s_a · s_b.

Variants:
- ``int4_mma``: the seed's kernel, ``T.int4`` operands and ``T.gemm``. TileLang lowers it to the s4
  ``mma.sync``; on Hopper that instruction exists but is emulated (no int4 tensor cores), and it
  only builds there with warp specialization off (the TMA path has no 4-bit type).
- ``int4_unpack_s8``: the Hopper path. The packed bytes are TMA-loaded (half the traffic of int8),
  expanded to int8 inside the kernel and multiplied with s8 ``wgmma``: A is decoded straight into
  the wgmma register fragment, B into a shared tile. Two K blocks per pipeline stage let the decode
  of one block overlap the asynchronous ``wgmma`` of the other.
- ``int4_unpack_s8_ss``: the same with both decoded operands in shared memory (simpler fallback).

The int4 family's peers, in the section "int8 peers" below: ``int8_torch_int_mm`` / ``int8_tilelang``,
int8 GEMMs (family "int4") on the same values already unpacked to int8 (format
``int4_tensor_unpacked_s8``), so they time only the GEMM.

Inside ``int4_unpack_s8*`` the decoded K order inside each K block differs from the logical one: decoded
column j < block_K/2 holds the low nibble of packed byte j (logical K 2j), column block_K/2 + j its high
nibble (logical 2j + 1). A and B use the same order, so the dot products over K, and hence C, are
unchanged. The nibble arithmetic (``select_nibbles``, ``sign_extend_nibbles``) is written once at module
level: the kernel calls it with ``T.uint32``, the tests with ``int`` on torch tensors.

TileLang evaluates a prim_func's annotations with the factory's closure variables, so this module
must not use ``from __future__ import annotations``.
"""

from functools import partial

import torch

from kernels.formats import INT4_MAX, INT4_MIN, check_gemm_shape, format_operands, pack_int4
from kernels.int4_formats import (  # noqa: F401  (registers the formats; quantize_int4 kept importable from here)
    INT4_TENSOR,
    INT4_TENSOR_UNPACKED_S8,
    int_operands,
    quantize_int4,
)
from kernels.int4_ws import int4_ws_kernel, int4_ws_shape_limit, int4_ws_tile_problem
from kernels.registry import Format, Operands, Unsupported, Variant, register_variant
from kernels.tiles import Tile
from kernels.tn_gemm import tn_mainloop
from kernels.ws_gemm import PASS_CONFIGS as WS_PASS_CONFIGS

# |a·b| <= 64 per term, so |C| <= 64·K: the int32 accumulator cannot overflow for K < 2^25.
MAX_EXACT_K = 1 << 25
HOPPER_MAX_SMEM = 227 * 1024  # opt-in dynamic shared memory per block on sm_90


# ---------------------------------------------------------------------------------------------
# Exact arithmetic (CPU emulation and reference)
# ---------------------------------------------------------------------------------------------


def exact_int_product(ops: Operands) -> torch.Tensor:
    """A_int · B_intᵀ as int64, exactly.

    Computed with a float64 matmul: every product and partial sum is an integer of magnitude
    <= 64·K < 2^53, so each float64 operation is exact whatever the summation order.
    """
    a, b = int_operands(ops, "exact_int_product")
    if a.shape[-1] >= 1 << 46:
        raise ValueError(f"K={a.shape[-1]} too large for an exact float64 reference")
    return (a.double() @ b.double().T).to(torch.int64)


def check_int32_accumulation(K: int) -> None:
    """Raise if an int32 accumulator could overflow for this K (|C| <= 64·K)."""
    if K >= MAX_EXACT_K:
        raise ValueError(f"K={K}: |C| can reach 64·K >= 2^31, beyond the int32 accumulator (needs K < 2^25)")


def emulate_int_gemm(ops: Operands) -> torch.Tensor:
    """The kernels' arithmetic: exact integer products and sums, int32 result (exact for K < 2^25).

    The emulation of every variant of the family: int4_mma, int4_unpack_s8, int4_unpack_s8_ss and the
    int8 peers int8_tilelang and int8_torch_int_mm."""
    a, _ = int_operands(ops, "emulate_int_gemm")
    check_int32_accumulation(a.shape[-1])
    return exact_int_product(ops).to(torch.int32)


def int_to_real(out: torch.Tensor, ops: Operands) -> torch.Tensor:
    sa, sb = format_operands(ops, ("scale_a", "scale_b"), "int_to_real")
    return out.double() * (sa.double() * sb.double())


# ---------------------------------------------------------------------------------------------
# The nibble decode of int4_unpack_s8*: one Python expression for the kernel and the tests.
# ``const`` makes a 32-bit constant: T.uint32 in the kernel (uint32 arithmetic), int in the tests
# (torch int64 tensors holding the words, 0 <= word < 2^32: no step of it leaves 32 bits).
# ---------------------------------------------------------------------------------------------


def select_nibbles(word, const, shift=None):
    """The low nibble of each byte lane of a 32-bit word (``shift`` None), or of ``word >> shift``
    (shift 4: the high nibbles), as four lanes of 0..15."""
    return (word if shift is None else word >> shift) & const(0x0F0F0F0F)


def sign_extend_nibbles(x, const):
    """Four nibbles (0..15) in byte lanes -> four sign-extended int8 lanes; no cross-lane carry: each
    lane whose nibble has bit 3 set gets 0xF0 ORed in ((x & 0x08) * 0x1E = 0xF0)."""
    return x | ((x & const(0x08080808)) * const(0x1E))


# ---------------------------------------------------------------------------------------------
# TileLang kernels
# ---------------------------------------------------------------------------------------------


def _policy(T, tile: Tile):
    return getattr(T.GemmWarpPolicy, tile.policy)


def int4_mma_kernel(M: int, N: int, K: int, tile: Tile):
    """The seed's int4 GEMM: ``T.int4`` A (M,K), B (N,K), int32 accumulator, transpose_B=True.

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


def int4_unpack_s8_shape_limit(M: int, N: int, K: int) -> str | None:
    """Also int4_unpack_s8_ss's shape limit."""
    if K % 32:
        return f"int4_unpack_s8 needs K divisible by 32 (TMA: packed rows of K/2 bytes 16-byte aligned), K={K}"
    return None


def int4_unpack_s8_kernel(M: int, N: int, K: int, tile: Tile, a_in_registers: bool = True):
    """Packed int4 in global memory, decoded to int8 in the kernel, s8 ``wgmma``, int32 out (Hopper).

    Also int4_unpack_s8_ss's kernel (``a_in_registers`` False).
    The packed operands are passed as int32 views, A (M, K/8) and B (N, K/8): one word = 8 nibbles.
    Each pipeline stage TMA-loads two K blocks (2·block_K values) of packed A and B. Per K block s:
    B is decoded into shared tile B{s} (16 packed bytes -> two 16-byte stores per thread), A into
    register fragment A{s} (``a_in_registers``) or a shared tile; then the warpgroups wait for
    the previous ``wgmma`` batch, sync, and issue this block's ``wgmma`` without waiting. So the
    decode of block k+1 runs while the tensor cores work on block k, and a buffer is rewritten only
    after the ``wgmma`` that read it has retired (the wait precedes the barrier before each issue).
    """
    check_gemm_shape("int4_unpack_s8_kernel", M, N, K)
    import tilelang.language as T
    from tilelang.layout import make_swizzled_layout

    bM, bN, bK, threads = tile.block_M, tile.block_N, tile.block_K, tile.threads
    if reason := int4_unpack_s8_shape_limit(M, N, K):  # the variants' declared shape_limit: a known refusal
        raise Unsupported(reason)
    if bK % 32:
        raise ValueError(f"int4_unpack_s8: block_K={bK} must be a multiple of 32 (s8 wgmma k32, 16-byte decode chunks)")
    for rows in (bN,) if a_in_registers else (bN, bM):
        if (rows * (bK // 32)) % threads:
            raise ValueError(
                f"int4_unpack_s8: {rows} rows x {bK // 32} chunks of 16 packed bytes per K block must divide "
                f"evenly over {threads} threads"
            )
    smem = tile.num_stages * (bM + bN) * bK + 2 * bN * bK + (0 if a_in_registers else 2 * bM * bK)
    if smem > HOPPER_MAX_SMEM:
        raise ValueError(
            f"int4_unpack_s8: tile {tile.name} needs {smem} bytes of shared memory "
            f"({tile.num_stages} stages x {(bM + bN) * bK} packed + decoded tiles), over Hopper's {HOPPER_MAX_SMEM}"
        )
    bKw = bK // 8  # packed int32 words per row per K block
    half = bK // 2
    chunks = bKw // 4  # 16-byte chunks of packed words per row per K block
    policy = _policy(T, tile)

    @T.macro
    def decode_to_shared(P, col0, D, rows, tx, packed, decoded, decoded_bytes):
        # One thread: 16 packed bytes (4 words) -> 16 low-nibble bytes + 16 high-nibble bytes.
        for it in T.unroll(rows * chunks // threads):
            r = (it * threads + tx) // chunks
            c = (it * threads + tx) % chunks
            for v in T.vectorized(4):
                packed[v] = P[r, col0 + c * 4 + v]
            for v in T.unroll(4):
                u = T.Cast("uint32", packed[v])
                decoded[v] = T.Cast("int32", sign_extend_nibbles(select_nibbles(u, T.uint32), T.uint32))
                decoded[4 + v] = T.Cast("int32", sign_extend_nibbles(select_nibbles(u, T.uint32, T.uint32(4)), T.uint32))
            for v in T.vectorized(16):
                D[r, c * 16 + v] = decoded_bytes[v]
            for v in T.vectorized(16):
                D[r, half + c * 16 + v] = decoded_bytes[16 + v]

    @T.macro
    def decode_to_fragment(P, col0, F, rows):
        # Same K order as decode_to_shared; the vectorizer packs 4 lanes into one register.
        for i, j in T.Parallel(rows, bK):
            word = T.Cast("uint32", P[i, col0 + (j % half) // 4])
            nibbles = select_nibbles(word, T.uint32, T.Cast("uint32", 4 * (j // half)))
            F[i, j] = T.Cast("int8", sign_extend_nibbles(nibbles, T.uint32) >> T.Cast("uint32", 8 * (j % 4)))

    @T.prim_func
    def main(
        A: T.Tensor((M, K // 8), "int32"),
        B: T.Tensor((N, K // 8), "int32"),
        C: T.Tensor((M, N), "int32"),
    ):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=threads) as (bx, by):
            A_packed = T.alloc_shared((bM, 2 * bKw), "int32")
            B_packed = T.alloc_shared((bN, 2 * bKw), "int32")
            if a_in_registers:
                A0 = T.alloc_fragment((bM, bK), "int8")
                A1 = T.alloc_fragment((bM, bK), "int8")
            else:
                A0 = T.alloc_shared((bM, bK), "int8")
                A1 = T.alloc_shared((bM, bK), "int8")
            B0 = T.alloc_shared((bN, bK), "int8")
            B1 = T.alloc_shared((bN, bK), "int8")
            C_local = T.alloc_fragment((bM, bN), "int32")
            packed = T.alloc_local((4,), "int32")
            decoded = T.alloc_local((8,), "int32")
            decoded_bytes = T.view(decoded, (32,), "int8")
            tx = T.get_thread_binding()
            # swizzled packed tiles: the decoders' row-strided reads would otherwise hit the same banks
            T.annotate_layout({A_packed: make_swizzled_layout(A_packed), B_packed: make_swizzled_layout(B_packed)})
            if tile.swizzle:
                T.use_swizzle(tile.swizzle)
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, 2 * bK), num_stages=tile.num_stages):
                T.copy(A[by * bM, ko * 2 * bKw], A_packed)
                T.copy(B[bx * bN, ko * 2 * bKw], B_packed)
                for s, (A_s, B_s) in enumerate(((A0, B0), (A1, B1))):
                    decode_to_shared(B_packed, s * bKw, B_s, bN, tx, packed, decoded, decoded_bytes)
                    if a_in_registers:
                        decode_to_fragment(A_packed, s * bKw, A_s, bM)
                    else:
                        decode_to_shared(A_packed, s * bKw, A_s, bM, tx, packed, decoded, decoded_bytes)
                    T.wait_wgmma(0)  # the other buffer pair's wgmma has retired before the sync below
                    T.wgmma_gemm(A_s, B_s, C_local, transpose_B=True, policy=policy)
            T.wait_wgmma(0)
            T.copy(C_local, C[by * bM, bx * bN])

    return main


# ---------------------------------------------------------------------------------------------
# Launches (GPU) and self checks
# ---------------------------------------------------------------------------------------------


def launch_int4_mma(kernel, ops: Operands) -> torch.Tensor:
    return kernel(ops["A_packed"], ops["B_packed"])


def launch_int4_unpack_s8(kernel, ops: Operands) -> torch.Tensor:
    """Also int4_unpack_s8_ss's launch."""
    # same bytes, read as words of 8 nibbles (a view, no copy)
    return kernel(ops["A_packed"].view(torch.int32), ops["B_packed"].view(torch.int32))


def int4_self_checks(launch_fn, M: int, N: int, K: int, device) -> dict[str, bool]:
    """Run the kernel on constant extreme operands and on a K-varying pattern; compare exactly.

    extremes_exact: all -8 x all -8, all 7 x all 7, all -8 x all 7 (C = a·b·K everywhere).
    k_order_exact: values that change along K, catching decode orders that differ between A and B;
    its reference is a float64 matmul on ``device`` (exact: integers below 2^53).
    """
    check_int32_accumulation(K)
    ones = torch.ones(1, dtype=torch.float32, device=device)

    def matches(a_int: torch.Tensor, b_int: torch.Tensor, expected) -> bool:
        ops = {"A_packed": pack_int4(a_int).to(device), "B_packed": pack_int4(b_int).to(device)}
        ops.update(scale_a=ones, scale_b=ones)
        out = launch_fn(ops)
        if out.dtype != torch.int32 or tuple(out.shape) != (M, N):
            return False
        if not isinstance(expected, torch.Tensor):  # a constant
            return bool((out == expected).all())
        return torch.equal(out.long(), expected)

    extremes = all(
        matches(torch.full((M, K), a, dtype=torch.int8), torch.full((N, K), b, dtype=torch.int8), a * b * K)
        for a, b in ((INT4_MIN, INT4_MIN), (INT4_MAX, INT4_MAX), (INT4_MIN, INT4_MAX))
    )
    # int8 arithmetic keeps the pattern at M*K bytes: entries ((c_k + r_m) mod 16) - 8
    def pattern(rows: int, k_step: int, row_step: int) -> torch.Tensor:
        along_k = ((k_step * torch.arange(K)) % 16).to(torch.int8)
        along_rows = ((row_step * torch.arange(rows)) % 16).to(torch.int8)
        return (along_k[None, :] + along_rows[:, None]) % 16 - 8

    a_pat, b_pat = pattern(M, 5, 1), pattern(N, 3, 2)
    expected = (a_pat.to(device).double() @ b_pat.to(device).double().T).long()
    return {"extremes_exact": extremes, "k_order_exact": matches(a_pat, b_pat, expected)}


def _register(name: str, fmt: Format, launch, **fields) -> Variant:
    # throughput is reported as a fraction of the int8 peak (torch._int_mm, harness.ceilings)
    return register_variant(Variant(
        name=name, family="int4", input_format=fmt.name, launch=launch, emulate=emulate_int_gemm,
        exact_reference=exact_int_product, to_real=int_to_real, ops_unit="TOPS", precision="int8", **fields,
    ))


# Regexes over the generated CUDA source (TileLang emits templated calls, not raw PTX).
S4_MMA = r"mma_sync<tl::DataType::kInt4, tl::DataType::kInt4, tl::DataType::kInt32"
S8_MMA = r"mma_sync<tl::DataType::kInt8, tl::DataType::kInt8, tl::DataType::kInt32"
S8_WGMMA_SS = r"wgmma_ss<tl::DataType::kInt8, tl::DataType::kInt8, tl::DataType::kInt32"
S8_WGMMA_RS = r"wgmma_rs<tl::DataType::kInt8, tl::DataType::kInt8, tl::DataType::kInt32"
# ... and over the SASS. Hopper and Blackwell have no int4 tensor cores: there ptxas emulates s4
# mma.sync with s8 IMMA (the seed's int4_mma on sm_90a / sm_100a), which its pattern records.
S4_IMMA = r"IMMA\.16864\.S4\.S4"
S8_IMMA = r"IMMA\.16832\.S8\.S8"
S8_IGMMA = r"IGMMA\.64x\d+x32\.S8\.S8"


# ---------------------------------------------------------------------------------------------
# int8 peers (family "int4"): int8 GEMMs on the int4 values already unpacked to int8
# (int4_tensor_unpacked_s8), so they time only the GEMM; torch._int_mm is the matched peer of
# every int4 kernel (the speedup is taken against it on the same values)
# ---------------------------------------------------------------------------------------------


def int8_tilelang_kernel(M: int, N: int, K: int, tile: Tile):
    """TileLang int8 GEMM (baseline): TMA-fed pipelined ``T.gemm``, A (M,K), B (N,K), int32 out."""
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


def int8_torch_int_mm_shape_limit(M: int, N: int, K: int) -> str | None:
    """Why torch._int_mm (cuBLASLt int8) cannot run (M, N, K), or None: it needs M > 16, K and N
    positive multiples of 8."""
    problems = []
    if M <= 16:
        problems.append(f"M={M} must be > 16")
    if K <= 0 or K % 8:
        problems.append(f"K={K} must be a positive multiple of 8")
    if N <= 0 or N % 8:
        problems.append(f"N={N} must be a positive multiple of 8")
    return "torch._int_mm cannot run this shape: " + "; ".join(problems) if problems else None


def launch_int8_torch_int_mm(kernel, ops: Operands) -> torch.Tensor:
    a, b = ops["A"], ops["B"]
    if reason := int8_torch_int_mm_shape_limit(a.shape[0], b.shape[0], a.shape[1]):
        raise ValueError(reason)
    # B (N,K) row-major transposed is the column-major (K,N) operand cuBLASLt's int8 path wants.
    return torch._int_mm(a, b.T)


INT8_TORCH_INT_MM = _register(
    "int8_torch_int_mm", INT4_TENSOR_UNPACKED_S8, launch_int8_torch_int_mm, min_cc=75,
    shape_limit=int8_torch_int_mm_shape_limit,
    description="torch._int_mm (cuBLASLt int8, int32 out) on the int4 values pre-unpacked to int8; "
    "needs M > 16 and K, N multiples of 8",
)
INT8_TILELANG = _register(
    "int8_tilelang", INT4_TENSOR_UNPACKED_S8, launch_int8_tilelang, kernel=int8_tilelang_kernel, out_idx=(2,),
    instructions={"sm_89": S8_MMA, "sm_90a": S8_WGMMA_SS, "sm_100a": S8_MMA}, baseline=INT8_TORCH_INT_MM.name,
    sass={"sm_89": S8_IMMA, "sm_90a": S8_IGMMA, "sm_100a": S8_IMMA},
    description="TileLang int8 GEMM (s8 wgmma on Hopper) on the int4 values pre-unpacked to int8, int32 out",
)


# ---------------------------------------------------------------------------------------------
# The int4 variants
# ---------------------------------------------------------------------------------------------

# The TMA lowering has no 4-bit type ("Check failed: (0) is false: int4"); without warp
# specialization the T.int4 copies use cp.async and the kernel builds.
_NO_WS = {"tl.disable_warp_specialized": True}
_WGMMA_ONLY = (
    "built on T.wgmma_gemm (explicit asynchronous Hopper wgmma), which TileLang refuses to lower "
    "for {arch}; the unpacked-int8 route there is {int8_tilelang}"
)


def _register_unpack_s8(name: str, a_in_registers: bool, instruction: str, what: str) -> Variant:
    return _register(
        name, INT4_TENSOR, launch_int4_unpack_s8, kernel=partial(int4_unpack_s8_kernel, a_in_registers=a_in_registers),
        out_idx=(2,), instructions={"sm_90a": instruction}, sass={"sm_90a": S8_IGMMA}, self_checks=int4_self_checks,
        unsupported={a: _WGMMA_ONLY.format(arch=a, int8_tilelang=INT8_TILELANG.name) for a in ("sm_89", "sm_100a")},
        shape_limit=int4_unpack_s8_shape_limit, baseline=INT8_TORCH_INT_MM.name,
        description="TileLang int4 GEMM for Hopper: packed int4 TMA-loaded, decoded to int8 in the kernel "
        f"({what}), s8 wgmma overlapped with the next block's decode, int32 accumulation",
    )


INT4_MMA = _register(
    "int4_mma", INT4_TENSOR, launch_int4_mma, kernel=int4_mma_kernel, out_idx=(2,),
    instructions={"sm_89": S4_MMA, "sm_90a": S4_MMA, "sm_100a": S4_MMA}, pass_configs={"sm_90a": _NO_WS, "sm_100a": _NO_WS},
    sass={"sm_89": S4_IMMA, "sm_90a": S8_IMMA, "sm_100a": S8_IMMA},
    self_checks=int4_self_checks, baseline=INT8_TORCH_INT_MM.name,
    description="the seed's TileLang int4 GEMM (T.int4 operands, s4 mma.sync, int32 accumulation); "
    "emulated s4 mma on Hopper, warp specialization off there",
)
INT4_UNPACK_S8 = _register_unpack_s8(
    "int4_unpack_s8", True, S8_WGMMA_RS, "A decoded into the wgmma register fragment, B into shared memory")
INT4_UNPACK_S8_SS = _register_unpack_s8("int4_unpack_s8_ss", False, S8_WGMMA_SS, "A and B decoded into shared memory")


def int4_ws_factory(M: int, N: int, K: int, tile: Tile):
    """int4_ws's kernel factory: ``int4_ws.int4_ws_kernel`` after the M, N, K check every factory makes."""
    check_gemm_shape("int4_ws_kernel", M, N, K)
    return int4_ws_kernel(M, N, K, tile)


INT4_WS = _register(
    "int4_ws", INT4_TENSOR, launch_int4_unpack_s8, kernel=int4_ws_factory, out_idx=(2,),
    instructions={"sm_90a": S8_WGMMA_RS}, sass={"sm_90a": S8_IGMMA}, self_checks=int4_self_checks,
    unsupported={a: _WGMMA_ONLY.format(arch=a, int8_tilelang=INT8_TILELANG.name) for a in ("sm_89", "sm_100a")},
    pass_configs={"sm_90a": WS_PASS_CONFIGS}, shape_limit=int4_ws_shape_limit, tile_check=int4_ws_tile_problem,
    baseline=INT8_TORCH_INT_MM.name, second_baseline=INT8_TILELANG.name,
    description="TileLang int4 GEMM for Hopper, warp-specialized and persistent (kernels/int4_ws.py): a TMA warp "
    "loads packed int4, three producer warps decode B to int8 in shared memory, one or two consumer warpgroups "
    "decode A into alternating wgmma register fragments and keep one s8 wgmma batch in flight (the decode of "
    "block k+1 runs under the wgmma of block k); values decoded as 16·q in 3 operations per 8, the exact "
    "256·C shifted back in a TMA-store epilogue; int32 accumulation, exact for K < 2^17",
)
