"""W4A16 dequantize family: quantizers, emulation, the CUDA decoder (run on the host through g++) and
sm_90a compiles of the decode and prefill tile forms. CPU only. The packing, e2m1 and E8M0 codes
(kernels.formats) are tested in tests/test_formats.py."""
import dataclasses
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

import kernels.baselines  # noqa: F401  (registers cublas_bf16)
from harness.metrics import rel_fro
from harness.runner import prepared
from kernels import dequant as dq
from kernels import dequant_formats as dqf
from kernels import dequant_w4 as dqw
from kernels import peers
from kernels.formats import unpack_int4
from kernels.registry import FORMATS, VARIANTS
from kernels.tiles import parse_tile

FORMAT_NAMES = list(dqf.W4_FORMATS)


def _inputs(M=16, N=256, K=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)


# ---------------------------------------------------------------- quantizers


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_quantize_layout_and_determinism(name):
    fmt = dqf.W4_FORMATS[name]
    A, B = _inputs()
    ops = FORMATS[name].quantize(A, B)
    again = FORMATS[name].quantize(A, B)
    assert all(torch.equal(ops[k], again[k]) for k in ops)
    N, K = B.shape
    assert ops["A"].dtype == torch.bfloat16 and ops["B"].dtype == torch.int8 and ops["B"].shape == (N, K // 2)
    assert ops["scales"].shape == (K // fmt.group, N) and ops["scales"].is_contiguous()
    assert ops["scales"].dtype == (torch.uint8 if fmt.scale == "e8m0" else torch.bfloat16)
    assert ("zeros" in ops) == fmt.has_zeros
    if fmt.has_zeros:
        z = ops["zeros"].float()
        assert ops["zeros"].dtype == torch.bfloat16 and torch.equal(z, z.round()) and 0 <= z.min() and z.max() <= 15


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_quantize_error_bounds(name):
    """Elementwise: half a quantization step (int) or a quarter of the value (e2m1) per group scale."""
    fmt = dqf.W4_FORMATS[name]
    _, B = _inputs(N=128, K=1024, seed=1)
    ops = dqf.quantize_weight(B, fmt)
    w = dqf.dequantize_weight(ops, fmt)
    err = (w - B.double()).abs()
    s = dqf.weight_scales(ops, fmt).double()
    if fmt.codes == "int4":
        assert bool((err <= 0.5 * s * (1 + 1e-6)).all())
    elif fmt.codes == "uint4_zp":  # the top code can clamp by a rounding of the scale
        assert bool((err <= 0.55 * s).all())
    else:
        assert bool((err <= torch.maximum(0.25 * s, 0.25 * B.double().abs()) * (1 + 1e-6)).all())
    bound = {"w4_int4_sym_g128": 0.13, "w4_uint4_zp_g128": 0.115, "w4_e2m1_g32": 0.115, "w4_mxfp4": 0.13}[name]
    assert 0.05 < rel_fro(w, B) < bound  # N(0,1): int4 g128 ~11.8 % sym, ~10.1 % with zero point


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_quantize_zero_group_and_bad_k(name):
    fmt = dqf.W4_FORMATS[name]
    B = torch.zeros(2, 2 * fmt.group)
    B[1, : fmt.group] = torch.linspace(-1, 1, fmt.group)
    ops = dqf.quantize_weight(B, fmt)
    w = dqf.dequantize_weight(ops, fmt)
    assert not w[0].any() and not w[1, fmt.group:].any()
    assert bool(torch.isfinite(w).all())
    with pytest.raises(ValueError):
        dqf.quantize_weight(torch.zeros(2, fmt.group + 2), fmt)


def test_int4_sym_scale_and_values():
    fmt = dqf.W4_FORMATS["w4_int4_sym_g128"]
    B = torch.zeros(1, 128)
    B[0, :3] = torch.tensor([7.0, -3.5, 1.0])  # scale 1: q = 7, -4 (half to even), 1
    ops = dqf.quantize_weight(B, fmt)
    assert float(ops["scales"][0, 0]) == 1.0
    assert unpack_int4(ops["B"])[0, :4].tolist() == [7, -4, 1, 0]


# ---------------------------------------------------------------- emulation and baselines


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("M", [1, 16])
def test_emulation_is_bf16_level_vs_float64_of_dequantized(name, M):
    A, B = _inputs(M=M)
    ops = FORMATS[name].quantize(A, B)
    a_hat, b_hat = FORMATS[name].dequantize(ops)
    assert a_hat.dtype == b_hat.dtype == torch.float64
    out = VARIANTS[f"dequant_{name}"].emulate(ops)
    assert out.dtype == torch.bfloat16 and out.shape == (M, B.shape[0])
    err = rel_fro(out, a_hat @ b_hat.T)
    assert 1e-4 < err < 5e-3  # bf16 rounding of the decoded weights and of the output, nothing more


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_decoded_weight_is_one_bf16_rounding_of_value_times_scale(name):
    fmt = dqf.W4_FORMATS[name]
    _, B = _inputs(N=64, K=256, seed=2)
    ops = dqf.quantize_weight(B, fmt)
    w = dqf.decode_weight_bf16(ops, fmt)
    exact = dqf.dequantize_weight(ops, fmt)  # value·scale is exact in float32, so this rounds once
    assert torch.equal(w, exact.float().to(torch.bfloat16))
    if fmt.scale == "e8m0":  # power-of-two scales: decoding is exact
        assert torch.equal(w.double(), exact)


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_torch_baseline_launch_on_cpu(name):
    A, B = _inputs(M=4)
    ops = FORMATS[name].quantize(A, B)
    v = VARIANTS[f"torch_dequant_matmul_{name}"]
    assert v.kernel is None and v.input_format == name
    out = v.launch(None, ops)
    assert out.shape == (4, B.shape[0]) and out.dtype == torch.bfloat16
    assert rel_fro(out, v.emulate(ops)) < 8e-3


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_tilelang_launch_passes_operands_in_kernel_order(name):
    A, B = _inputs(M=2, N=64, K=256)
    v = VARIANTS[f"dequant_{name}"]
    ops = prepared(v, FORMATS[name].quantize(A, B))  # prepare adds the dummy zeros, once
    seen = []
    v.launch(lambda *args: seen.append(args) or "out", ops)
    (args,) = seen
    assert len(args) == 4 and args[0] is ops["A"] and args[2] is ops["scales"]
    fmt = dqf.W4_FORMATS[name]  # arranged once, the int4 decodes' codes 16 bits apart
    assert torch.equal(args[1], dqw.arrange_packed(ops["B"], dqw.packed_arrangement(fmt)))
    assert args[1] is ops["B_arranged"]
    if fmt.has_zeros:
        assert args[3] is ops["zeros"]
    else:
        assert args[3].shape == (1,) and args[3].dtype == torch.bfloat16


def test_variant_registration():
    for name in FORMAT_NAMES:
        v = VARIANTS[f"dequant_{name}"]
        assert v.family == "dequant" and v.input_format == name and v.out_idx == (4,)
        assert "sm_90a" in v.instructions
    assert VARIANTS["cublas_bf16"].input_format == "bf16"  # the unquantized baseline is reused


# ---------------------------------------------------------------- tiles


# recommended sm_90a tiles per M class (see the report); they must fit every format and sweep K
RECOMMENDED = ["m16n64k256_s6_t128_wrow", "m64n64k256_s4_t128_wrow", "m128n64k128_s4_t128_wrow",
               "m256n128k64_s4_t256_wrow_z8"]


def test_check_tile_rejects_misfits():
    fmt = dqf.W4_FORMATS["w4_int4_sym_g128"]
    for f in dqf.W4_FORMATS.values():
        for name in RECOMMENDED:
            for K in (8192, 28672):
                dqw.check_dequant_w4_tile(f, K, parse_tile(name))
    for bad, K in [
        ("m16n64k256_s4_t128", 512),  # Square policy
        ("m16n64k256_s4_t192_wrow", 512),  # threads do not match 64 rows per warpgroup (and a producer)
        ("m16n192k64_s4_t512_wrow", 512),  # the overlapped form has one or two consumer warpgroups
        ("m16n64k96_s4_t128_wrow", 576),  # 96 and 128 do not divide one another
        ("m16n64k256_s4_t128_wrow", 384),  # K not a multiple of block_K
        ("m12n64k256_s4_t128_wrow", 512),  # wgmma N must be a multiple of 8
        ("m16n64k512_s2_t128_wrow_split4", 1536),  # 3 K blocks for 4 CTAs
        ("m128n64k128_s4_t128_wrow_split2", 8192),  # the prefill form does not split K
        ("m16n64k256_s4_t128_wrow_split16", 8192),  # more than a portable cluster
    ]:
        with pytest.raises(ValueError):
            dqw.check_dequant_w4_tile(fmt, K, parse_tile(bad))
    dqw.check_dequant_w4_tile(fmt, 14336, parse_tile("m8n64k256_s4_t128_wrow_split8"))  # 56 K blocks, 7 per CTA
    # the model's pick at 2048x3584x18944 before TileLang's limit was known: its codegen swizzles clusters along x only
    with pytest.raises(ValueError, match="takes no raster swizzle"):
        dqw.check_dequant_w4_tile(fmt, 18944, parse_tile("m128n128k128_s3_t384_wrow_z8_split2"))


def test_the_tile_picks_the_form():
    """A producer warpgroup beside the consumers (threads 128·(block_N/64 + 1)) is the overlapped form, at any
    block_M; without it block_M decides between the decode form and TileLang's warp-specialized prefill form."""
    from kernels.registry import pass_configs_for
    from kernels.warp_specialized import PASS_CONFIGS

    v = VARIANTS["dequant_w4_int4_sym_g128"]
    forms = {name: (dqw.overlapped_form(parse_tile(name)), dqw.decode_form(parse_tile(name))) for name in [
        "m16n64k256_s4_t256_wrow_split2", "m256n128k64_s4_t384_wrow", "m16n64k256_s4_t128_wrow",
        "m256n128k64_s4_t256_wrow_z8"]}
    assert forms == {"m16n64k256_s4_t256_wrow_split2": (True, False), "m256n128k64_s4_t384_wrow": (True, False),
                     "m16n64k256_s4_t128_wrow": (False, True), "m256n128k64_s4_t256_wrow_z8": (False, False)}
    assert pass_configs_for(v, "sm_90a", parse_tile("m256n128k64_s4_t384_wrow")) == PASS_CONFIGS
    fmt = dqf.W4_FORMATS["w4_int4_sym_g128"]
    dqw.check_dequant_w4_tile(fmt, 18944, parse_tile("m8n64k256_s4_t256_wrow_split4"))  # 74 K blocks: uneven
    dqw.check_dequant_w4_tile(fmt, 8192, parse_tile("m256n128k64_s4_t384_wrow"))


def test_the_selection_ranks_the_overlapped_form_within_its_limits():
    """The tile space offers the overlapped form (t256 at block_N 64, t384 at 128) beside the other two, with K
    blocks of at most 256 (128 with two consumers) and block_M of at least 64 (below, the decode form was measured
    faster), and the model charges its K blocks the slower of decode and wgmma: at a prefill-sized shape it is
    predicted faster than the prefill form of the same blocks."""
    from harness.plan import load_config
    from harness.selection import PlatformModel, predict_us
    from kernels.tile_space import candidates

    v = VARIANTS["dequant_w4_int4_sym_g128"]
    for M, N, K in [(64, 8192, 8192), (256, 8192, 8192), (4096, 8192, 8192)]:
        tiles = candidates(v, M, N, K, "sm_90a")
        overlapped = [t for t in tiles if dqw.overlapped_form(t)]
        assert overlapped and len(overlapped) < len(tiles)
        assert all(t.block_K <= (128 if t.block_N == 128 else 256) and t.block_M >= 64 for t in overlapped)
    assert all(t.block_M >= 64 for t in candidates(v, 16, 8192, 8192, "sm_90a") if dqw.overlapped_form(t))
    assert "at most 256" in v.tile_space.rule(64, 8192, 8192, parse_tile("m64n64k512_s2_t256_wrow_split2"))
    assert "at most 256" in v.tile_space.rule(64, 8192, 8192, parse_tile("m64n128k256_s2_t384_wrow_split2"))
    assert "at least 64" in v.tile_space.rule(16, 8192, 8192, parse_tile("m16n128k128_s4_t384_wrow_split2"))
    h200 = PlatformModel.from_config("h200", load_config()["platforms"]["h200"])
    overlapped, prefill = parse_tile("m128n128k64_s4_t384_wrow"), parse_tile("m128n128k64_s4_t256_wrow")
    assert predict_us(v, 4096, 8192, 8192, overlapped, h200) < predict_us(v, 4096, 8192, 8192, prefill, h200)


# ---------------------------------------------------------------- the CUDA decoder on the host

# (KIND, BK, GROUP, BN, ARRANGED): one and two warpgroups (panels), one or several groups per K block, K blocks of
# 64-512, byte-arranged spans (1) and a pair's codes 16 bits apart (2, the int4 decodes)
DECODER_CONFIGS = [
    (0, 64, 128, 128, 1), (1, 128, 128, 64, 1), (2, 64, 32, 64, 1), (3, 128, 32, 128, 1),
    (0, 512, 128, 64, 1), (1, 256, 128, 64, 1), (2, 256, 32, 64, 1), (3, 512, 32, 64, 1), (2, 512, 32, 128, 1),
    (0, 64, 128, 128, 2), (1, 128, 128, 64, 2), (0, 512, 128, 64, 2), (1, 256, 128, 64, 2), (0, 256, 128, 128, 2),
]
KIND_FORMAT = {f.kind: f for f in dqf.W4_FORMATS.values()}

HOST_HARNESS = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
static float dq_host_bf16(uint32_t bits) { uint32_t u = bits << 16; float f; memcpy(&f, &u, 4); return f; }
static uint32_t dq_host_round_bf16(double r) {  // round to nearest even, 8 significant bits
  if (r == 0) return std::signbit(r) ? 0x8000u : 0u;
  int ex;
  double m = std::nearbyint(std::frexp(r, &ex) * 256.0) / 256.0;
  float f = (float)std::ldexp(m, ex);
  uint32_t u; memcpy(&u, &f, 4);
  return u >> 16;
}
static uint32_t dq_host_fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r = 0;
  for (int sh = 0; sh < 32; sh += 16) {
    double x = (double)dq_host_bf16((a >> sh) & 0xFFFF) * dq_host_bf16((b >> sh) & 0xFFFF)
               + dq_host_bf16((c >> sh) & 0xFFFF);
    r |= dq_host_round_bf16(x) << sh;
  }
  return r;
}
#include "dequant_w4_decode.cuh"
template <int KIND, int BK, int G, int BN, int AR>
static int run() {
  constexpr int SG = BK >= G ? BK / G : 1;
  static uint8_t packed[BN * BK / 2], scales[SG * BN * 2], zeros[SG * BN * 2];
  const size_t sbytes = SG * BN * (KIND == 3 ? 1 : 2);
  if (fread(packed, 1, sizeof packed, stdin) != sizeof packed || fread(scales, 1, sbytes, stdin) != sbytes ||
      fread(zeros, 1, SG * BN * 2, stdin) != (size_t)(SG * BN * 2)) return 2;
  for (int tid = 0; tid < 2 * BN; ++tid) {
    uint32_t frag[BK / 4];
    dq_decode_fragment<KIND, BK, G, BN, AR>(frag, packed, scales, zeros, tid);
    fwrite(frag, 4, BK / 4, stdout);
  }
  return 0;
}
int main(int argc, char** argv) {
  switch (atoi(argv[1])) {
@CASES@
  }
  return 1;
}
"""


@pytest.fixture(scope="module")
def host_decoder(tmp_path_factory):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ not available: the CUDA decoder cannot be run on the host")
    cases = "\n".join(f"    case {i}: return run<{k}, {bk}, {g}, {bn}, {ar}>();"
                      for i, (k, bk, g, bn, ar) in enumerate(DECODER_CONFIGS))
    src = HOST_HARNESS.replace("@CASES@", cases)
    d = tmp_path_factory.mktemp("decoder")
    (d / "harness.cpp").write_text(src)
    # the decoder file itself, the one the kernel's Python reads and pastes into the generated CUDA
    include = str(dqw.DECODE_CUDA_FILE.parent)
    subprocess.run([cxx, "-std=c++17", "-O1", "-I", include, "-o", str(d / "harness"), str(d / "harness.cpp")], check=True)
    return d / "harness"


@pytest.mark.parametrize("cfg", range(len(DECODER_CONFIGS)))
def test_cuda_decoder_on_host_matches_emulation(host_decoder, cfg):
    """Every thread's fragment, placed by the layout annotated on the kernel, equals bf16_rn(value·scale)."""
    kind, BK, G, BN, arranged = DECODER_CONFIGS[cfg]
    fmt = KIND_FORMAT[kind]
    SG = max(BK // G, 1)
    gen = torch.Generator().manual_seed(100 + cfg)
    packed = torch.randint(-128, 128, (BN, BK // 2), generator=gen, dtype=torch.int8)
    if fmt.scale == "e8m0":
        scales = torch.randint(110, 140, (SG, BN), generator=gen, dtype=torch.uint8)
        sbytes = scales.numpy().tobytes()
    else:
        scales = torch.exp(torch.randn(SG, BN, generator=gen)).to(torch.bfloat16)
        sbytes = scales.view(torch.int16).numpy().tobytes()
    zeros = torch.randint(0, 16, (SG, BN), generator=gen).to(torch.bfloat16)
    # one K block as the kernel's prepare arranges the weight (and the copy brings it to shared memory as is)
    stored = dqw.arrange_packed(packed, arranged)
    stdin = stored.numpy().tobytes() + sbytes + zeros.view(torch.int16).numpy().tobytes()
    proc = subprocess.run([str(host_decoder), str(cfg)], input=stdin, capture_output=True, check=True)
    frags = np.frombuffer(proc.stdout, dtype=np.uint16).reshape(2 * BN, BK // 2)

    tile_fmt = dataclasses.replace(fmt, group=min(G, BK))  # one K block: its own groups only
    ops = {"B": packed, "scales": scales, "zeros": zeros}
    want = dqf.decode_weight_bf16(ops, tile_fmt).view(torch.int16).numpy().view(np.uint16)
    i, j = np.meshgrid(np.arange(BN), np.arange(BK), indexing="ij")
    got = frags[dqw.fragment_thread(i, j), dqw.fragment_index(i, j)]
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- sm_90a compiles


# at the compile-check shape; the tile decides the form (dqw.decode_form), not the shape


@pytest.mark.compile
@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_compile_decode_form_sm90a(kernels, name):
    """A decode tile (block_M 16): 16 rows of A as the wgmma N, the decoded weight fragment the register operand."""
    src = kernels(f"dequant_{name}", "m16n64k128_s2_t128_wrow").source
    assert re.search(VARIANTS[f"dequant_{name}"].instructions["sm_90a"], src)
    assert re.search(dq.WGMMA_RS_BF16 + r", 64, 16, 16,", src)  # m64n16k16: 16 rows of A
    fmt = dqf.W4_FORMATS[name]
    assert f"dq_decode_fragment<{fmt.kind}, 128, {fmt.group}, 64, {dqw.packed_arrangement(fmt)}>" in src
    assert "wgmma_ss" not in src and "mma_sync" not in src


@pytest.mark.compile
@pytest.mark.parametrize("name", ["w4_int4_sym_g128", "w4_mxfp4"])
def test_compile_prefill_form_sm90a(kernels, name):
    """Two consumer warpgroups x 64 weight rows, 256 rows of A as the wgmma N."""
    src = kernels(f"dequant_{name}", "m256n128k64_s4_t256_wrow_z8").source
    assert re.search(dq.WGMMA_RS_BF16 + r", 64, 256, 16,", src)  # m64n256k16
    assert "wgmma_ss" not in src and "mma_sync" not in src


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_89", "sm_100a"])
def test_compile_other_targets_use_bf16_mma_sync(kernels, arch):
    """No wgmma there: the same kernel builds with mma.sync (same per-warp A fragment layout)."""
    v = VARIANTS["dequant_w4_int4_sym_g128"]
    src = kernels(v.name, "m16n64k128_s2_t128_wrow", arch).source
    assert "dq_decode_fragment<0, 128, 128, 64, 2>" in src
    assert re.search(v.instructions[arch], src) and "wgmma" not in src


def test_decoder_source_names_no_matrix_instruction():
    # harness.compile classifies a kernel by searching its whole source, imported code included
    assert not re.search(r"wgmma|mma|tcgen05", dqw.DECODE_CUDA_SOURCE)


# ---------------------------------------------------------------- the decode and prefill forms


def test_decode_tiles_drop_tilelang_warp_specialization():
    from kernels.registry import pass_configs_for

    v = VARIANTS["dequant_w4_int4_sym_g128"]
    assert pass_configs_for(v, "sm_90a", parse_tile("m16n64k512_s2_t128_wrow")) == {"tl.disable_warp_specialized": True}
    assert pass_configs_for(v, "sm_90a", parse_tile("m64n64k256_s4_t128_wrow")) == {"tl.disable_warp_specialized": True}
    assert pass_configs_for(v, "sm_90a", parse_tile("m256n128k64_s4_t256_wrow_z8")) is None  # TileLang's defaults
    assert pass_configs_for(v, "sm_89", parse_tile("m16n64k512_s2_t128_wrow")) is None


@pytest.mark.compile
def test_compile_decode_form_copies_its_k_block_as_one_piece_sm90a(kernels):
    """block_K 512 in a decode tile: no producer warpgroup (no setmaxnreg); the panel's K block (64 rows x 256
    bytes, prepared span-major) is one contiguous 16 KB piece, copied by 128 threads x 16 bytes, 2 KB apart per
    step, into a linear shared tile (no swizzle: the decoder's reads are conflict-free as laid out)."""
    src = kernels("dequant_w4_int4_sym_g128", "m8n64k512_s2_t128_wrow").source
    assert "dq_decode_fragment<0, 512, 128, 64, 2>" in src
    assert "setmaxnreg" not in src
    copies = re.findall(r"cp_async_gs<16>\(\(&\(\(\(signed char\*\)B_shared\)\[(.*?)\]\)\), \(&\(B\[(.*?)\]\)\)\)", src)
    assert copies and all("(((int)threadIdx.x) * 16)" in dst and "* 2048)" in dst and
                          "(((int)threadIdx.x) * 16)" in glob and "* 2048)" in glob for dst, glob in copies)
    assert not re.search(r"\^ \(\(\(int\)threadIdx\.x\)", src)
    assert re.search(dq.WGMMA_RS_BF16 + r", 64, 8, 16,", src)


@pytest.mark.compile
def test_compile_uneven_split_runs_the_longer_count_and_adds_only_its_own_blocks(kernels):
    """K = 1536 is 6 blocks of 256 over a split of 4: CTAs 0 and 1 run one block each (0, 1) and load the next
    CTA's first without adding it, CTAs 2 and 3 run two (2-3, 4-5). TileLang's pipeline wants a static trip
    count (2 here)."""
    k = kernels("dequant_w4_int4_sym_g128", "m16n64k256_s2_t128_wrow_split4", "sm_90a", (16, 256, 1536))
    assert k.record["status"] == "ok", k.record.get("reason")
    src = k.source
    assert re.search(r"max\(\(\(\(int\)blockIdx\.z\) - 2\), 0\)", src)  # CTA 3 starts one block later
    assert re.search(r"if \(2 <= \(\(int\)blockIdx\.z\)\)", src)  # the last block is the longer CTAs' only
    assert src.count("dq_decode_fragment<0, 256, 128, 64, 2>(") == 2  # the pipeline's 2 iterations, unrolled


@pytest.mark.compile
def test_compile_split_decode_tile_reduces_through_its_cluster(kernels):
    """The configured split tile (m16 class) at its compile-check shape, the build test_instruction_checks and the
    main job's compile check make too: a z axis of 2 CTAs per output tile, each over half of K, and the
    cluster reduction before the store, which only rank 0 makes."""
    k = kernels("dequant_w4_int4_sym_g128", "m8n64k512_s2_t128_wrow_split2", "sm_90a", (256, 256, 1024))
    assert k.record["status"] == "ok", k.record.get("reason")
    src = k.source
    assert "dq_cluster_reduce<4, 128>" in src and "barrier.cluster.arrive.release" in src
    assert re.search(r"if \(leader\[0\] == 1\)", src)  # only rank 0 stores C
    assert re.search(r"\(\(int\)blockIdx\.z\)", src)  # the CTA's half of K


def early_accumulator_reads(sass: str) -> list[str]:
    """SASS instructions that read an HGMMA's accumulator registers after it and before the next wait for all
    wgmmas (``WARPGROUP.DEPBAR.LE gsb0, 0x0``): the sums of a wgmma still in flight."""
    early, acc = [], None
    for line in sass.splitlines():
        ins = re.sub(r"/\*[^*]*\*/", "", line.split(";")[0]).strip()
        if m := re.search(r"HGMMA\.64x(\d+)x\d+\.F32\S*\s+R(\d+)", ins):
            acc = set(range(int(m.group(2)), int(m.group(2)) + int(m.group(1)) // 2))  # 64 x N fp32 over 128 threads
        elif acc is not None and "WARPGROUP.DEPBAR.LE gsb0, 0x0" in ins:
            acc = None
        elif acc is not None and "WARPGROUP" not in ins and {int(r) for r in re.findall(r"\bR(\d+)\b", ins)} & acc:
            early.append(ins)
    return early


@pytest.mark.compile
@pytest.mark.parametrize("name,tile,shape", [
    ("w4_int4_sym_g128", "m256n128k64_s4_t384_wrow", (256, 256, 1024)),
    ("w4_int4_sym_g128", "m128n64k64_s4_t256_wrow", (128, 256, 1024)),  # spare registers: the sums read early before
    ("w4_uint4_zp_g128", "m16n64k256_s4_t256_wrow_split2", (256, 256, 1024)),
    ("w4_mxfp4", "m16n64k256_s4_t256_wrow_split4", (16, 256, 2304)),  # 9 K blocks over 4 CTAs: uneven, odd count
])
def test_compile_overlapped_form_keeps_its_wgmmas_in_flight(kernels, name, tile, shape):
    """The overlapped form: the producer gives up registers (setmaxnreg), the consumers decode into two fragments
    in turn and wait for all but the last wgmma batch (``wait_wgmma(1)``); ptxas must not serialize them (C7512-
    C7514 would put a ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` after every HGMMA). The last block waits for all in place,
    and nothing reads the sums before that wait: with the wait after the loop, ptxas scheduled the epilogue's
    conversions above it where registers allowed (m128n64k64: a third of the last K block lost, on the GPU)."""
    k = kernels(f"dequant_{name}", tile, "sm_90a", shape)
    assert k.record["status"] == "ok", k.record.get("reason")
    src, sass = k.source, k.sass
    assert "warpgroup_reg_dealloc<40>" in src and "tl::wait_wgmma<1>();" in src
    fmt = dqf.W4_FORMATS[name]
    t = parse_tile(tile)
    count = -(-shape[2] // t.block_K // t.split_k)  # every CTA runs the longer count; an odd one peels a block
    calls = count % 2 + (2 if count // 2 > 1 else 0) + (2 if count > 1 else 0)  # the first, the loop's pair, the last
    assert src.count(f"dq_decode_fragment<{fmt.kind}, {t.block_K}, {fmt.group}, {t.block_N},") == calls * t.block_N // 64
    hgmma = len(re.findall(r"\bHGMMA\.", sass))
    waits_for_all = len(re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0", sass))
    assert hgmma and waits_for_all < hgmma // 2, (hgmma, waits_for_all)
    assert not early_accumulator_reads(sass)
    if t.split_k > 1:
        assert "dq_cluster_reduce<" in src and "dq_cluster_barriers<2>();" in src


def test_early_accumulator_reads_finds_sums_read_under_their_wgmma():
    """The SASS check above on the sequence ptxas emitted before the fix (accumulators R24-R87), and after it."""
    hgmma = "HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR16], R24, gsb0 ;"
    before = [hgmma, "WARPGROUP.DEPBAR.LE gsb0, 0x1 ;", "F2FP.BF16.F32.PACK_AB R115, R87, R86 ;",
              "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;"]
    after = [hgmma, "IADD3 R2, R3, R6, R2 ;", "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;", "F2FP.BF16.F32.PACK_AB R115, R87, R86 ;"]
    assert early_accumulator_reads("\n".join(f"/*{i:04x}*/ {s}" for i, s in enumerate(before))) == [
        "F2FP.BF16.F32.PACK_AB R115, R87, R86"]
    assert early_accumulator_reads("\n".join(after)) == []


# ---------------------------------------------------------------- tinygemm, the library peer


def _tinygemm_ops(M=8, N=64, K=512, seed=3):
    A, B = _inputs(M, N, K, seed)
    return A, B, FORMATS[dqf.TINYGEMM_FORMAT].quantize(A, B)


def test_tinygemm_format_layout_and_values():
    A, B, ops = _tinygemm_ops()
    assert ops["B"].dtype == torch.uint8 and ops["B"].shape == (64, 256)
    assert ops["scale_and_zero"].dtype == torch.bfloat16 and ops["scale_and_zero"].shape == (4, 64, 2)
    q = torch.stack([ops["B"] >> 4, ops["B"] & 15], -1).reshape(64, 512)
    assert int(q.min()) >= 0 and int(q.max()) <= 15
    s, z = ops["scale_and_zero"][..., 0].float(), ops["scale_and_zero"][..., 1].float()
    w = dqf.tinygemm_weight(ops)
    # element 2i in the high nibble: the first weight of row 0 is (q0 - 8)·s + z with q0 = B[0, 0] >> 4
    assert w[0, 0].item() == ((int(ops["B"][0, 0]) >> 4) - 8) * s[0, 0].item() + z[0, 0].item()
    assert w[0, 1].item() == ((int(ops["B"][0, 0]) & 15) - 8) * s[0, 0].item() + z[0, 0].item()
    # the nearest code of the stored scale and zero: half a step, plus what a clamped end code loses to
    # the bf16 roundings of s and z (z is a value, rounded to bf16 relative to its own size)
    err = (w - B.double()).abs()
    step = s.T.repeat_interleave(dqf.TINYGEMM_GROUP, 1).double()
    zero = z.T.repeat_interleave(dqf.TINYGEMM_GROUP, 1).double().abs()
    assert bool((err <= 0.55 * step + 2 ** -8 * zero).all())
    assert 0.05 < rel_fro(w, B) < 0.115
    assert FORMATS[dqf.TINYGEMM_FORMAT].dequantize(ops)[1].dtype == torch.float64


def test_tinygemm_emulation_matches_torchs_cpu_tinygemm():
    """torch ships a CPU tinygemm (``_weight_int4pack_mm_for_cpu``) with the same format: the emulation
    agrees with it to bf16 roundings (of the weights, which it may not round, and of the output), measured
    against the size of the products (|A|·|W|ᵀ): about 1e-3; a wrong nibble order or zero would be O(1)."""
    A, B, ops = _tinygemm_ops(M=5, N=64, K=384)
    q = torch.stack([ops["B"] >> 4, ops["B"] & 15], -1).reshape(64, 384).int()
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 2)
    ref = torch._weight_int4pack_mm_for_cpu(ops["A"], packed, dqf.TINYGEMM_GROUP, ops["scale_and_zero"]).float()
    got = VARIANTS["tinygemm_w4_g128"].emulate(ops).float()
    assert got.dtype == torch.float32 and got.shape == (5, 64)
    magnitude = ops["A"].float().abs() @ dqf.tinygemm_weight(ops).float().abs().T
    assert bool(((got - ref).abs() <= 2 ** -8 * magnitude).all())
    exact = A.to(torch.bfloat16).double() @ dqf.tinygemm_weight(ops).T
    assert rel_fro(got, exact) < 4e-3  # bf16 weights and output, fp32 sums


def test_tinygemm_refuses_bad_weights_and_shapes():
    with pytest.raises(ValueError, match="w4_tinygemm_g128.*multiple of 128"):
        dqf.quantize_tinygemm_weight(torch.zeros(8, 200))
    with pytest.raises(ValueError, match="w4_tinygemm_g128"):
        dqf.quantize_tinygemm_weight(torch.full((8, 128), float("nan")))
    assert peers.tinygemm_shape_limit(16, 8192, 8192) is None
    assert "N=60" in peers.tinygemm_shape_limit(1, 60, 256)
    v = VARIANTS["tinygemm_w4_g128"]
    assert v.kernel is None and v.baseline == "cublas_bf16" and v.min_cc == 80
    for name in FORMAT_NAMES:  # the second column of every W4A16 kernel
        assert VARIANTS[f"dequant_{name}"].second_baseline == v.name


def test_tinygemm_zero_group_is_exact():
    B = torch.zeros(4, 256)
    B[1, :128] = torch.linspace(-2, 3, 128)
    ops = dqf.quantize_tinygemm_weight(B)
    w = dqf.tinygemm_weight(ops)
    assert not w[0].any() and not w[1, 128:].any() and bool(torch.isfinite(w).all())
    assert w[1, :128].min() == pytest.approx(-2, abs=0.2) and w[1, :128].max() == pytest.approx(3, abs=0.2)
