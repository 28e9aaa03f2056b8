"""int4 family: quantizer, exact emulation, the kernel's nibble decode, self checks, and TileLang compile
checks (CPU only). The packing itself (kernels.formats) is tested in tests/test_formats.py."""
from __future__ import annotations

import re

import pytest
import torch

from kernels import int4
from kernels import int4_formats as i4f
from kernels import int4_unpack_s8 as unpack_s8
from kernels.formats import pack_int4, unpack_int4
from kernels.registry import FORMATS, VARIANTS, Unsupported
from kernels.tiles import parse_tile

INT4_VARIANTS = ("int4_mma", "int4_unpack_s8", "int4_unpack_s8_ss", "int4_ws", "int8_tilelang", "int8_torch_int_mm")


def _brute_force_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int64 A·Bᵀ by broadcasting, independent of the module's float64 route."""
    return (a.long()[:, None, :] * b.long()[None, :, :]).sum(-1)


# --- quantizer and formats -------------------------------------------------------------------


def test_quantize_int4_scale_rounding_and_clamp():
    x = torch.tensor([-3.5, -1.0, 0.0, 0.24, 0.26, 2.0, 3.5])
    q, scale = i4f.quantize_int4(x)
    assert scale.dtype == torch.float32 and scale.shape == (1,)
    assert scale.item() == pytest.approx(0.5)
    # x / 0.5 = [-7, -2, 0, 0.48, 0.52, 4, 7]
    assert q.tolist() == [-7, -2, 0, 0, 1, 4, 7]
    assert q.dtype == torch.int8


def test_quantize_int4_is_deterministic_and_in_range():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, generator=g) * 3
    q1, s1 = i4f.quantize_int4(x)
    q2, s2 = i4f.quantize_int4(x.clone())
    assert torch.equal(q1, q2) and torch.equal(s1, s2)
    assert int(q1.min()) >= -8 and int(q1.max()) <= 7
    assert int(q1.abs().max()) == 7  # amax lands on ±7
    assert (q1.double() * s1.double() - x.double()).abs().max() <= s1.item() / 2 + 1e-6


def test_quantize_int4_zero_and_errors():
    q, s = i4f.quantize_int4(torch.zeros(3, 4))
    assert s.item() == 1.0 and not q.any()
    with pytest.raises(TypeError):
        i4f.quantize_int4(torch.zeros(3, dtype=torch.int8))
    with pytest.raises(ValueError, match="NaN"):
        i4f.quantize_int4(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="empty"):
        i4f.quantize_int4(torch.zeros(0))


def _inputs(M=24, N=40, K=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, K, generator=g), torch.randn(N, K, generator=g) * 0.1


def test_formats_share_values_and_scales():
    A, B = _inputs()
    packed = FORMATS["int4_tensor"].quantize(A, B)
    unpacked = FORMATS["int4_tensor_unpacked_s8"].quantize(A, B)
    assert packed["A_packed"].shape == (24, 32) and packed["B_packed"].shape == (40, 32)
    assert packed["A_packed"].dtype == torch.int8 and packed["A_packed"].is_contiguous()
    assert unpacked["A"].shape == (24, 64) and unpacked["B"].dtype == torch.int8
    assert torch.equal(unpack_int4(packed["A_packed"]), unpacked["A"])
    assert torch.equal(unpack_int4(packed["B_packed"]), unpacked["B"])
    for key in ("scale_a", "scale_b"):
        assert packed[key].dtype == torch.float32 and packed[key].shape == (1,)
        assert torch.equal(packed[key], unpacked[key])
    a_hat, b_hat = FORMATS["int4_tensor"].dequantize(packed)
    assert a_hat.dtype == torch.float64 and a_hat.shape == A.shape
    assert torch.equal(a_hat, unpacked["A"].double() * packed["scale_a"].double())
    assert torch.equal(b_hat, FORMATS["int4_tensor_unpacked_s8"].dequantize(unpacked)[1])
    assert (a_hat - A.double()).abs().max() <= packed["scale_a"].item() / 2 + 1e-6


# --- exact emulation ----------------------------------------------------------------------


@pytest.mark.parametrize("name", INT4_VARIANTS)
def test_emulation_equals_int64_reference(name):
    v = VARIANTS[name]
    A, B = _inputs(seed=7)
    ops = FORMATS[v.input_format].quantize(A, B)
    out = v.emulate(ops)
    a_int, b_int = i4f.int_operands(ops)
    reference = _brute_force_product(a_int, b_int)
    assert out.dtype == torch.int32 and out.shape == (24, 40)
    assert torch.equal(out.long(), reference)
    assert torch.equal(v.exact_reference(ops), reference)
    assert v.ops_unit == "TOPS"
    real = v.to_real(out, ops)
    assert real.dtype == torch.float64
    assert torch.allclose(real, reference.double() * ops["scale_a"].double() * ops["scale_b"].double(), rtol=0, atol=0)


