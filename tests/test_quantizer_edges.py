"""Quantizer edge cases across every registered format, and the shape rules the emulation shares with
the kernels: subnormal amax (a scale never underflows), empty tensors, NaN/Inf in either operand, and
``Variant.shape_limit`` (run_emulated honours it; each kernel factory refuses exactly those shapes).

CPU only; the factory test builds PrimFuncs (tracing, no compile). The shared rules themselves
(kernels.formats: check_operand, amax_scale, mx_exponent) are tested in tests/test_formats.py.
"""
import re
from pathlib import Path

import pytest
import torch
import yaml

from harness.runner import run_emulated
from kernels import blockscaled_formats as bsf
from kernels import dequant_formats as dqf
from kernels import fp8_formats as fp8f
from kernels import int4_formats as i4f
from kernels.formats import E8M0_BIAS
from kernels.registry import FORMATS, VARIANTS, Unsupported, load_all
from kernels.tiles import EMULATED, parse_tile

load_all()
FORMAT_NAMES = sorted(FORMATS)
TINY = torch.finfo(torch.float32).tiny  # 2^-126, bf16's smallest normal too
# bf16 rounds its operands, it has no scale: it is not a quantizer (kernels.baselines)
QUANTIZED_FORMATS = [f for f in FORMAT_NAMES if f != "bf16"]
# the scale tensors of each operand (whichever a format has); padded layouts (SFA_t, ...) are views of these
SCALE_KEYS = {"A": ("scale_a", "SFA"), "B": ("scale_b", "SFB", "scales")}
M, N, K = 64, 128, 256  # whole blocks and groups for every format


