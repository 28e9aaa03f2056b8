"""Every number format's building blocks, written once; each family module imports them from here.

Each family's formats (quantize, dequantize, their registration) live in ``kernels/<family>_formats.py``,
which imports no kernel: an inputs job's code inputs are the import closure of its formats' modules
(harness/deps.py), so a kernel's or a peer's change does not rebuild the inputs.

- Operands and scales. ``check_operand``: a quantizer's input must be a non-empty, finite floating-point
  tensor; the error names the quantizer, the operand (A or B) and, for an empty tensor, its shape.
  ``check_gemm_operands``: the one entry check of every format's ``quantize(A, B)`` (both operands 2-D,
  A (M, K) and B (N, K) sharing K, each as ``check_operand``), ``format_operands``: a format's
  ``dequantize`` or a variant's ``emulate`` taking the tensors it needs from the operands dict (the error
  names the missing key and the caller), ``to_bf16``: an operand rounded to bf16, refused where that
  gives Inf. ``check_gemm_shape``: a kernel factory's M, N, K, each a positive integer.
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
- Errors: ValueError throughout; a wrong type or dtype is ``OperandTypeError`` (a TypeError and a
  ValueError), a missing operand ``MissingOperand`` (a KeyError and a ValueError).
- Blocks. ``block_view`` (an (R, C) operand zero-padded to whole blocks, one block per (i, :, j, :)),
  ``expand_blocks`` (per-block values repeated to one per element).
- E8M0 (OCP MX scales, bias 127, 255 NaN). ``e8m0_encode``, ``e8m0_decode``, ``pack_e8m0_words``
  (four codes per 32-bit word).
- 4-bit codes. ``pack_int4`` / ``unpack_int4`` (int4 values two per byte along the last dim, element
  2i in the low nibble), ``pack_codes`` / ``unpack_codes`` (unsigned codes, the same order),
  ``e2m1_encode`` / ``e2m1_decode`` (fp4 e2m1).
"""
import math
import numbers
from collections.abc import Callable, Mapping

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

class OperandTypeError(TypeError, ValueError):
    """A wrong type or dtype. A TypeError by kind, and a ValueError so that one ``except ValueError``
    catches every refused operand."""


class MissingOperand(KeyError, ValueError):
    """An operands dict without a tensor its reader needs; a KeyError for callers that test keys."""

    def __str__(self) -> str:  # KeyError's own str() would show the message as a quoted repr
        return str(self.args[0]) if self.args else ""


def _first_bad(x: torch.Tensor, bad: torch.Tensor) -> str:
    """'<value> at index (i, j) (n of m entries)': the first entry of ``x`` where ``bad`` holds."""
    idx = tuple(int(i) for i in torch.nonzero(bad)[0])
    n = int(bad.sum())
    v = x[idx].item()
    return (f"{v:.8g}" if isinstance(v, float) else repr(v)) + f" at index {idx}" + (f" ({n} of {x.numel()} entries)" if n > 1 else "")


def _wide(x: torch.Tensor) -> torch.Tensor:
    # torch has no isfinite, isnan or round for the fp8 dtypes; their float32 values say the same
    return x if x.element_size() > 1 else x.float()


def _finite_mask(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(_wide(x))


def check_operand(x: torch.Tensor, who: str, operand: str | None = None, ndim: int | None = None) -> None:
    """Raise unless ``x`` is a non-empty floating-point tensor of finite values (and ``ndim``-D if given).

    OperandTypeError (a TypeError and a ValueError) for a non-tensor or a non-floating tensor; ValueError
    for the wrong number of dims, an empty tensor ("... empty tensor has no scale") or one holding NaN/Inf.
    ``who`` names the quantizer (or format), ``operand`` (e.g. "A", "B") the GEMM operand.
    """
    what = f"operand {operand}" if operand else "the input"
    if not isinstance(x, torch.Tensor):
        raise OperandTypeError(f"{who} expects a floating-point tensor for {what}, got {type(x).__name__}; "
                               "pass a torch.Tensor (e.g. float32)")
    if not x.is_floating_point():
        raise OperandTypeError(f"{who} expects a floating-point tensor for {what}, got {x.dtype}; "
                               "pass the unquantized values (e.g. .float())")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{who}: {what} must be {ndim}-D, got shape {tuple(x.shape)}"
                         + ("; A is (M, K) and B is (N, K)" if ndim == 2 else ""))
    if x.numel() == 0:
        raise ValueError(f"{who}: {what} is an empty tensor of shape {tuple(x.shape)}; an empty tensor has no scale")
    finite = _finite_mask(x)
    if not bool(finite.all()):
        raise ValueError(f"{who}: {what} contains NaN or Inf: {_first_bad(x, ~finite)}")


