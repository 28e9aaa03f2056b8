"""kernels.formats, the number-format building blocks every family imports: operand checks, amax scales,
the OCP MX shared exponent, the block quantizers and their element encoders (saturating fp8 casts, int4,
e2m1), block views, E8M0 codes, 4-bit packing; and the rule that each variant's and format's name is
written once, where it is registered. CPU only."""
import ast
import math
import re

import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import REPO

from kernels import formats as fm
from kernels.formats import (
    amax_scale,
    check_operand,
    e2m1_decode,
    e2m1_encode,
    e8m0_decode,
    e8m0_encode,
    mx_exponent,
    pack_codes,
    pack_e8m0_words,
    pack_int4,
    unpack_codes,
    unpack_int4,
)
from kernels.registry import FORMATS, VARIANTS, load_all

load_all()


# ---- the names: written once, where registered -------------------------------------------------

# the module that registers a family's variants and their formats (kernels/<module>.py)
FAMILY_MODULE = {"baseline": "baselines", "fp8": "fp8", "int4": "int4", "blockscaled": "blockscaled", "dequant": "dequant"}
# the same word with another meaning: Variant.precision's default "bf16" is a datasheet peak, not the format
OTHER_MEANINGS = {("registry", "bf16"): 1}


def _string_literals() -> dict[str, list[str]]:
    """Every string constant of every kernels/*.py, by module (f-string pieces included)."""
    return {path.stem: [node.value for node in ast.walk(ast.parse(path.read_text()))
                        if isinstance(node, ast.Constant) and isinstance(node.value, str)]
            for path in sorted((REPO / "kernels").glob("*.py"))}


def _defining_module(fn) -> str:
    while hasattr(fn, "func"):  # functools.partial
        fn = fn.func
    return fn.__module__.rpartition(".")[2]


def test_each_variant_and_format_name_is_written_once_where_registered():
    literals = _string_literals()
    format_family = {}
    for v in VARIANTS.values():
        assert format_family.setdefault(v.input_format, v.family) == v.family, f"{v.input_format}: variants of two families"
    # a variant's home is its family's module; a format's, the module that defines (and registers) it
    # (kernels/<family>_formats.py, which imports no kernel)
    names = [(v.name, v.family, FAMILY_MODULE[v.family]) for v in VARIANTS.values()]
    names += [(f, format_family[f], _defining_module(FORMATS[f].quantize)) for f in FORMATS]
    assert len(names) == len(VARIANTS) + len(FORMATS) and set(format_family) == set(FORMATS)
    for name, family, home in names:
        counts = {mod: lits.count(name) - OTHER_MEANINGS.get((mod, name), 0) for mod, lits in literals.items()}
        where = {mod: n for mod, n in counts.items() if n}
        assert where == {home: 1}, f"{name!r} ({family}) is written as a literal {where or 'nowhere'}; want once, in kernels/{home}.py"


def test_every_variant_refers_to_registered_peers():
    for v in VARIANTS.values():
        assert v.input_format in FORMATS, v.name
        for peer in (v.baseline, v.second_baseline):
            assert peer is None or peer in VARIANTS, f"{v.name}: peer {peer!r} is not registered"


# ---- operand checks, amax scales, the MX exponent ----------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_amax_scale_floors_at_the_smallest_normal_and_keeps_ordinary_scales(dtype):
    tiny = torch.finfo(dtype).tiny
    amax = torch.tensor([0.0, 1e-45, 1e-40, 448 * tiny, 3.7, 1e30])
    s = amax_scale(amax, 448.0, dtype)
    assert s.dtype == dtype
    assert s[0] == 1  # all zero: scale 1
    assert s[1] == tiny and s[2] == tiny  # would underflow (fp32: 0 / a subnormal; bf16: 0)
    # at and above qmax·tiny: amax / qmax rounded to dtype, bit for bit the unguarded formula
    assert torch.equal(s[3:], (amax[3:] / 448.0).to(dtype))


