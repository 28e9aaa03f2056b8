"""fp8 quantizer and emulation against torch's own casts and a float64 reference."""
import ml_dtypes
import numpy as np
import pytest
import torch

from harness.metrics import calc_diff, rel_fro
from kernels.fp8 import emulate_fp8
from kernels.fp8_formats import quantize_fp8
from kernels.registry import get_format


@pytest.mark.parametrize("kind,fmax,np_dtype", [("e4m3", 448.0, ml_dtypes.float8_e4m3fn), ("e5m2", 57344.0, ml_dtypes.float8_e5m2)])
def test_quantize_matches_ml_dtypes_cast(kind, fmax, np_dtype):
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(0)) * 3
    q, scale = quantize_fp8(x, kind)
    assert float(scale) == pytest.approx(float(x.abs().max()) / fmax)
    expected = (x / scale).numpy().astype(np_dtype).astype(np.float32)  # round-to-nearest-even cast
    np.testing.assert_array_equal(q.float().numpy(), expected)
    assert q.float().abs().max() == fmax  # the amax element lands exactly on the format's maximum


def test_quantize_clamps_instead_of_overflowing():
    # scale from a smaller tensor applied to a larger one would overflow without the clamp
    x = torch.tensor([[1.0, -1.0, 1e9]])
    q, _ = quantize_fp8(x, "e4m3")
    assert torch.isfinite(q.float()).all()


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_fp8(torch.tensor([1.0, float("nan")]), "e4m3")
    with pytest.raises(ValueError, match="unknown fp8 kind"):
        quantize_fp8(torch.ones(2), "e3m4")
    with pytest.raises(TypeError, match="floating-point"):
        quantize_fp8(torch.ones(2, dtype=torch.int32), "e4m3")


def test_zero_tensor_gets_unit_scale():
    q, scale = quantize_fp8(torch.zeros(4, 4), "e4m3")
    assert float(scale) == 1.0 and not q.float().any()


@pytest.mark.parametrize("fmt,expected_rel", [("fp8_e4m3_tensor", 0.037), ("fp8_e5m2_tensor", 0.075)])
def test_emulated_error_levels_match_the_format(fmt, expected_rel):
    g = torch.Generator().manual_seed(1)
    A, B = torch.randn(128, 512, generator=g), torch.randn(96, 512, generator=g)
    ops = get_format(fmt).quantize(A, B)
    out = emulate_fp8(ops)
    ref = A.double() @ B.double().T
    assert rel_fro(out, ref) == pytest.approx(expected_rel, rel=0.15)
    a_hat, b_hat = get_format(fmt).dequantize(ops)
    # against the dequantized product only the bf16 output rounding remains
    assert rel_fro(out, a_hat @ b_hat.T) < 3e-3


def test_calc_diff_is_scale_free_and_zero_for_identity():
    x = torch.randn(32, 32, dtype=torch.float64)
    assert calc_diff(x, x) == pytest.approx(0.0, abs=1e-15)
    y = x + 0.01 * torch.randn(32, 32, dtype=torch.float64)
    assert calc_diff(1000 * x, 1000 * y) == pytest.approx(calc_diff(x, y), rel=1e-9)
    assert calc_diff(x, -x) == pytest.approx(2.0)
