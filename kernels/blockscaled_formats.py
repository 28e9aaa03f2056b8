"""The block-scaled family's input formats: e4m3 values with one scale per block of K.

- ``deepseek_1x128_128x128``: A one fp32 scale per row per 128 K, SFA (M, ⌈K/128⌉); B one fp32 scale
  per 128x128 block, SFB (⌈N/128⌉, ⌈K/128⌉); scale = amax/448 of the block.
- ``mxfp8_e4m3_b32`` (OCP MX v1.0): blocks of 32 along K for both operands, power-of-two E8M0 scales
  stored as uint8 codes (bias 127); shared exponent = ⌊log2 amax⌋ − 8 as the spec prescribes, so a
  block's largest values can exceed 448 after scaling and are clamped.
- ``generic_g128``: SFA (M, K/128) and SFB (N, K/128) fp32, one scale per row per
  128 K for both operands.
torch's fp8 casts need not saturate, so every quantizer clamps to ±448 before the cast (``formats.saturate_fp8``).
The quantizers accept any K; the kernels' K % 128 rule is each kernel's shape limit (``kernels.blockscaled_g128``,
``kernels.blockscaled_sm100``).

Formats only (quantizers, scale layouts the kernels and cuBLAS read, dequantize, their registration):
this module imports no kernel, so that an inputs job, whose code inputs are the import closure of its
formats' modules, does not rerun when a kernel (``kernels/blockscaled_g128.py``, ``kernels/blockscaled_sm90.py``,
...) changes. ``kernels.blockscaled`` imports it.
"""
from functools import partial

import torch

from kernels.formats import (
    E4M3,
    E4M3_EMAX,
    E4M3_MAX,
    E8M0_BIAS,
    OperandTypeError,
    block_view,
    check_gemm_operands,
    check_operand,
    e8m0_decode,
    expand_blocks,
    format_operands,
    pack_e8m0_words,
    quantize_blocks,
    quantize_mx_blocks,
    round_up,
    saturate_fp8,
    unblock,
)
from kernels.registry import Format, Operands, register_format

PROMOTION_K = 128  # K per fp32 promotion on sm_90a; also the DeepSeek and generic scale block
MX_BLOCK_K = 32
UTCCP_ROWS = 128  # rows of scale words one tcgen05.cp 32x128b.warpx4 copy moves


def _saturate_e4m3(x: torch.Tensor) -> torch.Tensor:
    return saturate_fp8(x, E4M3)


def quantize_e4m3_blocks(
    x: torch.Tensor, rows: int, cols: int, *, operand: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 with one fp32 scale (amax/448) per ``rows`` x ``cols`` block (``formats.quantize_blocks``).

    Returns (q (R, C) e4m3, scales (⌈R/rows⌉, ⌈C/cols⌉) fp32) with q·scale ≈ x. Scales follow
    ``formats.amax_scale``: never below fp32's smallest normal (a subnormal block amax cannot give a zero
    scale and NaN codes), and 1 for an all-zero block (any scale quantizes it to zeros; 1 keeps the
    scale finite). ``operand`` (e.g. "A") names the tensor in error messages.
    """
    check_operand(x, "quantize_e4m3_blocks", operand, ndim=2)
    R, C = x.shape
    blocks = block_view(x.float(), rows, cols)
    q, scales = quantize_blocks(blocks, E4M3_MAX, torch.float32, _saturate_e4m3)
    return unblock(q, R, C), scales.reshape(blocks.shape[0], blocks.shape[2])


def quantize_mxfp8(x: torch.Tensor, *, operand: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 e4m3 along rows: (q (R, C) e4m3, codes (R, ⌈C/32⌉) uint8 E8M0).

    OCP MX v1.0 (``formats.quantize_mx_blocks``): shared exponent ⌊log2 amax⌋ − 8, clamped to E8M0's
    [-127, 127]; a tiny (e.g. subnormal) amax gets E8M0's smallest scale 2^-127, a code the block-scaled
    MMA reads as such, so the codes x / 2^-127 (exact) stay finite. A block's largest values can exceed
    448 after scaling and are clamped.
    """
    check_operand(x, "quantize_mxfp8", operand, ndim=2)
    R, C = x.shape
    blocks = block_view(x.float(), 1, MX_BLOCK_K)
    q, codes = quantize_mx_blocks(blocks, E4M3_EMAX, _saturate_e4m3)
    return unblock(q, R, C), codes.reshape(R, -1)