def test_mx_exponent_clamps_to_the_given_range():
    amax = torch.tensor([0.0, 1e-45, 1e-40, 1.0, 448.0, 3e38])
    assert mx_exponent(amax, 8).tolist() == [0, -127, -127, -8, 0, 119]
    assert mx_exponent(amax, 2, min_exponent=-126).tolist() == [0, -126, -126, -2, 6, 125]


def test_mx_exponent_clamp_constants():
    # blockscaled's MXFP8 clamps to what E8M0 stores; the W4 MXFP4 kernel decodes its scales to bf16
    assert (fm.E8M0_MIN_EXPONENT, fm.E8M0_MAX_EXPONENT) == (-127, 127)
    assert fm.BF16_DECODE_MIN_EXPONENT == -126 == math.frexp(torch.finfo(torch.bfloat16).tiny)[1] - 1


def test_mx_exponent_is_ocp_floor_log2_minus_emax():
    below_two = torch.nextafter(torch.tensor(2.0), torch.tensor(0.0)).item()  # largest fp32 below 2
    amax = torch.tensor([1.0, 2.0, below_two, 3.0, 447.9, 448.0, 1e-3, 2.0**-20, 1e-40, 3e38], dtype=torch.float32)
    got = mx_exponent(amax, fm.E4M3_EMAX).tolist()
    want = [max(-127, min(127, math.frexp(a)[1] - 1 - 8)) for a in amax.tolist()]
    assert got == want
    assert got[2] == -8  # just below 2: floor(log2) is 0, where a float log2 would round to 1
    assert got[8] == -127  # clamped to E8M0's smallest scale
    w4 = mx_exponent(amax, fm.E2M1_EMAX, fm.BF16_DECODE_MIN_EXPONENT).tolist()
    assert w4 == [max(-126, min(127, math.frexp(a)[1] - 1 - 2)) for a in amax.tolist()]


def test_check_operand_messages():
    check_operand(torch.ones(2, 2), "q", "A")
    with pytest.raises(TypeError, match="q expects a floating-point tensor for operand A"):
        check_operand(torch.ones(2, dtype=torch.int32), "q", "A")
    with pytest.raises(ValueError, match=re.escape("q: operand B is an empty tensor of shape (0, 4); an empty tensor has no scale")):
        check_operand(torch.ones(0, 4), "q", "B")
    with pytest.raises(ValueError, match="q: the input contains NaN or Inf"):
        check_operand(torch.tensor([1.0, float("inf")]), "q")


# ---- element encoders --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,fmax", [(fm.E4M3, fm.E4M3_MAX), (fm.E5M2, fm.E5M2_MAX)])
def test_saturate_fp8_clamps_before_the_cast(dtype, fmax):
    assert torch.finfo(dtype).max == fmax
    x = torch.tensor([0.0, -0.0, 1.1, -3.3, fmax, -fmax, 1.5 * fmax, -1e30, 1e-30])
    q = fm.saturate_fp8(x, dtype)
    assert q.dtype == dtype
    assert q.float().tolist()[6:8] == [fmax, -fmax]  # saturated, whatever this torch's plain cast does out of range
    assert torch.equal(q[:6].view(torch.uint8), x[:6].to(dtype).view(torch.uint8))  # in range: the plain cast


def test_encode_int4_rounds_half_to_even_and_clamps():
    x = torch.tensor([-9.0, -8.4, -7.5, -0.5, 0.5, 1.5, 2.5, 6.5, 7.49, 7.5, 100.0])
    assert fm.encode_int4(x).tolist() == [-8, -8, -8, 0, 0, 2, 2, 6, 7, 7, 7]
    assert fm.encode_int4(x).dtype == torch.int8


