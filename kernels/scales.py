"""The scale rules every quantizer shares: operand checks, amax -> scale, and the OCP MX shared exponent.

- ``check_operand``: a quantizer's input must be a non-empty, finite floating-point tensor; the error
  names the quantizer, the operand (A or B) and, for an empty tensor, its shape.
- ``amax_scale``: scale = amax / qmax rounded to the scale's storage dtype, never below that dtype's
  smallest normal (``torch.finfo(dtype).tiny``; bf16 and fp32 share it, 2^-126). Without that floor a
  subnormal amax (e.g. 1e-45 / 448) underflows to a zero scale and x / scale gives NaN (0/0) or Inf
  codes. With it, values below qmax · tiny are quantized against the scale tiny, so they come back
  within tiny/2 (integer codes) or less (fp8 codes) of the input. An all-zero tensor or block gets
  scale 1 (every scale quantizes it to zeros; 1 keeps it finite). For every amax with amax/qmax >= tiny
  (any ordinary input) the scale is amax / qmax rounded to dtype, exactly as before the floor.
- ``mx_exponent``: OCP MX v1.0 shared exponent ⌊log2 amax⌋ − emax_elem, clamped to the range the
  scale is stored (E8M0: [-127, 127]) or decoded in (a bf16 decode: >= -126, its smallest normal).
"""
from __future__ import annotations

import torch

E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT = -127, 127


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