def utccp_scale_layout(words: torch.Tensor) -> torch.Tensor:
    """(R, W) scale words -> (W, R128) int32: K-word major, each 128-row chunk in tcgen05.cp order.

    ``tcgen05.cp ... 32x128b.warpx4`` gives TMEM lane l the four words at chunk positions 4l..4l+3
    (replicated to all four lane quarters), and the MMA reads row 32q+l from column q; so position
    4l+q of a chunk must hold row 32q+l. Doing that transpose here, once per operand, lets the kernel
    copy each chunk straight from global memory (what ``T.tcgen05_sf_warp_transpose`` would do in
    shared memory). Rows are padded to a multiple of 128 with scale-1 words.
    """
    if not isinstance(words, torch.Tensor) or words.dtype != torch.int32 or words.ndim != 2:
        raise OperandTypeError("utccp_scale_layout: words must be a 2-D int32 tensor (pack_e8m0_words' output), got "
                               f"{getattr(words, 'dtype', type(words).__name__)} {tuple(getattr(words, 'shape', ()))}")
    R, W = words.shape
    R128 = round_up(R, UTCCP_ROWS)
    one = int.from_bytes(bytes([E8M0_BIAS] * 4), "little")
    padded = torch.full((R128, W), one, dtype=torch.int32, device=words.device)
    padded[:R] = words
    chunks = padded.T.reshape(W, R128 // UTCCP_ROWS, 4, 32)  # [w, chunk, q, l] = row chunk*128 + 32q + l
    return chunks.transpose(-1, -2).reshape(W, R128).contiguous()


# ---- formats -------------------------------------------------------------------------------------

def _m_major_padded(scales: torch.Tensor) -> torch.Tensor:
    """(R, nkb) -> (nkb, R4) fp32 with R4 = R rounded up to 4, zero padded.

    The kernels load a tile's row scales per K block with TMA, which needs a contiguous run per K
    block and a 16-byte row pitch; cuBLAS wants the same "outer-dim-major" layout for 1x128 scales.
    """
    R, nkb = scales.shape
    out = torch.zeros(nkb, round_up(R, 4), dtype=torch.float32, device=scales.device)
    out[:, :R] = scales.T
    return out


def _who(name: str | None, role: str, fallback: str) -> str:
    return f"format {name}'s {role}" if name else fallback


def quantize_deepseek(A: torch.Tensor, B: torch.Tensor, name: str | None = None) -> Operands:
    check_gemm_operands(A, B, name or "quantize_deepseek")
    a, sfa = quantize_e4m3_blocks(A, 1, PROMOTION_K, operand="A")
    b, sfb = quantize_e4m3_blocks(B, PROMOTION_K, PROMOTION_K, operand="B")
    return {"A": a, "B": b, "SFA": sfa, "SFB": sfb, "SFA_t": _m_major_padded(sfa)}


def dequantize_deepseek(ops: Operands, name: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    a, b, sfa, sfb = format_operands(ops, ("A", "B", "SFA", "SFB"), _who(name, "dequantize", "dequantize_deepseek"))
    (M, K), N = a.shape, b.shape[0]
    sa = expand_blocks(sfa.double(), 1, PROMOTION_K, M, K)
    sb = expand_blocks(sfb.double(), PROMOTION_K, PROMOTION_K, N, K)
    return a.double() * sa, b.double() * sb


def quantize_mx(A: torch.Tensor, B: torch.Tensor, name: str | None = None) -> Operands:
    check_gemm_operands(A, B, name or "quantize_mx")
    a, sfa = quantize_mxfp8(A, operand="A")
    b, sfb = quantize_mxfp8(B, operand="B")
    return {
        "A": a,
        "B": b,
        "SFA": sfa,
        "SFB": sfb,
        "SFA_words": utccp_scale_layout(pack_e8m0_words(sfa)),
        "SFB_words": utccp_scale_layout(pack_e8m0_words(sfb)),
    }


def dequantize_mx(ops: Operands, name: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    a, b, sfa, sfb = format_operands(ops, ("A", "B", "SFA", "SFB"), _who(name, "dequantize", "dequantize_mx"))
    (M, K), N = a.shape, b.shape[0]
    sa = expand_blocks(e8m0_decode(sfa).double(), 1, MX_BLOCK_K, M, K)
    sb = expand_blocks(e8m0_decode(sfb).double(), 1, MX_BLOCK_K, N, K)
    return a.double() * sa, b.double() * sb


def quantize_generic(A: torch.Tensor, B: torch.Tensor, g: int, name: str | None = None) -> Operands:
    check_gemm_operands(A, B, name or "quantize_generic")
    a, sfa = quantize_e4m3_blocks(A, 1, g, operand="A")
    b, sfb = quantize_e4m3_blocks(B, 1, g, operand="B")
    return {"A": a, "B": b, "SFA": sfa, "SFB": sfb, "SFA_t": _m_major_padded(sfa), "SFB_t": _m_major_padded(sfb)}


def dequantize_generic(ops: Operands, g: int, name: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    a, b, sfa, sfb = format_operands(ops, ("A", "B", "SFA", "SFB"), _who(name, "dequantize", "dequantize_generic"))
    (M, K), N = a.shape, b.shape[0]
    sa = expand_blocks(sfa.double(), 1, g, M, K)
    sb = expand_blocks(sfb.double(), 1, g, N, K)
    return a.double() * sa, b.double() * sb


# ---- registration --------------------------------------------------------------------------------

def _register_format(name: str, quantize, dequantize, reads: tuple[str, ...], description: str) -> Format:
    # each function is given the format's name for its error messages
    return register_format(Format(name, partial(quantize, name=name), partial(dequantize, name=name), reads=reads,
                                  description=description))


DEEPSEEK_1X128_128X128 = _register_format(
    "deepseek_1x128_128x128", quantize_deepseek, dequantize_deepseek, ("A", "B", "SFA_t", "SFB"),
    "e4m3; A one fp32 scale per row per 128 K, B one per 128x128 block (amax/448); "
    "SFA_t is SFA M-major, rows padded to 4, for TMA and cuBLAS",
)
MXFP8_E4M3_B32 = _register_format(
    "mxfp8_e4m3_b32", quantize_mx, dequantize_mx, ("A", "B", "SFA_words", "SFB_words"),
    "OCP MX v1.0 MXFP8: e4m3, one E8M0 code (uint8, bias 127) per 32 K per row, shared exponent "
    "floor(log2 amax) - 8, clamped to ±448; SF*_words: codes packed 4 per int32 in tcgen05.cp order",
)
GENERIC_G128 = _register_format(
    "generic_g128", partial(quantize_generic, g=PROMOTION_K), partial(dequantize_generic, g=PROMOTION_K),
    ("A", "B", "SFA_t", "SFB_t"), "e4m3, one fp32 scale per row per 128 K for A and B (amax/448); "
    "SFA_t / SFB_t are the scales M- / N-major for TMA",
)