def test_e2m1_decoder_matches_ml_dtypes_all_codes():
    codes = np.arange(16, dtype=np.uint8)
    ref = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    got = e2m1_decode(torch.arange(16)).numpy()
    np.testing.assert_array_equal(got, ref)
    assert got[0] == 0.0 and not np.signbit(got[0])  # code 0 is +0.0, not 0.5
    assert got[1] == 0.5 and np.signbit(got[8])
    assert list(got) == list(fm.E2M1_VALUES)


def test_e2m1_encoder_matches_ml_dtypes_rounding():
    mids = list(fm.E2M1_MIDPOINTS)
    grid = [0.0, 0.1, 0.3, 0.74, 0.76, 1.1, 2.2, 3.3, 4.4, 5.9, 6.0, 6.5, 7.0, 100.0, 1e-30] + mids
    x = torch.tensor(grid + [-v for v in grid], dtype=torch.float32)
    ref = x.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    np.testing.assert_array_equal(e2m1_encode(x).numpy(), ref)


# ---- blocks and the block quantizers -----------------------------------------------------------

def test_block_view_pads_whole_blocks_with_zeros_and_unblock_inverts_it():
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(1))
    blocks = fm.block_view(x, 2, 3)
    assert blocks.shape == (3, 2, 3, 3) and blocks.dtype == torch.float32
    assert torch.equal(blocks[1, 0, 1], x[2, 3:6])  # block (1, 1), its first row
    assert not blocks[2, 1].any() and not blocks[:, :, 2, 1:].any()  # the padding
    assert torch.equal(fm.unblock(blocks, 5, 7), x)


def test_expand_blocks_repeats_each_block_value_over_its_elements():
    s = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    e = fm.expand_blocks(s, 2, 3, 3, 5)
    assert e.tolist() == [[1, 1, 1, 2, 2], [1, 1, 1, 2, 2], [3, 3, 3, 4, 4]]
    assert torch.equal(fm.expand_blocks(s, 1, 1, 2, 1), s[:, :1])


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_quantize_blocks_is_amax_scale_then_encode(scale_dtype):
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(2)) * 5
    x[1, :32] = 0  # an all-zero block: scale 1
    blocks = fm.block_view(x, 2, 32)
    codes, scales = fm.quantize_blocks(blocks, 7, scale_dtype, fm.encode_int4)
    assert scales.shape == (3, 1, 2, 1) and scales.dtype == scale_dtype
    want = amax_scale(x.reshape(3, 2, 2, 32).abs().amax(dim=(1, 3)), 7, scale_dtype)
    assert torch.equal(scales.reshape(3, 2), want)
    assert torch.equal(codes, fm.encode_int4(blocks / scales.float()))
    assert int(codes.abs().max()) == 7


def test_quantize_tensor_keeps_the_shape_and_gives_one_scale():
    for x in (torch.tensor([-3.5, 0.0, 1.0, 3.5]), torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(3))):
        codes, scale = fm.quantize_tensor(x, 7, fm.encode_int4)
        assert codes.shape == x.shape and scale.shape == (1,) and scale.dtype == torch.float32
        assert scale.item() == pytest.approx(x.abs().max().item() / 7)
        assert torch.equal(codes, fm.encode_int4(x / scale))


def test_quantize_mx_blocks_uses_power_of_two_scales():
    x = torch.zeros(2, 64)
    x[0, 0], x[0, 1], x[0, 40] = 1.99, 0.5, 1e-42  # block (0, 1): a subnormal amax
    blocks = fm.block_view(x, 1, 32)
    codes, e8m0 = fm.quantize_mx_blocks(blocks, fm.E4M3_EMAX, lambda y: fm.saturate_fp8(y, fm.E4M3))
    assert e8m0.dtype == torch.uint8 and e8m0.reshape(2, 2).tolist() == [[127 - 8, 0], [127, 127]]
    assert codes.float()[0, 0, 0, :2].tolist() == [448.0, 128.0]  # 1.99·2^8 = 509 saturates
    _, w4 = fm.quantize_mx_blocks(blocks, fm.E2M1_EMAX, e2m1_encode, fm.BF16_DECODE_MIN_EXPONENT)
    assert w4.reshape(2, 2).tolist() == [[127 - 2, 1], [127, 127]]  # at least 2^-126 for a bf16 decode