def check_gemm_operands(A: torch.Tensor, B: torch.Tensor, who: str, a: str = "A", b: str = "B") -> None:
    """The entry check of every format's ``quantize(A, B)``: A (M, K) and B (N, K), 2-D, sharing K, each
    non-empty, floating-point and finite (``check_operand``). ``who`` is the format's name; ``a`` and
    ``b`` name the operands in the messages (e.g. "B (the weight)")."""
    check_operand(A, who, a, ndim=2)
    check_operand(B, who, b, ndim=2)
    if A.shape[1] != B.shape[1]:
        raise ValueError(f"{who}: operands {a} {tuple(A.shape)} and {b} {tuple(B.shape)} do not share K: "
                         f"A is (M, K) and B is (N, K) (C = A·Bᵀ), so {b} needs {A.shape[1]} columns, not {B.shape[1]}")


def format_operands(ops: Mapping[str, torch.Tensor], keys: tuple[str, ...], who: str) -> tuple[torch.Tensor, ...]:
    """The tensors ``keys`` of an operands dict, for ``who`` (a format's dequantize, a variant's emulate).

    OperandTypeError unless ``ops`` is a dict of tensors; MissingOperand naming the missing keys, what
    the dict holds and ``who``."""
    if not isinstance(ops, Mapping):
        raise OperandTypeError(f"{who} takes the dict of operands its format's quantize(A, B) returns, "
                               f"got {type(ops).__name__}")
    missing = [k for k in keys if k not in ops]
    if missing:
        raise MissingOperand(f"{who} needs operand {', '.join(map(repr, missing))}, which the dict lacks (it holds "
                             f"{', '.join(map(repr, sorted(ops))) or 'nothing'}); pass the dict its format's "
                             "quantize(A, B) returns")
    for k in keys:
        if not isinstance(ops[k], torch.Tensor):
            raise OperandTypeError(f"{who}: operand {k!r} must be a torch.Tensor, got {type(ops[k]).__name__}")
    return tuple(ops[k] for k in keys)


BF16_MAX = torch.finfo(torch.bfloat16).max


def to_bf16(x: torch.Tensor, who: str, operand: str) -> torch.Tensor:
    """``x`` (finite, e.g. checked by ``check_operand``) rounded to bf16; ValueError naming ``who``, the
    operand and the value where a value beyond bf16's range would be stored as Inf.

    Refused, not saturated: this is an input format, and a silently clamped activation would be an
    input other than the one hashed and reported; the caller can scale its data."""
    y = x.to(torch.bfloat16)
    inf = torch.isinf(y)
    if bool(inf.any()):
        raise ValueError(f"{who}: operand {operand} holds {_first_bad(x, inf)}, beyond bf16's largest finite "
                         f"value {BF16_MAX:.6g}: stored as bf16 it would be Inf; scale the operand into range")
    return y


def check_gemm_shape(who: str, M: int, N: int, K: int) -> None:
    """A kernel factory's problem size: M, N and K each a positive integer (ValueError naming the dimension)."""
    for dim, value, what in (("M", M, "rows of A and C"), ("N", N, "rows of B, columns of C"), ("K", K, "the reduction")):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{who}: {dim} ({what}) must be a positive integer, got {value!r} ({type(value).__name__})")
        if value <= 0:
            raise ValueError(f"{who}: {dim} ({what}) must be a positive integer, got {value}")


