"""Every number format's building blocks, written once; each family module imports them from here.

- Operands and scales. ``check_operand``: a quantizer's input must be a non-empty, finite floating-point
  tensor; the error names the quantizer, the operand (A or B) and, for an empty tensor, its shape.
  ``amax_scale``: scale = amax / qmax rounded to the scale's storage dtype, never below that dtype's
  smallest normal (``torch.finfo(dtype).tiny``; bf16 and fp32 share it, 2^-126). Without that floor a
  subnormal amax (e.g. 1e-45 / 448) underflows to a zero scale and x / scale gives NaN (0/0) or Inf
  codes. With it, values below qmax · tiny are quantized against the scale tiny, so they come back
  within tiny/2 (integer codes) or less (fp8 codes) of the input. An all-zero tensor or block gets
  scale 1 (every scale quantizes it to zeros; 1 keeps it finite). For every amax with amax/qmax >= tiny
  (any ordinary input) the scale is amax / qmax rounded to dtype.
  ``mx_exponent``: the OCP MX v1.0 shared exponent ⌊log2 amax⌋ − emax_elem, clamped to the range the
  scale is stored in (E8M0: ``E8M0_MIN_EXPONENT``..``E8M0_MAX_EXPONENT``, [-127, 127]) or decoded in (a
  kernel decoding to bf16: ``BF16_DECODE_MIN_EXPONENT``, -126, its smallest normal).
- Quantizers. ``quantize_blocks``: the amax rule per block (scale = ``amax_scale(amax, qmax, dtype)``,
  codes = encode(x / scale)); ``quantize_tensor`` is its one-block case (one fp32 scale per tensor);
  ``quantize_mx_blocks``: the OCP MX rule per block (E8M0 scale 2^``mx_exponent``, codes =
  encode(x / scale), an exact division). Element encoders: ``saturate_fp8`` (fp8, clamped to ±max
  before the cast: torch's fp8 casts need not saturate), ``encode_int4`` (round to nearest even,
  clamp to [-8, 7]), ``e2m1_encode``.
- Blocks. ``block_view`` (an (R, C) operand zero-padded to whole blocks, one block per (i, :, j, :)),
  ``expand_blocks`` (per-block values repeated to one per element).
- E8M0 (OCP MX scales, bias 127, 255 NaN). ``e8m0_encode``, ``e8m0_decode``, ``pack_e8m0_words``
  (four codes per 32-bit word).
- 4-bit codes. ``pack_int4`` / ``unpack_int4`` (int4 values two per byte along the last dim, element
  2i in the low nibble), ``pack_codes`` / ``unpack_codes`` (unsigned codes, the same order),
  ``e2m1_encode`` / ``e2m1_decode`` (fp4 e2m1).
"""
from collections.abc import Callable

import torch

Encoder = Callable[[torch.Tensor], torch.Tensor]

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
E4M3_MAX, E5M2_MAX = 448.0, 57344.0  # torch.finfo(...).max
E4M3_EMAX = 8  # exponent of the largest e4m3 normal (448 = 1.75 * 2^8), the OCP MX "emax_elem"
INT4_MIN, INT4_MAX = -8, 7
E8M0_BIAS = 127
E8M0_NAN = 255
E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT = -127, 127  # what an E8M0 code holds (code 0 is 2^-127)
# a kernel that decodes an E8M0 scale to bf16 bits: 2^-126, bf16's smallest normal, is its smallest scale
BF16_DECODE_MIN_EXPONENT = -126
E8M0_CODES_PER_WORD = 4  # E8M0 codes packed per 32-bit word, byte j = K block 4w + j
BLOCK_DIMS = (1, 3)  # the dims of one block in block_view's (R/rows, rows, C/cols, cols)

# e2m1 (fp4, 1 sign, 2 exponent bits with bias 1, 1 mantissa bit): code -> value. Code 0 is +0.0,
# code 1 is the subnormal 0.5 (the formula 2^(e-1)·(1+m/2) is wrong for e = 0).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E2M1_MAX = 6.0
E2M1_EMAX = 2  # exponent of the largest e2m1 normal (6 = 1.5·2^2), OCP MX's emax_elem
# rounding boundaries between consecutive e2m1 magnitudes; ties go to the even code
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