# ---- E8M0 --------------------------------------------------------------------------------------

def _e8m0_decode_ldexp(codes: torch.Tensor) -> torch.Tensor:
    """kernels/blockscaled.py's former E8M0 decoder (float64 ldexp, 255 NaN), the reference of the one kept."""
    c = codes.to(torch.int32)
    value = torch.ldexp(torch.ones(c.shape, dtype=torch.float64), c - 127)
    return torch.where(c == 255, torch.nan, value).to(torch.float32)


def test_e8m0_decode_equals_the_former_ldexp_decoder_on_all_256_codes():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got, want = e8m0_decode(codes), _e8m0_decode_ldexp(codes)
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bit for bit, NaN and subnormal included


def test_e8m0_decode_matches_torch_and_ml_dtypes():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = e8m0_decode(codes)
    want = [2.0 ** (c - 127) for c in range(255)]
    assert got[:255].tolist() == want and math.isnan(got[255])
    checked = 0
    if hasattr(torch, "float8_e8m0fnu"):
        torch.testing.assert_close(got, codes.view(torch.float8_e8m0fnu).float(), equal_nan=True, rtol=0, atol=0)
        checked += 1
    if hasattr(ml_dtypes, "float8_e8m0fnu"):
        ref = torch.from_numpy(codes.numpy().view(ml_dtypes.float8_e8m0fnu).astype("float32"))
        torch.testing.assert_close(got, ref, equal_nan=True, rtol=0, atol=0)
        checked += 1
    if not checked:
        pytest.skip("neither torch nor ml_dtypes has float8_e8m0fnu")


def test_e8m0_decode_takes_uint8_codes_only():
    with pytest.raises(TypeError, match="uint8"):
        e8m0_decode(torch.tensor([127], dtype=torch.int32))


def test_e8m0_encode_roundtrip_and_range():
    exps = torch.arange(-127, 128)
    codes = e8m0_encode(exps)
    assert codes.dtype == torch.uint8 and codes.tolist() == list(range(255))
    assert torch.equal(torch.log2(e8m0_decode(codes).double()), exps.double())
    with pytest.raises(ValueError):
        e8m0_encode(torch.tensor([128]))
    with pytest.raises(ValueError):
        e8m0_encode(torch.tensor([-128]))


def test_e8m0_words():
    R, nblk = 200, 10  # 10 codes -> 3 words (the last padded with scale 1)
    codes = torch.randint(0, 255, (R, nblk), generator=torch.Generator().manual_seed(10)).to(torch.uint8)
    words = pack_e8m0_words(codes)
    assert words.dtype == torch.int32 and words.shape == (R, 3)
    w = words.to(torch.int64) & 0xFFFFFFFF
    unpacked = torch.stack([(w >> (8 * j)) & 0xFF for j in range(4)], dim=2).reshape(R, 12)
    assert torch.equal(unpacked[:, :nblk], codes.to(torch.int64))
    assert (unpacked[:, nblk:] == fm.E8M0_BIAS).all()


# ---- 4-bit codes, two per byte -----------------------------------------------------------------

def test_round_trip_every_nibble_pair():
    values = torch.arange(-8, 8, dtype=torch.int8)
    low, high = torch.meshgrid(values, values, indexing="ij")
    pairs = torch.stack((low.reshape(-1), high.reshape(-1)), dim=-1)  # (256, 2): all combinations
    packed = pack_int4(pairs)
    assert packed.shape == (256, 1) and packed.dtype == torch.int8
    expected_bytes = ((pairs[:, 0].long() & 0xF) | ((pairs[:, 1].long() & 0xF) << 4)).to(torch.uint8).view(torch.int8)
    assert torch.equal(packed[:, 0], expected_bytes)
    assert torch.equal(unpack_int4(packed), pairs)
    assert len(set(packed[:, 0].tolist())) == 256  # every byte value is reached exactly once