def _as_tensor(x, who: str, arg: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return torch.tensor(float(x))
    raise OperandTypeError(f"{who}: {arg} must be a torch.Tensor (or a number), got {type(x).__name__}")


def _check_amax(amax: torch.Tensor, who: str) -> torch.Tensor:
    """``amax`` (a tensor of absolute maxima) as float32 or float64 (float64 stays: it may exceed fp32);
    ValueError naming ``who`` and the value unless every entry is finite and >= 0."""
    if amax.dtype == torch.bool or amax.is_complex():
        raise OperandTypeError(f"{who}: amax must be a real tensor, got {amax.dtype}")
    a = amax if amax.dtype == torch.float64 else amax.float()
    bad = ~(torch.isfinite(a) & (a >= 0))
    if bool(bad.any()):
        raise ValueError(f"{who}: amax must be finite and >= 0 (an absolute maximum), got {_first_bad(a, bad)}")
    return a


def _check_positive(value, who: str, arg: str) -> None:
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (number or isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype == torch.bool):
        raise OperandTypeError(f"{who}: {arg} must be a positive finite number, got {type(value).__name__}")
    if not (math.isfinite(float(value)) and float(value) > 0):
        raise ValueError(f"{who}: {arg} must be a positive finite number, got {value}")


def amax_scale(amax: torch.Tensor, qmax: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Scale(s) mapping ``amax`` (any shape, >= 0, finite) onto ``qmax``, stored as ``dtype``.

    amax / qmax (computed in fp32) rounded to ``dtype`` and raised to at least ``torch.finfo(dtype).tiny``,
    so the scale is a normal number and never zero; exactly 1 where amax == 0. A float64 ``amax`` beyond
    fp32's range (a range max - min of two huge values) is divided in float64 there. ValueError for a
    NaN, infinite or negative amax.
    """
    _check_positive(qmax, "amax_scale", "qmax")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise OperandTypeError(f"amax_scale: dtype must be a floating-point torch.dtype (the scale's storage), got {dtype!r}")
    amax = _check_amax(_as_tensor(amax, "amax_scale", "amax"), "amax_scale")
    a32 = amax.float()
    scale = a32 / qmax
    if amax.dtype == torch.float64:  # only where fp32 overflowed: elsewhere the fp32 division, bit for bit
        scale = torch.where(torch.isinf(a32), (amax / qmax).float(), scale)
    scale = scale.to(dtype).clamp_min(torch.finfo(dtype).tiny)
    return torch.where(a32 > 0, scale, torch.ones_like(scale))


def mx_exponent(
    amax: torch.Tensor, emax_elem: int, min_exponent: int = E8M0_MIN_EXPONENT, max_exponent: int = E8M0_MAX_EXPONENT,
) -> torch.Tensor:
    """OCP MX v1.0 scale exponent: ⌊log2 amax⌋ − emax_elem, clamped to [min_exponent, max_exponent]; 0
    (scale 1) where amax == 0. int32, the shape of ``amax``.

    ⌊log2⌋ comes from frexp (amax = m·2^e, m in [0.5, 1)), exact where a float log2 could round up just
    below a power of two. A tiny amax is clamped to ``min_exponent``: the scale never leaves the range it
    is stored or decoded in, and its codes (x / 2^exponent, exact) stay finite. ValueError for a NaN,
    infinite or negative amax (frexp would give a meaningless exponent).
    """
    if min_exponent > max_exponent:
        raise ValueError(f"mx_exponent: min_exponent={min_exponent} is above max_exponent={max_exponent}")
    amax = _check_amax(_as_tensor(amax, "mx_exponent", "amax"), "mx_exponent")
    _, e = torch.frexp(amax)  # float32, or float64 as given (exact either way)
    exponent = (e.to(torch.int32) - 1) - emax_elem
    exponent = torch.where(amax > 0, exponent, torch.zeros_like(exponent))
    return exponent.clamp(min_exponent, max_exponent)


# ---- element encoders ----------------------------------------------------------------------------

def saturate_fp8(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` cast to the fp8 ``dtype`` (round to nearest even) after clamping to ±its largest finite value:
    torch's fp8 casts need not saturate (out of range, e5m2 gives Inf; e4m3fn NaN on some builds)."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise OperandTypeError(f"saturate_fp8: dtype must be a floating-point torch.dtype (e.g. torch.float8_e4m3fn), got {dtype!r}")
    x = _as_tensor(x, "saturate_fp8", "x")
    fmax = torch.finfo(dtype).max
    return x.clamp(-fmax, fmax).to(dtype)


def _check_no_nan(x: torch.Tensor, who: str) -> torch.Tensor:
    # a NaN has no nearest code: an encoder would give 0 or ±max for it silently
    x = _as_tensor(x, who, "x")
    if x.is_floating_point():
        nan = torch.isnan(_wide(x))
        if bool(nan.any()):
            raise ValueError(f"{who}: x holds NaN, which has no code: {_first_bad(x, nan)}")
    elif x.dtype == torch.bool or x.is_complex():
        raise OperandTypeError(f"{who}: x must be a real tensor, got {x.dtype}")
    return x


def encode_int4(x: torch.Tensor) -> torch.Tensor:
    """int4 codes as int8: round to nearest (ties to even, torch.round), clamped to [-8, 7]; NaN refused."""
    x = _check_no_nan(x, "encode_int4")
    return torch.round(x).clamp(INT4_MIN, INT4_MAX).to(torch.int8)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e2m1 value (ties to even code), saturating at ±6; returns uint8 codes.

    The sign is taken from the sign bit, so -0.0 and tiny negatives give code 8 (-0.0). ±Inf saturates
    like any value beyond ±6; NaN is refused (it has no nearest value).
    """
    x = _check_no_nan(x, "e2m1_encode")
    a = x.abs().float()
    # the magnitude's code: how many midpoints lie strictly below it, plus one where it ties a midpoint with an
    # odd number below (the lower code odd: the tie goes up to the even one). Counted in bytes, one comparison
    # per midpoint: the input builds of the W4 formats spent most of their time here in int64 index arithmetic
    code = torch.zeros(a.shape, dtype=torch.uint8, device=x.device)
    for below, mid in enumerate(E2M1_MIDPOINTS):
        code += a > mid
        if below % 2 == 1:
            code += a == mid
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Codes (any integer dtype, 0..15) -> float32 values by table lookup."""
    _check_codes(codes, "e2m1_decode", 15)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def _refuse_fractions(t: torch.Tensor, what: str) -> None:
    """A floating tensor standing for integers: a fraction, NaN or Inf is refused, never truncated."""
    if t.is_floating_point():
        f = _wide(t)
        fractional = ~torch.isfinite(f) | (f != torch.round(f))
        if bool(fractional.any()):
            raise ValueError(f"{what}, got {_first_bad(t, fractional)}")


def _check_codes(codes: torch.Tensor, who: str, top: int) -> None:
    """Integer codes in [0, top] (a floating tensor of integral values too): a fraction would be truncated,
    an out-of-range code wrap into another nibble or index past a table."""
    if not isinstance(codes, torch.Tensor):
        raise OperandTypeError(f"{who} expects a torch.Tensor of integer codes, got {type(codes).__name__}")
    if codes.is_complex() or codes.dtype == torch.bool:
        raise OperandTypeError(f"{who} expects integer codes (e.g. torch.uint8), got {codes.dtype}")
    _refuse_fractions(codes, f"{who}: codes must be integers")
    bad = (codes < 0) | (codes > top)
    if bool(bad.any()):
        raise ValueError(f"{who}: codes must lie in [0, {top}], got {_first_bad(codes, bad)}")


# ---- blocks and quantizers -----------------------------------------------------------------------

def _check_count(value, who: str, arg: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{who}: {arg} must be a positive integer, got {value!r}")


def ceil_div(a: int, b: int) -> int:
    _check_count(b, "ceil_div", "b (the divisor: a block or group size)")
    return -(-a // b)


def _check_2d(x: torch.Tensor, who: str, arg: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise OperandTypeError(f"{who}: {arg} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{who}: {arg} must be 2-D (rows, columns), got shape {tuple(x.shape)}")


def _check_block_dims(blocks: torch.Tensor, dims: tuple[int, ...], who: str) -> None:
    if not isinstance(blocks, torch.Tensor) or not blocks.is_floating_point():
        raise OperandTypeError(f"{who}: blocks must be a floating-point tensor, got "
                               f"{getattr(blocks, 'dtype', type(blocks).__name__)}")
    if any(not -blocks.ndim <= d < blocks.ndim for d in dims):
        raise ValueError(f"{who}: blocks of shape {tuple(blocks.shape)} have no dims {dims}; pass block_view's "
                         "4-D (R/rows, rows, C/cols, cols) view, or the dims that hold one block")


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def block_view(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """x (R, C) as float32, zero-padded to whole blocks, viewed as (R/rows, rows, C/cols, cols)."""
    _check_2d(x, "block_view", "x")
    _check_count(rows, "block_view", "rows")
    _check_count(cols, "block_view", "cols")
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
    """Per-block values (⌈R/rows⌉, ⌈C/cols⌉) repeated to one per element of the (R, C) operand
    (extra trailing blocks are cropped; too few is a ValueError)."""
    _check_2d(scales, "expand_blocks", "scales")
    for arg, value in (("rows", rows), ("cols", cols)):
        _check_count(value, "expand_blocks", arg)
    want = (ceil_div(R, rows), ceil_div(C, cols))
    if scales.shape[0] < want[0] or scales.shape[1] < want[1]:  # else a silently smaller operand
        raise ValueError(f"expand_blocks: scales of shape {tuple(scales.shape)} do not cover the ({R}, {C}) operand "
                         f"in {rows}x{cols} blocks: want at least {want}")
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
    _check_block_dims(blocks, dims, "quantize_blocks")
    scales = amax_scale(blocks.abs().amax(dim=dims, keepdim=True), qmax, scale_dtype)
    return encode(blocks / scales.float()), scales


def quantize_tensor(x: torch.Tensor, qmax: float, encode: Encoder) -> tuple[torch.Tensor, torch.Tensor]:
    """One fp32 scale for the whole tensor (``quantize_blocks`` with one block): (codes shaped like x,
    scale of shape (1,))."""
    x = _as_tensor(x, "quantize_tensor", "x")
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
    _check_block_dims(blocks, dims, "quantize_mx_blocks")
    exponent = mx_exponent(blocks.abs().amax(dim=dims, keepdim=True), emax_elem, min_exponent)
    scales = e8m0_encode(exponent)
    return encode(blocks / e8m0_decode(scales)), scales


# ---- E8M0 ----------------------------------------------------------------------------------------

def e8m0_encode(exponent: torch.Tensor) -> torch.Tensor:
    """Integer exponents in [-127, 127] -> uint8 E8M0 codes (bias 127; 255 is NaN and never produced).

    A floating tensor is taken if every value is integral; a fraction (or NaN) is refused, not truncated."""
    exponent = _as_tensor(exponent, "e8m0_encode", "exponent")
    if exponent.dtype == torch.bool or exponent.is_complex():
        raise OperandTypeError(f"e8m0_encode: exponent must be an integer tensor, got {exponent.dtype}")
    _refuse_fractions(exponent, "e8m0_encode: exponent must hold integers")
    out = (exponent < E8M0_MIN_EXPONENT) | (exponent > E8M0_MAX_EXPONENT)
    if bool(out.any()):
        raise ValueError(f"e8m0_encode: exponents must lie in [{E8M0_MIN_EXPONENT}, {E8M0_MAX_EXPONENT}], "
                         f"got {_first_bad(exponent, out)}")
    return (exponent.to(torch.int32) + E8M0_BIAS).to(torch.uint8)


def e8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 codes -> float32 2^(code-127), built from the exponent bits (exact on every device);
    code 0 is the one subnormal, 2^-127; code 255 is NaN."""
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise OperandTypeError(f"e8m0_decode: E8M0 codes must be uint8, got {getattr(codes, 'dtype', type(codes).__name__)}")
    e32 = codes.to(torch.int32)
    s = (e32 << 23).view(torch.float32)
    s = torch.where(e32 == 0, torch.full_like(s, 2.0**-127), s)
    return torch.where(e32 == E8M0_NAN, torch.full_like(s, float("nan")), s)


def pack_e8m0_words(codes: torch.Tensor) -> torch.Tensor:
    """(R, nblk) uint8 codes -> (R, ⌈nblk/4⌉) int32 words, code of K block 4w+j in byte j (little end).

    Missing trailing blocks are padded with code 127 (scale 1). int32 holds the bit pattern: torch has
    little uint32 support, and TileLang only moves the words.
    """
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise OperandTypeError(f"pack_e8m0_words: codes must be uint8 E8M0 codes, got {getattr(codes, 'dtype', type(codes).__name__)}")
    _check_2d(codes, "pack_e8m0_words", "codes")
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
        raise OperandTypeError(f"{who} expects a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int8:
        raise OperandTypeError(f"{who} expects {holding} stored as torch.int8, got {t.dtype}")
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
    _check_codes(codes, "pack_codes", 15)
    c = codes.to(torch.int16)
    return pack_int4(torch.where(c >= 8, c - 16, c).to(torch.int8))  # same low 4 bits


def unpack_codes(p: torch.Tensor) -> torch.Tensor:
    """Unsigned 4-bit codes (int16, 0..15) of a packed tensor (int8, ``pack_codes``'s output)."""
    return unpack_int4(p).to(torch.int16) & 0x0F
