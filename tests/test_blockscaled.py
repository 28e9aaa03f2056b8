"""kernels.blockscaled: quantizers, scale layouts, emulated numerics, launches, compiles.

CPU only. Compile tests build small kernels (the compile-check shape) with the local nvcc, through harness.compile
as the pipeline does. The E8M0 codes and the MX exponent (kernels.formats) are tested in tests/test_formats.py.
"""
import dataclasses
import re

import pytest
import torch
from conftest import CANONICAL_SHAPE

from harness.compile import UnsupportedTarget, build
from harness.metrics import calc_diff, rel_fro
from harness.runner import prepared
from kernels import blockscaled as bs
from kernels import blockscaled_formats as bsf
from kernels.formats import E8M0_BIAS, e8m0_decode, expand_blocks, pack_e8m0_words
from kernels.registry import FORMATS, VARIANTS, Unsupported
from kernels.tiles import parse_tile

KERNEL_VARIANTS = ("blockscaled_sm90", "blockscaled_g128", "blockscaled_sm100")
ALL_VARIANTS = (*KERNEL_VARIANTS, "cublas_blockwise_fp8")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _uneven(rows: int, cols: int, seed: int, row_block: int, col_block: int) -> torch.Tensor:
    """N(0,1) with each (row_block x col_block) block scaled by its own power of ten in [1e-3, 1e3]:
    any scale applied to the wrong block shows up as a large error."""
    g = _gen(seed)
    x = torch.randn(rows, cols, generator=g)
    mags = 10.0 ** torch.randint(-3, 4, (-(-rows // row_block), -(-cols // col_block)), generator=g).float()
    return x * mags.repeat_interleave(row_block, 0).repeat_interleave(col_block, 1)[:rows, :cols]


def _e4m3_error_bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # e4m3 round-to-nearest: half an ulp of 3 mantissa bits (2^-4 relative) for normals, half the
    # smallest subnormal step (2^-10) in scaled units below that
    return x.abs().double() * 2.0**-4 + scale.double() * 2.0**-10


# ---- DeepSeek recipe ---------------------------------------------------------------------------

def test_deepseek_shapes_scales_and_layouts():
    M, N, K = 201, 328, 384
    A, B = _uneven(M, K, 1, 1, 128), _uneven(N, K, 2, 128, 128)
    ops = FORMATS["deepseek_1x128_128x128"].quantize(A, B)
    assert ops["A"].dtype == ops["B"].dtype == torch.float8_e4m3fn
    assert ops["A"].shape == (M, K) and ops["B"].shape == (N, K)
    assert ops["SFA"].shape == (M, 3) and ops["SFB"].shape == (3, 3)
    assert ops["SFA"].dtype == ops["SFB"].dtype == torch.float32
    # each scale is its block's amax / 448
    for i in (0, 57, 200):
        for kb in range(3):
            assert ops["SFA"][i, kb] == A[i, kb * 128 : (kb + 1) * 128].abs().max() / 448
    for nb in range(3):
        for kb in range(3):
            assert ops["SFB"][nb, kb] == B[nb * 128 : (nb + 1) * 128, kb * 128 : (kb + 1) * 128].abs().max() / 448
    # SFA_t: M-major, rows padded to a multiple of 4 with zeros, contiguous (TMA / cuBLAS layout)
    assert ops["SFA_t"].shape == (3, 204) and ops["SFA_t"].is_contiguous()
    assert torch.equal(ops["SFA_t"][:, :M], ops["SFA"].T)
    assert not ops["SFA_t"][:, M:].any()


def test_deepseek_roundtrip_error_bound():
    M, N, K = 64, 200, 300  # K not a multiple of 128: the last block is partial
    A, B = _uneven(M, K, 3, 1, 128), _uneven(N, K, 4, 128, 128)
    ops = FORMATS["deepseek_1x128_128x128"].quantize(A, B)
    a_hat, b_hat = FORMATS["deepseek_1x128_128x128"].dequantize(ops)
    sa = expand_blocks(ops["SFA"], 1, 128, M, K)
    sb = expand_blocks(ops["SFB"], 128, 128, N, K)
    assert ((a_hat - A.double()).abs() <= _e4m3_error_bound(A, sa)).all()
    assert ((b_hat - B.double()).abs() <= _e4m3_error_bound(B, sb)).all()
    # the block maximum maps to 448 and comes back as itself (up to the fp32 rounding of amax/448)
    amax_hat = a_hat.abs().reshape(M, -1).amax(dim=1)
    torch.testing.assert_close(amax_hat, A.double().abs().amax(dim=1), rtol=1e-6, atol=0)


def test_zero_blocks_get_unit_scales():
    A = torch.zeros(4, 256)
    A[1, 200] = 3.0
    B = torch.zeros(128, 256)
    ds = FORMATS["deepseek_1x128_128x128"].quantize(A, B)
    assert ds["SFA"][0].tolist() == [1.0, 1.0]
    assert ds["SFA"][1, 0] == 1.0 and ds["SFA"][1, 1] == torch.tensor(3.0) / 448
    assert ds["SFB"].tolist() == [[1.0, 1.0]] and not ds["B"].float().any()
    mx = FORMATS["mxfp8_e4m3_b32"].quantize(A, B)
    assert (mx["SFB"] == E8M0_BIAS).all() and not mx["B"].float().any()


@pytest.mark.parametrize("fmt", ["deepseek_1x128_128x128", "mxfp8_e4m3_b32", "generic_g128"])
def test_quantizers_reject_non_finite(fmt):
    A = torch.ones(4, 128)
    A[2, 3] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        FORMATS[fmt].quantize(A, torch.ones(8, 128))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def test_quantizers_are_deterministic():
    A, B = _uneven(32, 256, 5, 1, 32), _uneven(48, 256, 6, 16, 32)
    for fmt in ("deepseek_1x128_128x128", "mxfp8_e4m3_b32", "generic_g128"):
        first, second = FORMATS[fmt].quantize(A, B), FORMATS[fmt].quantize(A, B)
        assert first.keys() == second.keys()
        assert all(torch.equal(_bits(first[k]), _bits(second[k])) for k in first)


# ---- generic g128 recipe -----------------------------------------------------------------------

def test_generic_g128_per_row_scales_and_bound():
    M, N, K = 40, 72, 256
    A, B = _uneven(M, K, 7, 1, 128), _uneven(N, K, 8, 1, 128)
    ops = FORMATS["generic_g128"].quantize(A, B)
    assert ops["SFA"].shape == (M, 2) and ops["SFB"].shape == (N, 2)
    assert ops["SFA_t"].shape == (2, 40) and ops["SFB_t"].shape == (2, 72)
    assert torch.equal(ops["SFB"], B.abs().reshape(N, 2, 128).amax(dim=2) / 448)
    assert torch.equal(ops["SFB_t"][:, :N], ops["SFB"].T)
    a_hat, b_hat = FORMATS["generic_g128"].dequantize(ops)
    assert ((b_hat - B.double()).abs() <= _e4m3_error_bound(B, expand_blocks(ops["SFB"], 1, 128, N, K))).all()
    assert ((a_hat - A.double()).abs() <= _e4m3_error_bound(A, expand_blocks(ops["SFA"], 1, 128, M, K))).all()


# ---- MXFP8 and E8M0 ----------------------------------------------------------------------------

def test_mx_clamps_values_above_448_as_the_spec_scale_choice_implies():
    # amax 1.99: scale 2^(0-8), 1.99*256 = 509 > 448 -> clamped (an unclamped torch cast would give NaN)
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 1.99, 0.5
    q, codes = bsf.quantize_mxfp8(x)
    assert codes.tolist() == [[127 - 8]]
    assert q.float()[0, 0] == 448 and q.float()[0, 1] == 128
    a_hat, _ = bsf.dequantize_mx({"A": q, "B": q, "SFA": codes, "SFB": codes})
    assert a_hat[0, 0] == 1.75 and a_hat[0, 1] == 0.5


def test_mx_roundtrip_error_bound():
    M, K = 64, 320  # K = 10 blocks of 32
    A = _uneven(M, K, 9, 1, 32)
    q, codes = bsf.quantize_mxfp8(A)
    assert codes.dtype == torch.uint8 and codes.shape == (M, 10)
    assert q.float().abs().max() <= 448
    s = expand_blocks(e8m0_decode(codes), 1, 32, M, K).double()
    a_hat = q.double() * s
    err = (a_hat - A.double()).abs()
    clamp_excess = (A.double().abs() - 448 * s).clamp(min=0)
    assert (err <= torch.maximum(A.double().abs() * 2.0**-4, clamp_excess) + s * 2.0**-10).all()
    # the scaled block maximum lands in [256, 512): the OCP choice never under-uses the range
    scaled_amax = (A.double() / s).abs().reshape(M, 10, 32).amax(dim=2)
    assert ((scaled_amax >= 256) & (scaled_amax < 512)).all()


def test_tcgen05_cp_layout_of_e8m0_words():
    R, nblk = 200, 10  # 10 codes -> 3 words (the last padded with scale 1)
    codes = torch.randint(0, 255, (R, nblk), generator=_gen(10)).to(torch.uint8)
    words = pack_e8m0_words(codes)
    lay = bsf.utccp_scale_layout(words)
    assert lay.shape == (3, 256) and lay.is_contiguous()
    for k in range(3):
        for c in range(2):
            for lane in (0, 5, 31):
                for q in range(4):
                    row = c * 128 + 32 * q + lane
                    want = words[row, k] if row < R else 0x7F7F7F7F
                    assert lay[k, c * 128 + 4 * lane + q] == want


def test_mx_format_operands():
    A, B = _uneven(200, 256, 11, 1, 32), _uneven(72, 256, 12, 8, 32)
    ops = FORMATS["mxfp8_e4m3_b32"].quantize(A, B)
    assert ops["SFA"].shape == (200, 8) and ops["SFB"].shape == (72, 8)
    assert ops["SFA_words"].shape == (2, 256) and ops["SFB_words"].shape == (2, 128)
    assert torch.equal(ops["SFA_words"], bsf.utccp_scale_layout(pack_e8m0_words(ops["SFA"])))


# ---- emulation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_emulation_matches_dequantized_float64_reference(name):
    # uneven block magnitudes: a scale applied to the wrong row, column or K block would be far off
    variant = VARIANTS[name]
    fmt = FORMATS[variant.input_format]
    M, N, K = 96, 328, 512
    A, B = _uneven(M, K, 13, 16, 32), _uneven(N, K, 14, 128, 32)
    ops = fmt.quantize(A, B)
    out = variant.emulate(ops)
    assert out.dtype == torch.bfloat16 and out.shape == (M, N)
    a_hat, b_hat = fmt.dequantize(ops)
    ref = a_hat @ b_hat.T
    assert rel_fro(out, ref) < 4e-3  # bf16 output rounding dominates (~1.7e-3)
    assert calc_diff(out, ref) < 1e-5


def test_promotion_scales_each_k_block_separately():
    # two K blocks of A with different scales (1/448, 3/448): 128*1 + 128*3 = 512; applying the first
    # block's scale to the whole K would give 256
    A = torch.ones(1, 256)
    A[0, 128:] = 3.0
    B = torch.ones(128, 256)
    ops = FORMATS["deepseek_1x128_128x128"].quantize(A, B)
    assert torch.equal(ops["SFA"], torch.tensor([[1.0, 3.0]]) / 448)
    out = bs.emulate_blockscaled_sm90(ops)
    assert (out.float() == 512).all()


@pytest.mark.parametrize("name", ALL_VARIANTS)
def test_calc_diff_gate_on_normal_inputs(name):
    # the gate: calc_diff < 1e-3 against float64 of the unquantized N(0,1) inputs
    variant = VARIANTS[name]
    g = _gen(15)
    A, B = torch.randn(256, 1024, generator=g), torch.randn(256, 1024, generator=g)
    out = variant.emulate(FORMATS[variant.input_format].quantize(A, B))
    assert calc_diff(out, A.double() @ B.double().T) < 1e-3


# ---- kernel factories and launches -------------------------------------------------------------

@pytest.mark.parametrize("name,tile", [("blockscaled_sm90", "m128n128k128_s3_t384"),
                                       ("blockscaled_g128", "m128n128k128_s3_t256_wrow"),
                                       ("blockscaled_sm100", "m128n128k128_s1_t128")])
def test_kernels_require_k_multiple_of_128(name, tile):
    with pytest.raises(Unsupported, match="multiple of 128"):  # the declared shape_limit: a known refusal
        VARIANTS[name].kernel(256, 256, 200, parse_tile(tile))


def test_shape_limits_name_the_k_rule():
    for name in KERNEL_VARIANTS:
        assert VARIANTS[name].shape_limit(256, 328, 512) is None
        assert "divisible by 128" in VARIANTS[name].shape_limit(256, 328, 200)
    assert VARIANTS["cublas_blockwise_fp8"].shape_limit(201, 336, 384) is None
    assert "divisible by 16" in VARIANTS["cublas_blockwise_fp8"].shape_limit(256, 330, 384)


@pytest.mark.parametrize("name,tile,msg", [
    ("blockscaled_sm90", "m128n128k64_s3_t384", "block_K must be 128"),
    ("blockscaled_sm90", "m128n176k128_s3_t384", "straddle three"),
    ("blockscaled_sm90", "m128n128k128_s3_t256_wrow", "threads must be 384"),
    ("blockscaled_g128", "m128n128k64_s3_t256", "block_K must be 128"),
    ("blockscaled_g128", "m128n192k128_s3_t256", "block_N must be 64, 128 or 256"),
    ("blockscaled_sm100", "m128n128k128_s3_t128", "num_stages must be 1"),
    ("blockscaled_sm100", "m64n128k128_s1_t128", "block_M must be 128"),
])
def test_kernels_reject_tiles_they_cannot_run(name, tile, msg):
    with pytest.raises(ValueError, match=msg):
        VARIANTS[name].kernel(256, 256, 256, parse_tile(tile))


_TILES = {"blockscaled_sm90": "m128n256k128_s3_t384_z16", "blockscaled_g128": "m128n128k128_s3_t256_wrow",
          "blockscaled_sm100": "m128n256k128_s1_t128"}


@pytest.mark.parametrize("name", KERNEL_VARIANTS)
def test_launch_passes_what_the_kernel_declares(name):
    variant = VARIANTS[name]
    M, N, K = 201, 328, 256
    ops = FORMATS[variant.input_format].quantize(_uneven(M, K, 16, 1, 32), _uneven(N, K, 17, 1, 32))
    prim = variant.kernel(M, N, K, parse_tile(_TILES[name]))
    params = [prim.buffer_map[p] for p in prim.params]
    inputs = [p for i, p in enumerate(params) if i not in variant.out_idx]
    seen = []

    def fake_kernel(*args):
        seen.extend(args)
        return torch.zeros(M, N, dtype=torch.bfloat16)

    variant.launch(fake_kernel, ops)
    assert len(seen) == len(inputs)
    for arg, buf in zip(seen, inputs, strict=True):
        assert tuple(arg.shape) == tuple(int(s) for s in buf.shape), buf.name
        assert str(arg.dtype).removeprefix("torch.") == str(buf.dtype), buf.name
        assert arg.is_contiguous(), buf.name


def _torch_blockwise_checks(a, b, scale_a, scale_b, pitch_multiple=1):
    """torch._scaled_mm's DeepSeek-recipe acceptance (ScaledBlas.cpp, is_blockwise_1x128 / 128x128_scaling)."""
    M, K = a.shape
    N = b.shape[1]
    kb = -(-K // 128)
    sbt = scale_b.t()  # checked against b.t() == B (N, K)
    return (scale_a.dtype == torch.float32 and scale_a.shape == (M, kb) and scale_a.stride() == (1, M)
            and scale_b.dtype == torch.float32 and sbt.shape == (-(-N // 128), kb)
            and sbt.stride() == (-(-kb // pitch_multiple) * pitch_multiple, 1) and b.stride(0) == 1)


@pytest.mark.parametrize("M,K,pitch", [(256, 512, 1), (201, 384, 1), (256, 384, 4)])
def test_cublas_launch_uses_the_scale_layouts_torch_checks(monkeypatch, M, K, pitch):
    N = 328
    ops = FORMATS["deepseek_1x128_128x128"].quantize(_uneven(M, K, 18, 1, 128), _uneven(N, K, 19, 128, 128))
    expected = bs.emulate_blockscaled_sm90(ops)
    calls = []

    def fake_scaled_mm(a, b, scale_a, scale_b, out_dtype, use_fast_accum):
        calls.append(1)
        if not _torch_blockwise_checks(a, b, scale_a, scale_b, pitch):
            raise RuntimeError("Invalid scaling configuration")
        assert out_dtype == torch.bfloat16 and use_fast_accum is False
        ref = bs.emulate_promoted(a, b.t(), scale_a, scale_b.t().repeat_interleave(128, 0)[:N], 128)
        return ref

    monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm)
    v = VARIANTS["cublas_blockwise_fp8"]
    run_ops = prepared(v, ops)  # the scale layouts are made here, once, outside the timed call
    # where the two pitches torch builds ask for differ (K/128 not a multiple of 4), the prepare makes one
    # untimed call to learn which this build takes; the operands carry the answer
    probes = 1 if -(-K // 128) % 4 else 0
    assert len(calls) == probes
    out = v.launch(None, run_ops)
    assert torch.equal(out, expected)
    v.launch(None, run_ops)
    assert len(calls) == probes + 2  # each timed call is one library call, no retry


# ---- compile checks (local nvcc, no GPU) -------------------------------------------------------

@pytest.mark.compile
def test_g128_kernel_compiles_to_fp8_wgmma_with_promotion(kernels):
    # blockscaled_sm90's warp-specialized kernel: tests/test_blockscaled_sm90.py
    src = kernels("blockscaled_g128", "m128n128k128_s4_t256_wrow_z8", "sm_90a").source
    assert re.search(VARIANTS["blockscaled_g128"].instructions["sm_90a"], src)
    # a fresh partial sum per K block (scale-d 0 on the first wgmma) and a promotion FMA through the scales
    assert "tl::warpgroup_wait<0>()" in src and "SFA_s" in src


@pytest.mark.compile
def test_sm100_kernel_compiles_to_block_scaled_tcgen05(kernels):
    src = kernels("blockscaled_sm100", "m128n128k128_s1_t128", "sm_100a").source
    assert re.search(VARIANTS["blockscaled_sm100"].instructions["sm_100a"], src)
    assert "tcgen05_cp" in src  # scale words moved to tensor memory
    assert "(ki << 29)" in src and "(ki << 4)" in src  # per-32-K scale byte selected in the instr. descriptor


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90a", "sm_89"])
def test_gemm_blockscaled_does_not_lower_off_blackwell(arch):
    # declared unsupported there; without the declaration TileLang itself refuses (a recognised refusal)
    v = VARIANTS["blockscaled_sm100"]
    tile = parse_tile("m128n128k128_s1_t128")
    with pytest.raises(UnsupportedTarget, match="Block-scaled GEMM requires either Blackwell SM100"):
        build(v, *CANONICAL_SHAPE, tile, arch)
    with pytest.raises(UnsupportedTarget, match="rule blockscaled_mma_target") as refused:
        build(dataclasses.replace(v, unsupported={}), *CANONICAL_SHAPE, tile, arch)  # as the pipeline compiles it
    assert "Block-scaled GEMM requires either Blackwell SM100" in str(refused.value.__cause__)
