"""int4 GEMM family: C = A_int · B_intᵀ in int32, A (M,K), B (N,K) holding int4 values in [-8, 7].

Operands are quantized per tensor (symmetric, scale = amax / 7) and packed two per byte along K with
``formats.pack_int4`` (element 2i in the low nibble, 2i+1 in the high nibble). The formats
(``quantize_int4``, ``int_operands``) are in ``kernels.int4_formats``, which imports no kernel.
Every variant returns the exact int32 product; ``to_real`` applies s_a · s_b.

Here: the exact arithmetic every variant is checked against (its emulation, its bit-exact reference,
the GPU self checks) and the registrations. The kernels: ``kernels.int4_mma`` (int4_mma, TileLang's
``T.int4``), ``kernels.int4_unpack_s8`` (int4_unpack_s8, int4_unpack_s8_ss: decoded to int8 in the
kernel for Hopper's s8 wgmma), ``kernels.int4_ws`` (int4_ws) and the int8 peer ``kernels.int8_tilelang``.
The int4 variants' matched peer is torch._int_mm (``kernels.peers``); it and int8_tilelang are int8
GEMMs on the same values already unpacked to int8 (format ``int4_tensor_unpacked_s8``), so they time
only the GEMM.
"""
from functools import partial

import torch

from kernels.formats import INT4_MAX, INT4_MIN, format_operands, pack_int4
from kernels.int4_formats import INT4_TENSOR, INT4_TENSOR_UNPACKED_S8, int_operands
from kernels.int4_mma import PASS_CONFIGS as INT4_MMA_PASS_CONFIGS
from kernels.int4_mma import int4_mma_kernel, launch_int4_mma
from kernels.int4_unpack_s8 import int4_unpack_s8_kernel, int4_unpack_s8_shape_limit, launch_int4_unpack_s8
from kernels.int4_ws import INT4_WS_TILES, int4_ws_kernel, int4_ws_shape_limit, int4_ws_tile_problem
from kernels.int8_tilelang import int8_tilelang_kernel, launch_int8_tilelang
from kernels.peers import int8_torch_int_mm_shape_limit, launch_int8_torch_int_mm
from kernels.registry import Operands, register
from kernels.warp_specialized import PASS_CONFIGS as WS_PASS_CONFIGS

# |a·b| <= 64 per term, so |C| <= 64·K: the int32 accumulator cannot overflow for K < 2^25.
MAX_EXACT_K = 1 << 25


