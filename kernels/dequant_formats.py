"""The dequantize family's (W4A16) input formats: A rounded to bf16, the weight B (N, K) 4-bit with
group scales, stored packed two codes per byte along K (element 2i in the low nibble, 2i+1 in the
high nibble: ``formats.pack_int4`` / ``formats.pack_codes``) as int8 (N, K/2). Scales (and zero points)
are stored group-major, shape (K/group, N), so that one K block's scales for a tile of weight rows are
one contiguous TMA box.

Formats (``dequantize`` gives the exact real value code·scale in float64; every bf16 scale is at least
bf16's smallest normal, 1 for an all-zero group: ``kernels.formats.amax_scale``):
- ``w4_int4_sym_g128``: q in [-8,7] (two's complement nibbles), bf16 scale = amax/7 per 128 K.
- ``w4_uint4_zp_g128``: codes c in [0,15], bf16 scale = (max-min)/15 and bf16 zero point
  z = round(-min/scale) per 128 K (min/max include 0, so z is an integer code); value (c - z)·scale.
  max - min is taken in float64, so a group spanning ±3e38 keeps a finite scale.
- ``w4_e2m1_g32``: fp4 e2m1 codes (sign bit 3), bf16 scale = amax/6 per 32 K.
- ``w4_mxfp4``: OCP MX fp4: e2m1 codes, one E8M0 scale per 32 K stored as uint8 (bias 127);
  shared exponent = floor(log2 amax) - 2, codes saturate at ±6.
- ``w4_tinygemm_g128``: tinygemm's own format (``torch._weight_int4pack_mm``), below.
- ``w4_humming_int4_g128``: the codes and scales of ``w4_int4_sym_g128`` laid out as humming-kernels takes
  them (offset-binary codes eight per int32, scales (N, K/128)), below.
An activation beyond bf16's range is refused (``formats.to_bf16``), never stored as Inf.

Formats only (quantize, dequantize, the decode the emulation and the torch baselines share, their
registration): this module imports no kernel, so that an inputs job, whose code inputs are the import
closure of its formats' modules, does not rerun when a kernel (``kernels/dequant_w4.py``) changes.
``kernels.dequant`` imports it and registers each format's variants.
"""
from dataclasses import dataclass
from functools import partial

import torch

from kernels.formats import (
    BF16_DECODE_MIN_EXPONENT,
    E2M1_EMAX,
    E2M1_MAX,
    INT4_MAX,
    OperandTypeError,
    amax_scale,
    check_gemm_operands,
    check_operand,
    e2m1_decode,
    e2m1_encode,
    e8m0_decode,
    encode_int4,
    expand_blocks,
    format_operands,
    pack_codes,
    pack_int4,
    quantize_blocks,
    quantize_mx_blocks,
    to_bf16,
    unpack_codes,
    unpack_int4,
)
from kernels.registry import Format, Operands, register_format

_QUANT_ROWS = 1024  # quantize the weight in row chunks to bound the temporaries' memory
ACTIVATION, WEIGHT = "A (the activation)", "B (the weight)"


@dataclass(frozen=True)
class W4Format:
    name: str
    codes: str  # "int4" (two's complement) | "uint4_zp" | "e2m1"
    scale: str  # "bfloat16" | "e8m0" (uint8 codes)
    group: int
    kind: int  # selects the CUDA decoder (dq_decode_fragment's KIND)
    description: str

    @property
    def has_zeros(self) -> bool:
        return self.codes == "uint4_zp"


def _w4(fmt, who: str) -> W4Format:
    """``fmt`` as a W4Format: one, or the name of one."""
    if isinstance(fmt, W4Format):
        return fmt
    if isinstance(fmt, str) and fmt in W4_FORMATS:
        return W4_FORMATS[fmt]
    raise ValueError(f"{who}: fmt must be a W4Format or the name of one ({', '.join(sorted(W4_FORMATS))}), got {fmt!r}")


def _check_weight(B: torch.Tensor, name: str, group: int) -> None:
    """The weight of format ``name``: a 2-D floating-point tensor of finite values, K whole groups."""
    check_operand(B, name, WEIGHT, ndim=2)
    _check_groups(B, name, group)