@pytest.mark.parametrize("shape", [(2,), (3, 8), (2, 5, 64), (1, 0, 4)])
def test_round_trip_random(shape):
    g = torch.Generator().manual_seed(sum(shape) + len(shape))
    t = torch.randint(-8, 8, shape, generator=g, dtype=torch.int8)
    packed = pack_int4(t)
    assert packed.shape == (*shape[:-1], shape[-1] // 2)
    assert torch.equal(unpack_int4(packed), t)
    assert torch.equal(pack_int4(unpack_int4(packed)), packed)


@pytest.mark.parametrize(
    "byte, values",
    [
        (0x21, [1, 2]),
        (0xF8, [-8, -1]),
        (0x7F, [-1, 7]),
        (0x80, [0, -8]),
        (0x87, [7, -8]),
        (0x00, [0, 0]),
        (0xFF, [-1, -1]),
    ],
)
def test_known_bytes(byte, values):
    packed = torch.tensor([byte], dtype=torch.uint8).view(torch.int8)
    assert unpack_int4(packed).tolist() == values
    assert torch.equal(pack_int4(torch.tensor(values, dtype=torch.int8)), packed)


def test_pack_element_order_along_last_dim():
    t = torch.tensor([[1, 2, 3, 4], [-8, 7, 0, -1]], dtype=torch.int8)
    as_bytes = pack_int4(t).view(torch.uint8).tolist()
    assert as_bytes == [[0x21, 0x43], [0x78, 0xF0]]
    p = pack_int4(torch.tensor([[1, -2, 7, -8]], dtype=torch.int8))
    assert p.tolist() == [[(0xE1 ^ 0x80) - 0x80, (0x87 ^ 0x80) - 0x80]]  # 2i low nibble, 2i+1 high


@pytest.mark.parametrize(
    "bad, exc, words",
    [
        (torch.zeros(4, dtype=torch.float32), TypeError, "int8"),
        (torch.zeros(4, dtype=torch.int16), TypeError, "int8"),
        (torch.zeros(4, dtype=torch.uint8), TypeError, "int8"),
        (torch.tensor(3, dtype=torch.int8), ValueError, "0-dim"),
        (torch.zeros(2, 3, dtype=torch.int8), ValueError, "even"),
        (torch.tensor([0, 8], dtype=torch.int8), ValueError, "[-8, 7]"),
        (torch.tensor([-9, 0], dtype=torch.int8), ValueError, "[-8, 7]"),
        ([1, 2], TypeError, "torch.Tensor"),
    ],
)
def test_pack_errors(bad, exc, words):
    with pytest.raises(exc, match=re.escape(words)):
        pack_int4(bad)


@pytest.mark.parametrize(
    "bad, exc, words",
    [
        (torch.zeros(4, dtype=torch.int32), TypeError, "int8"),
        (torch.zeros(4, dtype=torch.uint8), TypeError, "int8"),
        (torch.tensor(3, dtype=torch.int8), ValueError, "0-dim"),
        ([1, 2], TypeError, "torch.Tensor"),
    ],
)
def test_unpack_errors(bad, exc, words):
    with pytest.raises(exc, match=re.escape(words)):
        unpack_int4(bad)


def test_pack_codes_roundtrip_and_order():
    codes = torch.arange(16).repeat(4).reshape(4, 16)
    p = pack_codes(codes)
    assert p.shape == (4, 8) and p.dtype == torch.int8
    assert int(p[0, 7]) & 0xFF == 0xFE  # codes 14 (low) and 15 (high)
    assert torch.equal(unpack_codes(p).long(), codes)
    assert torch.equal(p, pack_int4(unpack_int4(p)))  # pack_int4's nibble order, the same bytes
    with pytest.raises(ValueError):
        pack_codes(torch.tensor([16, 0]))