@pytest.mark.parametrize("a_val, b_val", [(-8, -8), (7, 7), (-8, 7)])
def test_emulation_on_extremes(a_val, b_val):
    M, N, K = 3, 5, 4096
    ops = {
        "A_packed": pack_int4(torch.full((M, K), a_val, dtype=torch.int8)),
        "B_packed": pack_int4(torch.full((N, K), b_val, dtype=torch.int8)),
        "scale_a": torch.ones(1),
        "scale_b": torch.ones(1),
    }
    out = VARIANTS["int4_unpack_s8"].emulate(ops)
    assert torch.equal(out, torch.full((M, N), a_val * b_val * K, dtype=torch.int32))


def test_int32_accumulation_bound():
    int4.check_int32_accumulation((1 << 25) - 1)  # 64·K < 2^31: fine
    with pytest.raises(ValueError, match="2\\^25"):
        int4.check_int32_accumulation(1 << 25)


def _words(t: torch.Tensor) -> torch.Tensor:
    """int4 values -> the packed int32 words the kernel reads (little-endian bytes, as on the GPU), as
    int64 in [0, 2^32): uint32 arithmetic in int64, which the nibble decode never takes past 32 bits."""
    return pack_int4(t).view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _lanes(x: torch.Tensor) -> torch.Tensor:
    """32-bit values (int64) -> their four byte lanes as int8, lane b = bits 8b..8b+7."""
    assert bool(((x >= 0) & (x < 1 << 32)).all())
    return torch.stack([(x >> (8 * b)) & 0xFF for b in range(4)], dim=-1).to(torch.uint8).view(torch.int8).flatten(-2)


def test_kernel_nibble_decode_sign_extends_every_byte():
    """int4_unpack_s8's own decode arithmetic (the functions its macros call with T.uint32), on torch:
    every byte value in every lane gives its sign-extended low and high nibble."""
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.int8)
    t = unpack_int4(torch.stack([values.roll(s) for s in range(4)], dim=-1))  # (256, 8): each byte in each lane
    w = _words(t)  # (256, 1)
    low = unpack_s8.sign_extend_nibbles(unpack_s8.select_nibbles(w, int), int)
    high = unpack_s8.sign_extend_nibbles(unpack_s8.select_nibbles(w, int, 4), int)
    assert torch.equal(_lanes(low), t[:, 0::2]) and torch.equal(_lanes(high), t[:, 1::2])