def _check_groups(B: torch.Tensor, name: str, group: int) -> None:
    if B.shape[1] % group:
        raise ValueError(f"{name}: K={B.shape[1]} must be a multiple of {group} (the group size)")


def _quantize_rows(Bg: torch.Tensor, fmt: W4Format) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One chunk of rows viewed as (rows, K/g, g) float32 -> (codes (rows, K), scales, zeros) per group."""
    rows, ngroups, g = Bg.shape
    # bf16 scales come from formats.amax_scale: never below bf16's smallest normal (a subnormal group
    # amax cannot round to a zero or subnormal scale), 1 for an all-zero group (any scale works)
    zeros = None
    if fmt.codes == "int4":
        codes, scale = quantize_blocks(Bg, INT4_MAX, torch.bfloat16, encode_int4, dims=(-1,))
    elif fmt.codes == "uint4_zp":
        lo = Bg.amin(-1).clamp(max=0)
        hi = Bg.amax(-1).clamp(min=0)
        # the range (max - min) onto the 15 code steps; in float64, where fp32 would overflow to Inf for
        # a group holding ±3e38 (exact for any two fp32 values: their fp32 difference, bit for bit)
        scale = amax_scale(hi.double() - lo.double(), 15, torch.bfloat16)
        zero = torch.round(-lo / scale.float()).clamp(0, 15)
        codes = (torch.round(Bg / scale.float()[..., None]) + zero[..., None]).clamp(0, 15)
        zeros = zero.to(torch.bfloat16)  # small integers: exact
    elif fmt.scale == "bfloat16":  # e2m1 with a bf16 scale
        codes, scale = quantize_blocks(Bg, E2M1_MAX, torch.bfloat16, e2m1_encode, dims=(-1,))
    else:  # OCP MX: power-of-two scale 2^(floor(log2 amax) - emax_elem)
        # codes 1..254 only: 0 (a subnormal bf16 scale in the kernel's decode) and 255 (NaN) are never made
        codes, scale = quantize_mx_blocks(Bg, E2M1_EMAX, e2m1_encode, BF16_DECODE_MIN_EXPONENT, dims=(-1,))
    return codes.reshape(rows, ngroups * g), scale.reshape(rows, ngroups), zeros


def quantize_weight(B: torch.Tensor, fmt: W4Format) -> Operands:
    """Deterministic group quantization of the weight B (N, K) -> {"B", "scales"[, "zeros"]}.
    ``fmt``: a W4Format or its name."""
    fmt = _w4(fmt, "quantize_weight")
    _check_weight(B, fmt.name, fmt.group)
    N, K = B.shape
    packed, scales, zeros = [], [], []
    for r0 in range(0, N, _QUANT_ROWS):
        Bg = B[r0:r0 + _QUANT_ROWS].float().reshape(-1, K // fmt.group, fmt.group)
        codes, s, z = _quantize_rows(Bg, fmt)
        packed.append(pack_int4(codes) if fmt.codes == "int4" else pack_codes(codes))
        scales.append(s)
        zeros.append(z)
    ops = {"B": torch.cat(packed), "scales": torch.cat(scales).T.contiguous()}
    if fmt.has_zeros:
        ops["zeros"] = torch.cat(zeros).T.contiguous()
    return ops


def _activation(A: torch.Tensor, B: torch.Tensor, name: str, group: int) -> torch.Tensor:
    """The entry check of a W4A16 format (both operands, K whole groups) and A as bf16: refused where a
    value would round to Inf (A is an input, hashed and reported: clamping it would change the problem)."""
    check_gemm_operands(A, B, name, ACTIVATION, WEIGHT)
    _check_groups(B, name, group)
    return to_bf16(A, name, ACTIVATION).contiguous()


def _quantize(A: torch.Tensor, B: torch.Tensor, fmt: W4Format) -> Operands:
    return {"A": _activation(A, B, fmt.name, fmt.group), **quantize_weight(B, fmt)}


def _per_element(t: torch.Tensor, group: int) -> torch.Tensor:
    """Group-major (K/g, N) -> per element (N, K)."""
    return expand_blocks(t.T, 1, group, t.shape[1], t.shape[0] * group)


def _weight_keys(fmt: W4Format) -> tuple[str, ...]:
    return ("B", "scales", "zeros") if fmt.has_zeros else ("B", "scales")


def weight_values(ops: Operands, fmt: W4Format, who: str = "weight_values") -> torch.Tensor:
    """The small exact value each code stands for before scaling (float32, (N, K)): q, c - z or e2m1.
    ``fmt``: a W4Format or its name; ``who`` names the caller in errors."""
    fmt = _w4(fmt, who)
    B = format_operands(ops, _weight_keys(fmt), who)[0]
    if fmt.codes == "int4":
        return unpack_int4(B).float()
    codes = unpack_codes(B)
    if fmt.codes == "uint4_zp":
        return codes.float() - _per_element(ops["zeros"], fmt.group).float()
    return e2m1_decode(codes)


def weight_scales(ops: Operands, fmt: W4Format, who: str = "weight_scales") -> torch.Tensor:
    """Per-element scales (N, K) float32 (bf16 and power-of-two scales are exact in float32)."""
    fmt = _w4(fmt, who)
    s = format_operands(ops, ("scales",), who)[0]
    s = e8m0_decode(s) if fmt.scale == "e8m0" else s.float()
    return _per_element(s, fmt.group)


def dequantize_weight(ops: Operands, fmt: W4Format, who: str = "dequantize_weight") -> torch.Tensor:
    """Exact real weight value·scale in float64, (N, K)."""
    return weight_values(ops, fmt, who).double() * weight_scales(ops, fmt, who).double()


def decode_weight_bf16(ops: Operands, fmt: W4Format, who: str = "decode_weight_bf16") -> torch.Tensor:
    """The bf16 weight the kernel multiplies: bf16_rn(value · scale), one rounding.

    value·scale has at most 4 + 8 significant bits, so the float32 product is exact and the single
    float32 -> bf16 rounding equals the kernel's fma.rn.bf16x2. Device-agnostic (used on the GPU by
    the torch baselines).
    """
    return (weight_values(ops, fmt, who) * weight_scales(ops, fmt, who)).to(torch.bfloat16)


def _dequantize(ops: Operands, fmt: W4Format) -> tuple[torch.Tensor, torch.Tensor]:
    who = f"format {fmt.name}'s dequantize"
    A = format_operands(ops, ("A",) + _weight_keys(fmt), who)[0]
    return A.double(), dequantize_weight(ops, fmt, who)


def _register_w4(fmt: W4Format) -> W4Format:
    register_format(Format(
        name=fmt.name, quantize=partial(_quantize, fmt=fmt), dequantize=partial(_dequantize, fmt=fmt),
        reads=("A",) + _weight_keys(fmt), description=f"A bf16; weight {fmt.description}",
    ))
    return fmt


# ---------------------------------------------------------------------------------------------
# tinygemm's format (``torch._weight_int4pack_mm``, bf16 only: the variant tinygemm_w4_g128, launched
# from kernels.peers), as torch defines it: unsigned codes q in [0, 15] per 128 K with a bf16 scale s and
# a bf16 *value* zero z (not an integer code): w = (q - 8)·s + z. Its stored operands are tinygemm's
# inputs before its layout change: the codes packed two per byte, element 2i in the *high* nibble (the
# byte order ``torch._convert_weight_to_int4pack`` takes), and ``scale_and_zero`` (K/128, N, 2) bf16.
TINYGEMM_GROUP = 128
TINYGEMM_FORMAT = "w4_tinygemm_g128"


def quantize_tinygemm_weight(B: torch.Tensor) -> Operands:
    """Asymmetric min/max quantization per 128 K, tinygemm's convention -> {"B", "scale_and_zero"}.

    s = (max - min)/15 (bf16, ``amax_scale``; max - min in float64, as for w4_uint4_zp_g128), z = bf16(min + 8·s)
    the value of code 8, then each weight takes the nearest code of the *stored* s and z:
    q = clamp(round((w - z)/s) + 8, 0, 15)."""
    _check_weight(B, TINYGEMM_FORMAT, TINYGEMM_GROUP)
    N, K = B.shape
    packed, sz = [], []
    for r0 in range(0, N, _QUANT_ROWS):
        Bg = B[r0:r0 + _QUANT_ROWS].float().reshape(-1, K // TINYGEMM_GROUP, TINYGEMM_GROUP)
        lo, hi = Bg.amin(-1), Bg.amax(-1)
        scale = amax_scale(hi.double() - lo.double(), 15, torch.bfloat16)
        zero = (lo + 8 * scale.float()).to(torch.bfloat16)
        q = (torch.round((Bg - zero.float()[..., None]) / scale.float()[..., None]) + 8).clamp(0, 15)
        q = q.reshape(Bg.shape[0], K).to(torch.uint8)
        packed.append((q[:, 0::2] << 4) | q[:, 1::2])
        sz.append(torch.stack([scale, zero], -1))
    return {"B": torch.cat(packed), "scale_and_zero": torch.cat(sz).transpose(0, 1).contiguous()}


def tinygemm_weight(ops: Operands, who: str = "tinygemm_weight") -> torch.Tensor:
    """Exact real weight (q - 8)·s + z in float64, (N, K)."""
    B, scale_and_zero = format_operands(ops, ("B", "scale_and_zero"), who)
    if B.dtype != torch.uint8:
        raise OperandTypeError(f"{who}: B must hold tinygemm's packed uint8 codes, got {B.dtype}")
    q = torch.stack([B >> 4, B & 15], -1).reshape(B.shape[0], -1).double()  # element 2i is the high nibble
    s, z = (_per_element(scale_and_zero[..., i], TINYGEMM_GROUP).double() for i in (0, 1))
    return (q - 8) * s + z


def _quantize_tinygemm(A: torch.Tensor, B: torch.Tensor) -> Operands:
    return {"A": _activation(A, B, TINYGEMM_FORMAT, TINYGEMM_GROUP), **quantize_tinygemm_weight(B)}


def _dequantize_tinygemm(ops: Operands) -> tuple[torch.Tensor, torch.Tensor]:
    who = f"format {TINYGEMM_FORMAT}'s dequantize"
    A = format_operands(ops, ("A", "B", "scale_and_zero"), who)[0]
    return A.double(), tinygemm_weight(ops, who)


register_format(Format(
    name=TINYGEMM_FORMAT, quantize=_quantize_tinygemm, dequantize=_dequantize_tinygemm,
    reads=("A", "B", "scale_and_zero"),
    description="A bf16; weight as tinygemm defines it: uint4 codes q (element 2i in the high nibble), bf16 scale "
    "(max-min)/15 and bf16 zero value per 128 K, w = (q - 8)·s + z; scale_and_zero (K/128, N, 2)",
))

# each registered here; kernels.dequant registers each one's two variants
W4_INT4_SYM_G128 = _register_w4(W4Format(
    "w4_int4_sym_g128", "int4", "bfloat16", 128, 0,
    "int4 q in [-8,7] packed two per byte along K; bf16 scale amax/7 per 128 K, shape (K/128, N)"))
W4_UINT4_ZP_G128 = _register_w4(W4Format(
    "w4_uint4_zp_g128", "uint4_zp", "bfloat16", 128, 1,
    "uint4 codes with bf16 scale (max-min)/15 and bf16 integer zero point per 128 K, value (c - z)·s; scales and zeros (K/128, N)"))
W4_E2M1_G32 = _register_w4(W4Format(
    "w4_e2m1_g32", "e2m1", "bfloat16", 32, 2,
    "fp4 e2m1 codes packed two per byte along K; bf16 scale amax/6 per 32 K, shape (K/32, N)"))
W4_MXFP4 = _register_w4(W4Format(
    "w4_mxfp4", "e2m1", "e8m0", 32, 3,
    "OCP MX fp4: e2m1 codes, E8M0 scale (uint8, bias 127) per 32 K, shape (K/32, N); exponent floor(log2 amax) - 2, "
    "codes saturate at ±6"))
# name -> W4Format (the format's description names its layout)
W4_FORMATS = {fmt.name: fmt for fmt in (W4_INT4_SYM_G128, W4_UINT4_ZP_G128, W4_E2M1_G32, W4_MXFP4)}


# ---------------------------------------------------------------------------------------------
# humming's int4 format (humming-kernels' HummingLayer with weight_config {"dtype": "int4", "group_size": 128}:
# the variant humming_w4_int4_g128, launched from kernels.peers): the very codes and bf16 scales of
# w4_int4_sym_g128, so that both GEMMs multiply the same weights, stored as HummingLayer.load_from_tensors
# takes them before its transform() (which changes the layout on the GPU, in the prepare):
# - "B" (humming's "weight"): the offset-binary codes q + 8 packed eight per int32 along K, element 8j + t at
#   bits [4t, 4t + 4) of word j (humming's pack_weight), int32 (N, K/8);
# - "scales" (humming's "weight_scale"): bf16 (N, K/128), row-major (the shape its load checks).
# humming decodes code c as (c - 8)·s, the value w4_int4_sym_g128 gives q·s.
HUMMING_FORMAT = "w4_humming_int4_g128"
HUMMING_GROUP = W4_INT4_SYM_G128.group


def _flip_code_bias(packed: torch.Tensor) -> torch.Tensor:
    """The bytes of two packed codes with each nibble's top bit flipped: two's complement q <-> offset-binary
    q + 8 (-8 = 1000b <-> 0000b, 7 = 0111b <-> 1111b); its own inverse."""
    return packed.contiguous().view(torch.uint8) ^ 0x88


def humming_words(packed: torch.Tensor) -> torch.Tensor:
    """w4_int4_sym_g128's packed weight (int8 (N, K/2): q in two's complement, element 2i in the low nibble)
    as humming's words of the codes q + 8 (int32 (N, K/8)). Exact."""
    # the nibble order is already humming's: byte b of a little-endian word holds elements 2b (low nibble)
    # and 2b + 1, so element 8j + t sits at bits [4t, 4t + 4) of word j
    return _flip_code_bias(packed).view(torch.int32)