# ---- operands and scales -------------------------------------------------------------------------

def check_operand(x: torch.Tensor, who: str, operand: str | None = None) -> None:
    """Raise unless ``x`` is a non-empty floating-point tensor of finite values.

    TypeError for a non-floating tensor; ValueError for an empty one ("... empty tensor has no scale")
    or one holding NaN/Inf. ``who`` names the quantizer, ``operand`` (e.g. "A", "B") the GEMM operand.
    """
    what = f"operand {operand}" if operand else "the input"
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{who} expects a floating-point tensor for {what}, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.numel() == 0:
        raise ValueError(f"{who}: {what} is an empty tensor of shape {tuple(x.shape)}; an empty tensor has no scale")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{who}: {what} contains NaN or Inf")


def amax_scale(amax: torch.Tensor, qmax: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Scale(s) mapping ``amax`` (any shape, >= 0, finite) onto ``qmax``, stored as ``dtype``.

    amax / qmax (computed in fp32) rounded to ``dtype`` and raised to at least ``torch.finfo(dtype).tiny``,
    so the scale is a normal number and never zero; exactly 1 where amax == 0.
    """
    if not qmax > 0:
        raise ValueError(f"amax_scale: qmax must be positive, got {qmax}")
    amax = amax.float()
    scale = (amax / qmax).to(dtype).clamp_min(torch.finfo(dtype).tiny)
    return torch.where(amax > 0, scale, torch.ones_like(scale))


def mx_exponent(
    amax: torch.Tensor, emax_elem: int, min_exponent: int = E8M0_MIN_EXPONENT, max_exponent: int = E8M0_MAX_EXPONENT,
) -> torch.Tensor:
    """OCP MX v1.0 scale exponent: ⌊log2 amax⌋ − emax_elem, clamped to [min_exponent, max_exponent]; 0
    (scale 1) where amax == 0. int32, the shape of ``amax``.

    ⌊log2⌋ comes from frexp (amax = m·2^e, m in [0.5, 1)), exact where a float log2 could round up just
    below a power of two. A tiny amax is clamped to ``min_exponent``: the scale never leaves the range it
    is stored or decoded in, and its codes (x / 2^exponent, exact) stay finite.
    """
    _, e = torch.frexp(amax.float())
    exponent = (e.to(torch.int32) - 1) - emax_elem
    exponent = torch.where(amax > 0, exponent, torch.zeros_like(exponent))
    return exponent.clamp(min_exponent, max_exponent)


# ---- element encoders ----------------------------------------------------------------------------

def saturate_fp8(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` cast to the fp8 ``dtype`` (round to nearest even) after clamping to ±its largest finite value:
    torch's fp8 casts need not saturate (out of range, e5m2 gives Inf; e4m3fn NaN on some builds)."""
    fmax = torch.finfo(dtype).max
    return x.clamp(-fmax, fmax).to(dtype)


def encode_int4(x: torch.Tensor) -> torch.Tensor:
    """int4 codes as int8: round to nearest (ties to even, torch.round), clamped to [-8, 7]."""
    return torch.round(x).clamp(INT4_MIN, INT4_MAX).to(torch.int8)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e2m1 value (ties to even code), saturating at ±6; returns uint8 codes.

    The sign is taken from the sign bit, so -0.0 and tiny negatives give code 8 (-0.0).
    """
    a = x.abs().float()
    mids = torch.tensor(E2M1_MIDPOINTS, dtype=torch.float32, device=x.device)
    idx = torch.bucketize(a, mids)  # number of midpoints strictly below a: a tie lands on the lower code
    tie = mids[idx.clamp(max=len(E2M1_MIDPOINTS) - 1)] == a
    idx = torch.where(tie & (idx % 2 == 1), idx + 1, idx)
    return (idx + 8 * torch.signbit(x).to(idx.dtype)).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Codes (any integer dtype, 0..15) -> float32 values by table lookup."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


# ---- blocks and quantizers -----------------------------------------------------------------------

def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def block_view(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """x (R, C) as float32, zero-padded to whole blocks, viewed as (R/rows, rows, C/cols, cols)."""
    R, C = x.shape
    Rp, Cp = round_up(R, rows), round_up(C, cols)
    xp = x.float()
    if (Rp, Cp) != (R, C):
        xp = torch.zeros(Rp, Cp, dtype=torch.float32, device=x.device)
        xp[:R, :C] = x
    return xp.reshape(Rp // rows, rows, Cp // cols, cols)


def unblock(codes: torch.Tensor, R: int, C: int) -> torch.Tensor:
    """``block_view``'s inverse for codes: (R/rows, rows, C/cols, cols) -> the contiguous (R, C) operand."""
    return codes.reshape(codes.shape[0] * codes.shape[1], -1)[:R, :C].contiguous()


def expand_blocks(scales: torch.Tensor, rows: int, cols: int, R: int, C: int) -> torch.Tensor:
    """Per-block values (⌈R/rows⌉, ⌈C/cols⌉) repeated to one per element of the (R, C) operand."""
    if rows != 1:
        scales = scales.repeat_interleave(rows, dim=0)
    if cols != 1:
        scales = scales.repeat_interleave(cols, dim=1)
    return scales[:R, :C]


def quantize_blocks(
    blocks: torch.Tensor, qmax: float, scale_dtype: torch.dtype, encode: Encoder, dims: tuple[int, ...] = BLOCK_DIMS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The amax rule, per block: scale = ``amax_scale(amax, qmax, scale_dtype)``, codes = encode(x / scale).

    ``blocks`` is float32 with one block's elements along ``dims`` (``block_view``'s (1, 3) by default).
    Returns (codes, the shape of ``blocks``; scales as ``scale_dtype``, the shape of ``blocks`` with
    ``dims`` of size 1). The division is in float32 (a bf16 scale is exact there).
    """
    scales = amax_scale(blocks.abs().amax(dim=dims, keepdim=True), qmax, scale_dtype)
    return encode(blocks / scales.float()), scales


def quantize_tensor(x: torch.Tensor, qmax: float, encode: Encoder) -> tuple[torch.Tensor, torch.Tensor]:
    """One fp32 scale for the whole tensor (``quantize_blocks`` with one block): (codes shaped like x,
    scale of shape (1,))."""
    codes, scale = quantize_blocks(x.float(), qmax, torch.float32, encode, dims=tuple(range(x.ndim)))
    return codes, scale.reshape(1)


def quantize_mx_blocks(
    blocks: torch.Tensor, emax_elem: int, encode: Encoder, min_exponent: int = E8M0_MIN_EXPONENT,
    dims: tuple[int, ...] = BLOCK_DIMS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The OCP MX rule, per block: E8M0 scale 2^``mx_exponent``(amax, emax_elem, min_exponent, 127),
    codes = encode(x / scale) (a power of two: the division is exact).

    ``blocks`` and ``dims`` as in ``quantize_blocks``. Returns (codes, E8M0 codes as uint8, the shape of
    ``blocks`` with ``dims`` of size 1).
    """
    exponent = mx_exponent(blocks.abs().amax(dim=dims, keepdim=True), emax_elem, min_exponent)
    scales = e8m0_encode(exponent)
    return encode(blocks / e8m0_decode(scales)), scales


# ---- E8M0 ----------------------------------------------------------------------------------------

def e8m0_encode(exponent: torch.Tensor) -> torch.Tensor:
    """Integer exponents in [-127, 127] -> uint8 E8M0 codes (bias 127; 255 is NaN and never produced)."""
    if bool(((exponent < E8M0_MIN_EXPONENT) | (exponent > E8M0_MAX_EXPONENT)).any()):
        raise ValueError(f"E8M0 exponents must lie in [{E8M0_MIN_EXPONENT}, {E8M0_MAX_EXPONENT}]")
    return (exponent.to(torch.int32) + E8M0_BIAS).to(torch.uint8)


def e8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 codes -> float32 2^(code-127), built from the exponent bits (exact on every device);
    code 0 is the one subnormal, 2^-127; code 255 is NaN."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"E8M0 codes must be uint8, got {codes.dtype}")
    e32 = codes.to(torch.int32)
    s = (e32 << 23).view(torch.float32)
    s = torch.where(e32 == 0, torch.full_like(s, 2.0**-127), s)
    return torch.where(e32 == E8M0_NAN, torch.full_like(s, float("nan")), s)


def pack_e8m0_words(codes: torch.Tensor) -> torch.Tensor:
    """(R, nblk) uint8 codes -> (R, ⌈nblk/4⌉) int32 words, code of K block 4w+j in byte j (little end).

    Missing trailing blocks are padded with code 127 (scale 1). int32 holds the bit pattern: torch has
    little uint32 support, and TileLang only moves the words.
    """
    R, nblk = codes.shape
    padded = torch.full((R, round_up(nblk, E8M0_CODES_PER_WORD)), E8M0_BIAS, dtype=torch.uint8, device=codes.device)
    padded[:, :nblk] = codes
    b = padded.to(torch.int64).view(R, -1, E8M0_CODES_PER_WORD)
    words = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


# ---- 4-bit codes, two per byte -------------------------------------------------------------------

def _check_int8_rows(t: torch.Tensor, who: str, holding: str, verb: str) -> None:
    """``pack_int4``'s and ``unpack_int4``'s input checks: an int8 tensor of at least one dimension."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{who} expects a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int8:
        raise TypeError(f"{who} expects {holding} stored as torch.int8, got {t.dtype}")
    if t.ndim == 0:
        raise ValueError(f"{who} needs at least one dimension to {verb} along; got a 0-dim tensor")


def pack_int4(tensor: torch.Tensor) -> torch.Tensor:
    """Pack logical int4 values (int8 in [-8, 7]) two per byte along the last dim.

    Element 2i goes to the low nibble and 2i+1 to the high nibble of byte i; the result is int8
    of shape (..., K/2).
    """
    _check_int8_rows(tensor, "pack_int4", "logical int4 values", "pack")
    if tensor.shape[-1] % 2:
        raise ValueError(f"pack_int4 needs an even last dimension, got shape {tuple(tensor.shape)}")
    if tensor.numel() and (int(tensor.min()) < INT4_MIN or int(tensor.max()) > INT4_MAX):
        raise ValueError(
            f"pack_int4 values must lie in [{INT4_MIN}, {INT4_MAX}], got range "
            f"[{int(tensor.min())}, {int(tensor.max())}]"
        )
    t16 = tensor.to(torch.int16)
    packed = (t16[..., 0::2] & 0x0F) | ((t16[..., 1::2] & 0x0F) << 4)
    return packed.to(torch.int8).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of ``pack_int4``: int8 (..., K/2) -> int8 (..., K) with sign-extended nibbles."""
    _check_int8_rows(packed, "unpack_int4", "packed bytes", "unpack")
    low = ((packed & 0x0F) ^ 8) - 8  # sign-extend the low nibble
    high = packed >> 4  # arithmetic shift sign-extends the high nibble
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2).contiguous()


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """Pack unsigned 4-bit codes (0..15, any integer dtype) with pack_int4's nibble order."""
    c = codes.to(torch.int16)
    if c.numel() and (int(c.min()) < 0 or int(c.max()) > 15):
        raise ValueError("pack_codes: codes must lie in [0, 15]")
    return pack_int4(torch.where(c >= 8, c - 16, c).to(torch.int8))  # same low 4 bits


def unpack_codes(p: torch.Tensor) -> torch.Tensor:
    """Unsigned 4-bit codes (int16, 0..15) of a packed tensor."""
    return unpack_int4(p).to(torch.int16) & 0x0F