# ---------------------------------------------------------------------------------------------
# Exact arithmetic (CPU emulation and reference) and the GPU self checks
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

    The emulation of every variant of the family: int4_mma, int4_unpack_s8, int4_unpack_s8_ss, int4_ws
    and the int8 peers int8_tilelang and int8_torch_int_mm."""
    a, _ = int_operands(ops, "emulate_int_gemm")
    check_int32_accumulation(a.shape[-1])
    return exact_int_product(ops).to(torch.int32)


def int_to_real(out: torch.Tensor, ops: Operands) -> torch.Tensor:
    sa, sb = format_operands(ops, ("scale_a", "scale_b"), "int_to_real")
    return out.double() * (sa.double() * sb.double())


def int4_self_checks(launch_fn, M: int, N: int, K: int, device) -> dict[str, bool]:
    """Run the kernel on constant extreme operands and on a K-varying pattern; compare exactly.

    extremes_exact: all -8 x all -8, all 7 x all 7, all -8 x all 7 (C = a·b·K everywhere).
    k_order_exact: values that change along K, catching decode orders that differ between A and B;
    its reference is a float64 matmul on ``device`` (exact: integers below 2^53). Every operand is made and
    packed on ``device``: on the CPU, packing a 28672x8192 weight four times took seconds of the GPU's queue.
    """
    check_int32_accumulation(K)
    ones = torch.ones(1, dtype=torch.float32, device=device)

    def matches(a_int: torch.Tensor, b_int: torch.Tensor, expected) -> bool:
        ops = {"A_packed": pack_int4(a_int), "B_packed": pack_int4(b_int)}
        ops.update(scale_a=ones, scale_b=ones)
        out = launch_fn(ops)
        if out.dtype != torch.int32 or tuple(out.shape) != (M, N):
            return False
        if not isinstance(expected, torch.Tensor):  # a constant
            return bool((out == expected).all())
        return torch.equal(out.long(), expected)

    extremes = all(
        matches(torch.full((M, K), a, dtype=torch.int8, device=device),
                torch.full((N, K), b, dtype=torch.int8, device=device), a * b * K)
        for a, b in ((INT4_MIN, INT4_MIN), (INT4_MAX, INT4_MAX), (INT4_MIN, INT4_MAX))
    )
    # int8 arithmetic keeps the pattern at M*K bytes: entries ((c_k + r_m) mod 16) - 8
    def pattern(rows: int, k_step: int, row_step: int) -> torch.Tensor:
        along_k = ((k_step * torch.arange(K, device=device)) % 16).to(torch.int8)
        along_rows = ((row_step * torch.arange(rows, device=device)) % 16).to(torch.int8)
        return (along_k[None, :] + along_rows[:, None]) % 16 - 8

    a_pat, b_pat = pattern(M, 5, 1), pattern(N, 3, 2)
    expected = (a_pat.double() @ b_pat.double().T).long()
    return {"extremes_exact": extremes, "k_order_exact": matches(a_pat, b_pat, expected)}


# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------

# Regexes over the generated CUDA source (TileLang emits templated calls, not raw PTX).
S4_MMA = r"mma_sync<tl::DataType::kInt4, tl::DataType::kInt4, tl::DataType::kInt32"
S8_MMA = r"mma_sync<tl::DataType::kInt8, tl::DataType::kInt8, tl::DataType::kInt32"
S8_WGMMA_SS = r"wgmma_ss<tl::DataType::kInt8, tl::DataType::kInt8, tl::DataType::kInt32"
S8_WGMMA_RS = r"wgmma_rs<tl::DataType::kInt8, tl::DataType::kInt8, tl::DataType::kInt32"
# ... and over the SASS. Hopper and Blackwell have no int4 tensor cores: there ptxas emulates s4
# mma.sync with s8 IMMA (int4_mma on sm_90a / sm_100a), which its pattern records.
S4_IMMA = r"IMMA\.16864\.S4\.S4"
S8_IMMA = r"IMMA\.16832\.S8\.S8"
S8_IGMMA = r"IGMMA\.64x\d+x32\.S8\.S8"

# what every variant of the family shares; throughput is reported as a fraction of the int8 peak
# (torch._int_mm, harness.ceilings)
_INT_GEMM = dict(family="int4", emulate=emulate_int_gemm, exact_reference=exact_int_product, to_real=int_to_real,
                ops_unit="TOPS", precision="int8")
# the variants built on T.wgmma_gemm, which TileLang lowers for sm_90a only (the decode-to-int8 ones)
_WGMMA_ONLY = ("built on T.wgmma_gemm (explicit asynchronous Hopper wgmma), which TileLang refuses to lower "
              "for {arch}; the unpacked-int8 route there is {int8_tilelang}")


def _hopper_only(int8_tilelang: str) -> dict[str, str]:
    return {a: _WGMMA_ONLY.format(arch=a, int8_tilelang=int8_tilelang) for a in ("sm_89", "sm_100a")}


# the int8 peers: int8 GEMMs on the int4 values already unpacked to int8, so they time only the GEMM;
# torch._int_mm is the matched peer of every int4 kernel (the speedup is taken against it on the same values)
INT8_TORCH_INT_MM = register(
    name="int8_torch_int_mm", input_format=INT4_TENSOR_UNPACKED_S8.name, launch=launch_int8_torch_int_mm, **_INT_GEMM,
    min_cc=75, shape_limit=int8_torch_int_mm_shape_limit,
    description="torch._int_mm (cuBLASLt int8, int32 out) on the int4 values pre-unpacked to int8; "
    "needs M > 16 and K, N multiples of 8",
)
INT8_TILELANG = register(
    name="int8_tilelang", input_format=INT4_TENSOR_UNPACKED_S8.name, launch=launch_int8_tilelang, **_INT_GEMM,
    kernel=int8_tilelang_kernel, out_idx=(2,), baseline=INT8_TORCH_INT_MM.name,
    instructions={"sm_89": S8_MMA, "sm_90a": S8_WGMMA_SS, "sm_100a": S8_MMA},
    sass={"sm_89": S8_IMMA, "sm_90a": S8_IGMMA, "sm_100a": S8_IMMA},
    description="TileLang int8 GEMM (s8 wgmma on Hopper) on the int4 values pre-unpacked to int8, int32 out",
)
INT4_MMA = register(
    name="int4_mma", input_format=INT4_TENSOR.name, launch=launch_int4_mma, **_INT_GEMM,
    kernel=int4_mma_kernel, out_idx=(2,), self_checks=int4_self_checks, baseline=INT8_TORCH_INT_MM.name,
    instructions={"sm_89": S4_MMA, "sm_90a": S4_MMA, "sm_100a": S4_MMA},
    sass={"sm_89": S4_IMMA, "sm_90a": S8_IMMA, "sm_100a": S8_IMMA},
    pass_configs={"sm_90a": INT4_MMA_PASS_CONFIGS, "sm_100a": INT4_MMA_PASS_CONFIGS},
    description="TileLang int4 GEMM on T.int4 operands (s4 mma.sync, int32 accumulation); "
    "emulated s4 mma on Hopper, warp specialization off there",
)
# int4_unpack_s8 and int4_unpack_s8_ss: one kernel, A decoded into registers or into shared memory
_UNPACK_S8 = dict(input_format=INT4_TENSOR.name, launch=launch_int4_unpack_s8, **_INT_GEMM, out_idx=(2,),
                 sass={"sm_90a": S8_IGMMA}, self_checks=int4_self_checks, unsupported=_hopper_only(INT8_TILELANG.name),
                 shape_limit=int4_unpack_s8_shape_limit, baseline=INT8_TORCH_INT_MM.name)
_UNPACK_S8_DESCRIPTION = ("TileLang int4 GEMM for Hopper: packed int4 TMA-loaded, decoded to int8 in the kernel "
                         "({}), s8 wgmma overlapped with the next block's decode, int32 accumulation")
INT4_UNPACK_S8 = register(
    name="int4_unpack_s8", **_UNPACK_S8, kernel=int4_unpack_s8_kernel, instructions={"sm_90a": S8_WGMMA_RS},
    description=_UNPACK_S8_DESCRIPTION.format("A decoded into the wgmma register fragment, B into shared memory"),
)
INT4_UNPACK_S8_SS = register(
    name="int4_unpack_s8_ss", **_UNPACK_S8, kernel=partial(int4_unpack_s8_kernel, a_in_registers=False),
    instructions={"sm_90a": S8_WGMMA_SS},
    description=_UNPACK_S8_DESCRIPTION.format("A and B decoded into shared memory"),
)
INT4_WS = register(
    name="int4_ws", input_format=INT4_TENSOR.name, launch=launch_int4_unpack_s8, **_INT_GEMM,
    kernel=int4_ws_kernel, out_idx=(2,), instructions={"sm_90a": S8_WGMMA_RS}, sass={"sm_90a": S8_IGMMA},
    self_checks=int4_self_checks, unsupported=_hopper_only(INT8_TILELANG.name),
    pass_configs={"sm_90a": WS_PASS_CONFIGS}, shape_limit=int4_ws_shape_limit, tile_check=int4_ws_tile_problem,
    tile_space=INT4_WS_TILES,
    baseline=INT8_TORCH_INT_MM.name, second_baseline=INT8_TILELANG.name,
    description="TileLang int4 GEMM for Hopper, warp-specialized and persistent (kernels/int4_ws.py): a TMA warp "
    "loads packed int4, three producer warps decode B to int8 in shared memory, one or two consumer warpgroups "
    "decode A into alternating wgmma register fragments and keep one s8 wgmma batch in flight (the decode of "
    "block k+1 runs under the wgmma of block k); values decoded as 16·q in 3 operations per 8, the exact "
    "256·C shifted back in a TMA-store epilogue; int32 accumulation, exact for K < 2^17",
)