def _normal(rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def _subnormal(rows: int, cols: int, pattern: str) -> torch.Tensor:
    if pattern == "all_min_subnormal":  # every entry the smallest fp32 subnormal, ~1.4e-45
        return torch.full((rows, cols), 1e-45)
    if pattern == "sparse_min_subnormal":  # zeros (0/0 = NaN under a zero scale) among ±1e-45
        x = torch.zeros(rows, cols)
        x[::2, ::3] = 1e-45
        x[1::2, ::5] = -1e-45
        return x
    if pattern == "amax_1e-40":  # N(0,1) scaled to amax 1e-40
        x = _normal(rows, cols, 3)
        return x / x.abs().max() * 1e-40
    raise ValueError(pattern)


def _operands(operand: str, pattern: str) -> tuple[torch.Tensor, torch.Tensor]:
    A, B = _normal(M, K, 1), _normal(N, K, 2)
    if operand == "A":
        return _subnormal(M, K, pattern), B
    return A, _subnormal(N, K, pattern)


# ---- the shared rules, as each family applies them ------------------------------------------

def test_ordinary_scales_are_the_plain_amax_ratio():
    # the guard leaves normal inputs alone: the scales are amax/qmax exactly as the formats define them
    x = _normal(256, 512, 7)
    assert torch.equal(fp8f.quantize_fp8(x, "e4m3")[1], (x.abs().max() / 448).reshape(1))
    assert torch.equal(fp8f.quantize_fp8(x, "e5m2")[1], (x.abs().max() / 57344).reshape(1))
    assert torch.equal(i4f.quantize_int4(x)[1], (x.abs().max() / 7).reshape(1))
    _, sf = bsf.quantize_e4m3_blocks(x, 1, 128)
    assert torch.equal(sf, x.reshape(256, 4, 128).abs().amax(-1) / 448)
    ops = dqf.quantize_weight(x, dqf.W4_FORMATS["w4_int4_sym_g128"])
    assert torch.equal(ops["scales"], (x.reshape(256, 4, 128).abs().amax(-1) / 7).to(torch.bfloat16).T)


# ---- finding 1: subnormal amax -----------------------------------------------------------------

@pytest.mark.parametrize("pattern", ["all_min_subnormal", "sparse_min_subnormal", "amax_1e-40"])
@pytest.mark.parametrize("operand", ["A", "B"])
@pytest.mark.parametrize("fmt_name", FORMAT_NAMES)
def test_subnormal_amax_gives_finite_operands_and_dequantizes_close(fmt_name, operand, pattern):
    fmt = FORMATS[fmt_name]
    A, B = _operands(operand, pattern)
    ops = fmt.quantize(A, B)
    for key, t in ops.items():
        if t.is_floating_point():
            assert bool(torch.isfinite(t.float()).all()), f"{fmt_name}: {key} has NaN/Inf"
    for key in SCALE_KEYS[operand]:
        s = ops.get(key)
        if s is None:
            continue
        if s.is_floating_point():  # an fp32 / bf16 scale: never below its dtype's smallest normal
            assert bool((s.float() >= torch.finfo(s.dtype).tiny).all()), f"{fmt_name}: {key} underflows: {s.flatten()[:4]}"
        else:  # E8M0 codes (uint8): never the NaN code
            assert s.dtype == torch.uint8 and not bool((s == 255).any()), f"{fmt_name}: {key} has E8M0 NaN codes"
    a_hat, b_hat = fmt.dequantize(ops)
    x, x_hat = (A, a_hat) if operand == "A" else (B, b_hat)
    err = (x_hat - x.double()).abs().max().item()
    assert err <= TINY, f"{fmt_name}: dequantized {operand} off by {err:.3g} (> {TINY:.3g})"
    for v in VARIANTS.values():  # and the GEMMs on these operands stay finite
        if v.input_format == fmt_name:
            out = v.emulate(ops)
            real = v.to_real(out, ops) if v.to_real else out
            assert bool(torch.isfinite(real.double()).all()), f"{v.name}: emulated output has NaN/Inf"


@pytest.mark.parametrize("fmt_name", [f for f in FORMAT_NAMES if f in dqf.W4_FORMATS])
def test_uint4_zero_point_and_mx_codes_on_subnormal_weights(fmt_name):
    w4 = dqf.W4_FORMATS[fmt_name]
    B = _subnormal(N, K, "amax_1e-40")
    B[:, : w4.group] = 0  # one all-zero group per row: scale 1
    ops = dqf.quantize_weight(B, w4)
    s = ops["scales"]
    if w4.scale == "e8m0":
        assert int(s[1:].min()) >= 1 and int(s.max()) <= 254  # 2^-126 at least: a bf16 normal in the kernel
        assert bool((s[0] == E8M0_BIAS).all())
    else:
        assert bool((s[0] == 1).all()) and bool((s[1:] == torch.finfo(torch.bfloat16).tiny).all())
    if w4.has_zeros:
        z = ops["zeros"].float()
        assert bool(((z >= 0) & (z <= 15) & (z == z.round())).all())
    assert (dqf.dequantize_weight(ops, w4) - B.double()).abs().max().item() <= TINY
    assert bool(torch.isfinite(dqf.decode_weight_bf16(ops, w4).float()).all())


# ---- finding 2: empty tensors ------------------------------------------------------------------

ENTRY_POINTS = {
    "quantize_fp8": lambda x: fp8f.quantize_fp8(x, "e4m3"),
    "quantize_int4": i4f.quantize_int4,
    "quantize_e4m3_blocks": lambda x: bsf.quantize_e4m3_blocks(x, 1, 128),
    "quantize_mxfp8": bsf.quantize_mxfp8,
    **{name: (lambda x, f=f: dqf.quantize_weight(x, f)) for name, f in dqf.W4_FORMATS.items()},
}


@pytest.mark.parametrize("shape", [(0, 256), (64, 0)])
@pytest.mark.parametrize("who", sorted(ENTRY_POINTS))
def test_empty_tensor_entry_points(who, shape):
    with pytest.raises(ValueError, match=re.escape(f"{who}: ") + r".*empty tensor of shape " + re.escape(f"{shape}")
                       + r".*has no scale"):
        ENTRY_POINTS[who](torch.zeros(shape))


@pytest.mark.parametrize("operand", ["A", "B"])
@pytest.mark.parametrize("fmt_name", QUANTIZED_FORMATS)
def test_empty_operand_of_every_format(fmt_name, operand):
    A, B = _normal(M, K, 1), _normal(N, K, 2)
    if operand == "A":
        A = A[:0]
    else:
        B = B[:0]
    with pytest.raises(ValueError, match=rf"operand {operand}\b.*empty tensor of shape \(0, {K}\).*has no scale"):
        FORMATS[fmt_name].quantize(A, B)


# ---- finding 3: NaN / Inf in either operand ----------------------------------------------------

@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("operand", ["A", "B"])
@pytest.mark.parametrize("fmt_name", FORMAT_NAMES)
def test_non_finite_operand_is_refused_and_named(fmt_name, operand, bad):
    A, B = _normal(M, K, 1), _normal(N, K, 2)
    (A if operand == "A" else B)[5, 17] = bad
    with pytest.raises(ValueError, match=rf"operand {operand}\b.*NaN or Inf"):
        FORMATS[fmt_name].quantize(A, B)


# ---- finding 4: shape rules shared by the emulation and the kernels ----------------------------

BLOCKSCALED_KERNELS = sorted(n for n, v in VARIANTS.items() if v.family == "blockscaled" and v.kernel is not None)


@pytest.mark.parametrize("name", BLOCKSCALED_KERNELS)
def test_emulation_of_a_blockscaled_kernel_refuses_k_not_multiple_of_128(name):
    v = VARIANTS[name]
    A, B = _normal(64, 192, 1), _normal(128, 192, 2)
    rows = run_emulated(v, A, B, FORMATS[v.input_format].quantize(A, B), {})
    assert rows == [{"tile": EMULATED, "status": "unsupported", "reason": v.shape_limit(64, 128, 192)}]
    assert "K divisible by 128" in rows[0]["reason"] and "K=192" in rows[0]["reason"]
    A, B = _normal(64, 256, 1), _normal(128, 256, 2)
    rows = run_emulated(v, A, B, FORMATS[v.input_format].quantize(A, B), {})
    assert len(rows) == 1 and rows[0]["tile"] == EMULATED and rows[0]["status"] == "ok", rows


# shapes each refused by some variant's shape_limit (K % 128, K % 32, N % 16, M <= 16, N % 8), and ordinary ones
PROBE_SHAPES = [(64, 128, 192), (64, 128, 48), (64, 120, 256), (16, 128, 256), (64, 124, 256), (256, 256, 512), (200, 328, 384)]


@pytest.mark.parametrize("name", sorted(n for n, v in VARIANTS.items() if v.shape_limit is not None))
def test_emulation_honours_every_declared_shape_limit(name):
    v = VARIANTS[name]
    refused = [s for s in PROBE_SHAPES if v.shape_limit(*s)]
    assert refused, f"no probe shape exercises {name}'s shape_limit"
    m, n, k = refused[0]
    A, B = _normal(m, k, 1), _normal(n, k, 2)
    rows = run_emulated(v, A, B, FORMATS[v.input_format].quantize(A, B), {})
    assert rows == [{"tile": EMULATED, "status": "unsupported", "reason": v.shape_limit(m, n, k)}]


def _config_tile(name: str):
    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config.yaml").read_text())
    tiles = (cfg.get("variants", {}).get(name) or {}).get("tiles", {})
    return parse_tile(tiles["default"][0]) if tiles.get("default") else None


@pytest.mark.parametrize("name", sorted(n for n, v in VARIANTS.items() if v.kernel is not None))
def test_kernel_factory_refuses_exactly_the_declared_shapes(name):
    # a factory only traces a PrimFunc (milliseconds): it must raise Unsupported exactly where the
    # variant's shape_limit names a reason, and with that reason (so the two cannot drift apart)
    pytest.importorskip("tilelang")
    v = VARIANTS[name]
    tile = _config_tile(name)
    if tile is None:
        pytest.skip(f"{name} has no default tile in config.yaml")
    for shape in PROBE_SHAPES:
        limit = v.shape_limit(*shape) if v.shape_limit else None
        try:
            v.kernel(*shape, tile)
            raised = None
        except Unsupported as e:
            raised = e
        except ValueError:  # a tile that does not fit this shape (recorded as failed per tile), not a shape rule
            raised = None
        if limit is None:
            assert raised is None, f"{name} {shape}: factory refuses ({raised}) but shape_limit accepts"
        else:
            assert raised is not None, f"{name} {shape}: shape_limit refuses ({limit}) but the factory builds"
            assert limit in str(raised), f"{name} {shape}: factory says {raised!s}, shape_limit says {limit}"