def humming_as_int4_sym(ops: Operands, who: str = "humming_as_int4_sym") -> Operands:
    """The operands of w4_int4_sym_g128 holding the same activation, codes and scales: what the shared decode
    (``decode_weight_bf16``, ``dequantize_weight``) and the W4A16 emulation read. ``who`` names the caller in errors."""
    A, B, scales = format_operands(ops, ("A", "B", "scales"), who)
    if B.dtype != torch.int32 or B.ndim != 2:
        raise OperandTypeError(f"{who}: B must hold humming's int32 words of eight 4-bit codes, shape (N, K/8), "
                               f"got {B.dtype} of shape {tuple(B.shape)}")
    return {"A": A, "B": _flip_code_bias(B).view(torch.int8), "scales": scales.T.contiguous()}


def _quantize_humming(A: torch.Tensor, B: torch.Tensor) -> Operands:
    A_bf16 = _activation(A, B, HUMMING_FORMAT, HUMMING_GROUP)  # refused under this format's name
    int4 = quantize_weight(B, W4_INT4_SYM_G128)  # the same codes and scales, by construction
    return {"A": A_bf16, "B": humming_words(int4["B"]), "scales": int4["scales"].T.contiguous()}


def _dequantize_humming(ops: Operands) -> tuple[torch.Tensor, torch.Tensor]:
    who = f"format {HUMMING_FORMAT}'s dequantize"
    int4 = humming_as_int4_sym(ops, who)
    return int4["A"].double(), dequantize_weight(int4, W4_INT4_SYM_G128, who)


register_format(Format(
    name=HUMMING_FORMAT, quantize=_quantize_humming, dequantize=_dequantize_humming, reads=("A", "B", "scales"),
    description="A bf16; weight as humming-kernels loads it: the codes and bf16 scales of w4_int4_sym_g128, codes "
    "q + 8 packed eight per int32 along K (element 8j + t at bits 4t of word j), (N, K/8); scales (N, K/128)",
))