def test_kernel_decode_order_reproduces_the_product():
    """The decoded K order of int4_unpack_s8 (column j < block_K/2: low nibble of packed byte j, column
    block_K/2 + j: its high nibble), made with the kernel's decode, permutes K identically for A and B."""
    M, N, K, block_K = 5, 6, 256, 128
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-8, 8, (M, K), generator=g, dtype=torch.int8)
    b = torch.randint(-8, 8, (N, K), generator=g, dtype=torch.int8)
    half = block_K // 2
    order = torch.cat((2 * torch.arange(half), 2 * torch.arange(half) + 1))  # logical K of each decoded column
    j = torch.arange(block_K)

    def decode(t: torch.Tensor) -> torch.Tensor:
        tiles = []
        for blk in range(K // block_K):
            words = _words(t)[:, blk * block_K // 8 : (blk + 1) * block_K // 8]
            # decode_to_shared: each word's low nibbles, then (half a block on) its high nibbles
            low = unpack_s8.sign_extend_nibbles(unpack_s8.select_nibbles(words, int), int)
            high = unpack_s8.sign_extend_nibbles(unpack_s8.select_nibbles(words, int, 4), int)
            tile = torch.cat((_lanes(low), _lanes(high)), dim=-1)
            # decode_to_fragment: column j from word (j % half) // 4, nibble shift 4·(j // half), byte j % 4
            nibbles = unpack_s8.select_nibbles(words[:, (j % half) // 4], int, 4 * (j // half))
            fragment = (unpack_s8.sign_extend_nibbles(nibbles, int) >> (8 * (j % 4))) & 0xFF
            assert torch.equal(fragment.to(torch.uint8).view(torch.int8), tile)
            assert torch.equal(tile, t[:, blk * block_K + order])
            tiles.append(tile)
        return torch.cat(tiles, dim=-1)

    assert torch.equal(_brute_force_product(decode(a), decode(b)), _brute_force_product(a, b))


def test_kernel_calls_the_module_nibble_decode(monkeypatch):
    """The functions the tests above run are the ones the kernel's macros trace, with T.uint32 constants."""
    import tilelang.language as T

    seen = []
    select, extend = unpack_s8.select_nibbles, unpack_s8.sign_extend_nibbles
    monkeypatch.setattr(unpack_s8, "select_nibbles", lambda w, const, shift=None: seen.append(("select", const)) or select(w, const, shift))
    monkeypatch.setattr(unpack_s8, "sign_extend_nibbles", lambda x, const: seen.append(("extend", const)) or extend(x, const))
    for name in ("int4_unpack_s8", "int4_unpack_s8_ss"):
        seen.clear()
        VARIANTS[name].kernel(256, 256, 256, parse_tile("m64n64k64_s2_t128"))
        assert {("select", T.uint32), ("extend", T.uint32)} == set(seen), name


# --- baselines and self checks --------------------------------------------------------------


@pytest.mark.parametrize("M, N, K, culprit", [(16, 64, 64, "M=16"), (32, 60, 64, "N=60"), (32, 64, 12, "K=12")])
def test_int_mm_shape_limit(M, N, K, culprit):
    v = VARIANTS["int8_torch_int_mm"]
    assert v.shape_limit(32, 64, 64) is None
    reason = v.shape_limit(M, N, K)
    assert reason.startswith("torch._int_mm cannot run") and culprit in reason


def test_unpack_s8_shape_limit():
    v = VARIANTS["int4_unpack_s8"]
    assert v.shape_limit(100, 100, 256) is None
    assert "K divisible by 32" in v.shape_limit(100, 100, 48)


def test_int_mm_launch_checks_before_calling_torch():
    ops = {"A": torch.zeros(8, 32, dtype=torch.int8), "B": torch.zeros(16, 32, dtype=torch.int8)}
    with pytest.raises(ValueError, match="M=8 must be > 16"):
        VARIANTS["int8_torch_int_mm"].launch(None, ops)


@pytest.mark.parametrize("name", ["int4_mma", "int4_unpack_s8"])
def test_self_checks_pass_for_exact_kernel_and_fail_for_wrong_one(name):
    v = VARIANTS[name]
    assert v.self_checks is not None
    good = v.self_checks(v.emulate, 20, 24, 64, "cpu")
    assert good == {"extremes_exact": True, "k_order_exact": True}

    def swapped_b_nibbles(ops):  # decodes B with its nibbles swapped: right on constants, wrong on patterns
        b = ops["B_packed"].view(torch.uint8)
        swapped = (((b >> 4) | (b << 4)) & 0xFF).view(torch.int8)
        return v.emulate({**ops, "B_packed": swapped})

    assert v.self_checks(swapped_b_nibbles, 20, 24, 64, "cpu") == {"extremes_exact": True, "k_order_exact": False}
    zeros = lambda ops: torch.zeros(20, 24, dtype=torch.int32)  # noqa: E731
    assert v.self_checks(zeros, 20, 24, 64, "cpu")["extremes_exact"] is False


def test_unpack_kernel_factory_rejects_bad_shapes_and_tiles():
    factory = VARIANTS["int4_unpack_s8"].kernel
    with pytest.raises(Unsupported, match="K divisible by 32"):  # the declared shape_limit
        factory(256, 256, 48, parse_tile("m64n64k64_s2_t128"))
    with pytest.raises(ValueError, match="block_K"):
        factory(256, 256, 256, parse_tile("m64n64k48_s2_t128"))
    with pytest.raises(ValueError, match="shared memory"):
        VARIANTS["int4_unpack_s8_ss"].kernel(8192, 8192, 8192, parse_tile("m128n256k128_s3_t256_wrow"))


# --- TileLang compile checks -----------------------------------------------------------------


# the tiles config.yaml gives them, at the compile-check shape (the main job's kernels)
def _compile_source(kernels, name: str, arch: str, tile: str) -> str:
    v = VARIANTS[name]
    k = kernels(name, tile, arch)
    assert k.record["status"] == "ok", k.record
    src = k.source
    assert re.search(v.instructions[arch], src), f"{name} on {arch}: {v.instructions[arch]!r} not in the source"
    return src


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_89", "sm_90a"])
def test_int4_mma_compiles_to_s4_mma(kernels, arch):
    _compile_source(kernels, "int4_mma", arch, "m128n128k128_s3_t128")


@pytest.mark.compile
def test_int4_unpack_s8_compiles_to_async_s8_wgmma(kernels):
    src = _compile_source(kernels, "int4_unpack_s8", "sm_90a", "m128n256k128_s3_t256_wrow_z8")
    assert "tma_load" in src  # packed tiles arrive by TMA
    assert "wait_wgmma<0>" in src and "warpgroup_wait<" not in src  # no implicit wait after each wgmma


@pytest.mark.compile
def test_int4_unpack_s8_ss_compiles_to_s8_wgmma(kernels):
    _compile_source(kernels, "int4_unpack_s8_ss", "sm_90a", "m128n256k128_s2_t256_wrow_z8")


@pytest.mark.compile
def test_int8_tilelang_compiles_to_s8_wgmma(kernels):
    _compile_source(kernels, "int8_tilelang", "sm_90a", "m128n256k128_s3_t256_wrow_z8")
