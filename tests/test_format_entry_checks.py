"""Issue 30: every format's entry refuses bad operands by name, the building blocks refuse bad values
instead of coding them silently, kernel factories refuse M, N, K <= 0, the public API says what is wrong
and what to pass, and a format's code reaches no kernel module (an edited kernel reruns no inputs job).

CPU only: no kernel is traced (the factories' shape check comes before TileLang is imported).
"""
import re
from pathlib import Path

import pytest
import torch
from conftest import REPO

from harness.deps import import_closure
from kernels import blockscaled_formats as bsf
from kernels import dequant_formats as dqf
from kernels import formats as fm
from kernels import int4_formats as i4f
from kernels.registry import FAMILY_MODULES, FORMATS, VARIANTS, get_format, get_variant, load_all
from kernels.tiles import parse_tile

load_all()
FORMAT_NAMES = sorted(FORMATS)
M, N, K = 64, 128, 256  # whole blocks and groups for every format
NAN, INF = float("nan"), float("inf")


def _normal(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _refuses(call, pattern: str, exc=ValueError):
    with pytest.raises(exc, match=pattern) as info:
        call()
    return info.value


# ---- 1. every format's entry: operand shapes, dtypes, values ------------------------------------

BAD_OPERANDS = {  # name -> (A, B, operand named, problem)
    "k_mismatch": (lambda: (_normal(M, K), _normal(N, K // 2)), "B", r"do not share K.*needs 256 columns, not 128"),
    "a_1d": (lambda: (_normal(K), _normal(N, K)), "A", r"must be 2-D, got shape \(256,\)"),
    "b_1d": (lambda: (_normal(M, K), _normal(K)), "B", r"must be 2-D, got shape \(256,\)"),
    "a_3d": (lambda: (_normal(2, M, K), _normal(N, K)), "A", r"must be 2-D, got shape \(2, 64, 256\)"),
    "b_3d": (lambda: (_normal(M, K), _normal(1, N, K)), "B", r"must be 2-D, got shape \(1, 128, 256\)"),
    "a_int": (lambda: (torch.ones(M, K, dtype=torch.int32), _normal(N, K)), "A", r"floating-point tensor.*got torch\.int32"),
    "b_bool": (lambda: (_normal(M, K), torch.ones(N, K, dtype=torch.bool)), "B", r"floating-point tensor.*got torch\.bool"),
    "a_list": (lambda: ([[1.0] * K] * M, _normal(N, K)), "A", r"floating-point tensor.*got list"),
    "empty_k": (lambda: (_normal(M, K)[:, :0], _normal(N, K)[:, :0]), "A", r"empty tensor of shape \(64, 0\)"),
    "empty_n": (lambda: (_normal(M, K), _normal(N, K)[:0]), "B", r"empty tensor of shape \(0, 256\)"),
    "b_nan": (lambda: (_normal(M, K), _normal(N, K).index_fill_(0, torch.tensor([3]), NAN)), "B", r"NaN or Inf: nan at index \(3, 0\)"),
    "a_fp8_nan": (lambda: (torch.full((M, K), NAN).to(torch.float8_e4m3fn), _normal(N, K)), "A", r"NaN or Inf: nan at index \(0, 0\)"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPERANDS))
@pytest.mark.parametrize("fmt_name", FORMAT_NAMES)
def test_every_format_refuses_bad_operands_naming_format_and_operand(fmt_name, case):
    make, operand, problem = BAD_OPERANDS[case]
    A, B = make()
    # a ValueError (a wrong dtype is also a TypeError) naming the format, the operand and the problem
    msg = str(_refuses(lambda: FORMATS[fmt_name].quantize(A, B), problem))
    assert msg.startswith(fmt_name) and re.search(rf"\boperands? (A .*)?{operand}\b", msg), msg


@pytest.mark.parametrize("fmt_name", FORMAT_NAMES)
def test_every_format_takes_any_floating_dtype_of_finite_values(fmt_name):
    # fp8 / bf16 / float64 inputs pass the shared check (isfinite has no fp8 kernel: it must not be called on one)
    A = _normal(M, K).to(torch.float8_e4m3fn)
    FORMATS[fmt_name].quantize(A, _normal(N, K, seed=2).double())


def _needed_keys(fmt_name: str) -> list[str]:
    ops = FORMATS[fmt_name].quantize(_normal(M, K), _normal(N, K, seed=2))
    needed = []
    for key in sorted(ops):
        try:
            FORMATS[fmt_name].dequantize({k: v for k, v in ops.items() if k != key})
        except KeyError as e:
            assert f"format {fmt_name}'s dequantize needs operand {key!r}" in str(e), str(e)
            needed.append(key)
    return needed


@pytest.mark.parametrize("fmt_name", FORMAT_NAMES)
def test_dequantize_names_the_missing_key_and_the_format(fmt_name):
    assert "A" in _needed_keys(fmt_name) or "A_packed" in _needed_keys(fmt_name)
    e = _refuses(lambda: FORMATS[fmt_name].dequantize({}), rf"format {re.escape(fmt_name)}'s dequantize needs operand '", KeyError)
    assert isinstance(e, ValueError) and "which the dict lacks (it holds nothing)" in str(e)
    _refuses(lambda: FORMATS[fmt_name].dequantize((torch.ones(2, 2),)),
             rf"{re.escape(fmt_name)}'s dequantize takes the dict.*got tuple", TypeError)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_emulate_with_wrong_operands_says_what_to_pass(name):
    v = VARIANTS[name]
    _refuses(lambda: v.emulate({}), r"needs operand '.*which the dict lacks.*pass the dict its format's quantize\(A, B\) returns",
             KeyError)
    _refuses(lambda: v.emulate((_normal(M, K), _normal(N, K))),
             r"takes the dict of operands its format's quantize\(A, B\) returns, got tuple", TypeError)
    ops = FORMATS[v.input_format].quantize(_normal(M, K), _normal(N, K, seed=2))
    v.emulate(ops)  # the operands of its own format still work


# ---- 2. building blocks do not code bad values silently ------------------------------------------

@pytest.mark.parametrize("encoder", [fm.e2m1_encode, fm.encode_int4])
def test_encoders_refuse_nan(encoder):
    _refuses(lambda: encoder(torch.tensor([1.0, NAN, -NAN])), rf"{encoder.__name__}: x holds NaN.*nan at index \(1,\) \(2 of 3")
    # every other value keeps its code; e2m1 still saturates ±Inf like any value beyond ±6 (documented)
    if encoder is fm.e2m1_encode:
        assert encoder(torch.tensor([INF, -INF, 7.0, 0.2])).tolist() == [7, 15, 7, 0]


@pytest.mark.parametrize("bad", [NAN, -1.0, -1e-30, INF])
@pytest.mark.parametrize("who", ["amax_scale", "mx_exponent"])
def test_scale_rules_refuse_nan_negative_and_infinite_amax(who, bad):
    amax = torch.tensor([1.0, bad])
    call = (lambda: fm.amax_scale(amax, 448.0)) if who == "amax_scale" else (lambda: fm.mx_exponent(amax, fm.E4M3_EMAX))
    _refuses(call, rf"{who}: amax must be finite and >= 0.*got {re.escape(f'{bad:.8g}')} at index \(1,\)")


def test_amax_scale_in_float64_past_fp32_range_and_bit_identical_below_it():
    # a range max - min of ±3e38 (float64) overflows fp32: its scale is still the finite range / 15
    s = fm.amax_scale(torch.tensor([6e38], dtype=torch.float64), 15, torch.bfloat16)
    assert torch.isfinite(s.float()).all() and abs(s.float().item() / 4e37 - 1) < 2**-8
    # and wherever fp32 holds the difference, the float64 path gives the fp32 scale bit for bit
    g = torch.Generator().manual_seed(0)
    hi = torch.randn(4096, generator=g).abs() * torch.logspace(-40, 38, 4096)
    lo = -torch.randn(4096, generator=g).abs() * torch.logspace(38, -40, 4096)
    finite = torch.isfinite(hi - lo)
    for dtype in (torch.bfloat16, torch.float32):
        assert torch.equal(fm.amax_scale((hi.double() - lo.double())[finite], 15, dtype), fm.amax_scale((hi - lo)[finite], 15, dtype))


def test_e8m0_encode_refuses_fractions_and_nan_and_names_the_value():
    assert fm.e8m0_encode(torch.tensor([-3.0, 0.0, 5.0])).tolist() == [124, 127, 132]  # integral floats still code
    _refuses(lambda: fm.e8m0_encode(torch.tensor([1.0, 1.5])), r"e8m0_encode: exponent must hold integers, got 1\.5 at index \(1,\)")
    _refuses(lambda: fm.e8m0_encode(torch.tensor([NAN])), r"e8m0_encode: exponent must hold integers, got nan")
    _refuses(lambda: fm.e8m0_encode(torch.tensor([200])), r"e8m0_encode: exponents must lie in \[-127, 127\], got 200")


@pytest.mark.parametrize("fmt_name", ["w4_uint4_zp_g128", "w4_tinygemm_g128"])
def test_zero_point_formats_keep_a_group_spanning_both_ends_of_fp32_finite(fmt_name):
    B = _normal(N, K, seed=2)
    B[0, 0], B[0, 1] = 3e38, -3e38  # max - min overflows fp32
    A = _normal(M, K)
    ops = FORMATS[fmt_name].quantize(A, B)
    _, w = FORMATS[fmt_name].dequantize(ops)
    assert bool(torch.isfinite(w).all()), f"{fmt_name}: NaN/Inf weights"
    step = 6e38 / 15  # one code step of that group: every weight of it within one step
    assert (w[0, :128] - B[0, :128].double()).abs().max().item() <= step
    assert torch.equal(w[1:], FORMATS[fmt_name].dequantize(FORMATS[fmt_name].quantize(A, B[1:]))[1])  # other rows as before
    assert bool(torch.isfinite(w.to(torch.bfloat16).float()).all())  # the bf16 weight the kernels multiply too


@pytest.mark.parametrize("fmt_name", ["bf16", "w4_int4_sym_g128", "w4_uint4_zp_g128", "w4_e2m1_g32", "w4_mxfp4", "w4_tinygemm_g128"])
def test_bf16_activation_beyond_its_range_is_refused_with_the_value(fmt_name):
    A = _normal(M, K)
    A[2, 5] = 3.4e38  # finite in fp32, Inf in bf16 (bf16's max is 3.3895e38)
    _refuses(lambda: FORMATS[fmt_name].quantize(A, _normal(N, K, seed=2)),
             rf"^{re.escape(fmt_name)}: operand A.* holds 3\.4e\+38 at index \(2, 5\), beyond bf16's largest finite value 3\.38953e\+38")
    A[2, 5] = torch.finfo(torch.bfloat16).max  # the largest bf16 still passes
    FORMATS[fmt_name].quantize(A, _normal(N, K, seed=2))


# ---- 3. kernel factories refuse M, N, K <= 0 -----------------------------------------------------

KERNEL_VARIANTS = sorted(n for n, v in VARIANTS.items() if v.kernel is not None)
TILE = parse_tile("m128n128k128_s2_t128")


@pytest.mark.parametrize("dims,named", [((0, 128, 256), "M"), ((-64, 128, 256), "M"), ((64, 0, 256), "N"),
                                        ((64, 128, -128), "K"), ((64.0, 128, 256), "M"), ((64, 128, True), "K")])
@pytest.mark.parametrize("name", KERNEL_VARIANTS)
def test_kernel_factories_refuse_non_positive_dimensions_by_name(name, dims, named):
    _refuses(lambda: VARIANTS[name].kernel(*dims, TILE), rf"\b{named} \(.*\) must be a positive integer, got")


# ---- 4. the public API: unknown names, wrong arguments -------------------------------------------

def test_unknown_names_say_what_there_is():
    _refuses(lambda: get_variant("fp8_e4m"), r"unknown variant 'fp8_e4m'; did you mean 'fp8_e4m3'", KeyError)
    _refuses(lambda: get_variant("fp8_e4m3_tensor"), r"'fp8_e4m3_tensor' is an input format; its variants: .*fp8_e4m3_ws", KeyError)
    _refuses(lambda: get_format("fp8_e4m3"), r"'fp8_e4m3' is a variant; its input format is 'fp8_e4m3_tensor'", KeyError)
    e = _refuses(lambda: get_format("nope"), r"^unknown input format 'nope'; known: bf16, ", KeyError)
    assert str(e).startswith("unknown")  # no quoted repr around the message
    _refuses(lambda: get_variant(VARIANTS["fp8_e4m3"]), r"by its name \(a str\), got Variant; pass its \.name, 'fp8_e4m3'", TypeError)
    _refuses(lambda: get_format(None), r"by its name \(a str\), got NoneType", TypeError)


X = torch.ones(4, 64)
HELPER_PROBES = [
    # (call, pattern); every one a ValueError (wrong types also TypeError)
    (lambda: fm.amax_scale(torch.ones(2), 0), r"amax_scale: qmax must be a positive finite number, got 0"),
    (lambda: fm.amax_scale(torch.ones(2), NAN), r"amax_scale: qmax must be a positive finite number, got nan"),
    (lambda: fm.amax_scale(torch.ones(2), "7"), r"amax_scale: qmax must be a positive finite number, got str"),
    (lambda: fm.amax_scale(torch.ones(2), 7, torch.int8), r"amax_scale: dtype must be a floating-point torch.dtype"),
    (lambda: fm.amax_scale([1.0], 7), r"amax_scale: amax must be a torch.Tensor \(or a number\), got list"),
    (lambda: fm.mx_exponent(torch.ones(2), 8, 5, -5), r"mx_exponent: min_exponent=5 is above max_exponent=-5"),
    (lambda: fm.e8m0_encode(torch.tensor([True])), r"e8m0_encode: exponent must be an integer tensor, got torch.bool"),
    (lambda: fm.e8m0_decode(torch.tensor([127])), r"e8m0_decode: E8M0 codes must be uint8, got torch.int64"),
    (lambda: fm.pack_e8m0_words(torch.ones(8, dtype=torch.uint8)), r"pack_e8m0_words: codes must be 2-D .*got shape \(8,\)"),
    (lambda: fm.pack_e8m0_words(torch.ones(2, 8, dtype=torch.int32)),
     r"pack_e8m0_words: codes must be uint8 E8M0 codes, got torch.int32"),
    (lambda: fm.block_view(torch.ones(64), 1, 32), r"block_view: x must be 2-D .*got shape \(64,\)"),
    (lambda: fm.block_view(X, 0, 32), r"block_view: rows must be a positive integer, got 0"),
    (lambda: fm.block_view(X, 1, -32), r"block_view: cols must be a positive integer, got -32"),
    (lambda: fm.expand_blocks(torch.ones(4, 2), 1, 0, 4, 64), r"expand_blocks: cols must be a positive integer, got 0"),
    (lambda: fm.expand_blocks(torch.ones(4, 1), 1, 32, 4, 64),
     r"expand_blocks: scales of shape \(4, 1\) do not cover the \(4, 64\) operand"),
    (lambda: fm.expand_blocks(torch.ones(4), 1, 32, 4, 64), r"expand_blocks: scales must be 2-D"),
    (lambda: fm.ceil_div(5, 0), r"ceil_div: b \(the divisor: a block or group size\) must be a positive integer, got 0"),
    (lambda: fm.round_up(5, 0), r"ceil_div: b .* must be a positive integer, got 0"),
    (lambda: fm.quantize_blocks(X, 7, torch.float32, fm.encode_int4), r"quantize_blocks: blocks of shape \(4, 64\) have no dims \(1, 3\)"),
    (lambda: fm.quantize_blocks(X.int(), 7, torch.float32, fm.encode_int4),
     r"quantize_blocks: blocks must be a floating-point tensor, got torch.int32"),
    (lambda: fm.quantize_mx_blocks(X, 2, fm.e2m1_encode), r"quantize_mx_blocks: blocks of shape \(4, 64\) have no dims \(1, 3\)"),
    (lambda: fm.quantize_tensor([1.0], 7, fm.encode_int4), r"quantize_tensor: x must be a torch.Tensor"),
    (lambda: fm.saturate_fp8(X, torch.int8), r"saturate_fp8: dtype must be a floating-point torch.dtype"),
    (lambda: fm.pack_codes(torch.tensor([3.5, 1.0])), r"pack_codes: codes must be integers, got 3\.5 at index \(0,\)"),
    (lambda: fm.pack_codes(torch.tensor([16, 0])), r"pack_codes: codes must lie in \[0, 15\], got 16 at index \(0,\)"),
    (lambda: fm.pack_codes([1, 2]), r"pack_codes expects a torch.Tensor of integer codes, got list"),
    (lambda: fm.e2m1_decode(torch.tensor([16])), r"e2m1_decode: codes must lie in \[0, 15\], got 16"),
    (lambda: fm.e2m1_decode(torch.tensor([1.5])), r"e2m1_decode: codes must be integers, got 1\.5"),
    (lambda: fm.unpack_int4(torch.ones(4, dtype=torch.uint8)), r"unpack_int4 expects packed bytes stored as torch.int8, got torch.uint8"),
    (lambda: fm.check_operand(torch.tensor([1.0, NAN]).to(torch.float8_e5m2), "q", "A"),
     r"q: operand A contains NaN or Inf: nan at index \(1,\)"),  # torch has no isfinite for fp8: not NotImplementedError
    (lambda: fm.check_operand(torch.ones(2, dtype=torch.int8), "q", "A"),
     r"q expects a floating-point tensor for operand A, got torch.int8"),
    (lambda: fm.check_gemm_shape("f", 64, 0, 128), r"f: N \(rows of B, columns of C\) must be a positive integer, got 0"),
    (lambda: bsf.quantize_e4m3_blocks(torch.ones(64), 1, 128), r"quantize_e4m3_blocks: the input must be 2-D"),
    (lambda: bsf.quantize_e4m3_blocks(X, 0, 128), r"block_view: rows must be a positive integer, got 0"),
    (lambda: bsf.quantize_mxfp8(torch.ones(2, 4, 64), operand="B"), r"quantize_mxfp8: operand B must be 2-D"),
    (lambda: bsf.utccp_scale_layout(torch.ones(4, 2, dtype=torch.uint8)), r"utccp_scale_layout: words must be a 2-D int32 tensor"),
    (lambda: dqf.quantize_weight(_normal(N, K), "w4_nope"), r"quantize_weight: fmt must be a W4Format or the name of one \(w4_e2m1_g32, "),
    (lambda: dqf.quantize_weight(_normal(K), "w4_int4_sym_g128"), r"w4_int4_sym_g128: operand B \(the weight\) must be 2-D"),
    (lambda: dqf.quantize_weight(_normal(N, 100), "w4_int4_sym_g128"), r"w4_int4_sym_g128: K=100 must be a multiple of 128"),
    (lambda: dqf.weight_values({}, "w4_uint4_zp_g128"), r"weight_values needs operand 'B', 'scales', 'zeros'"),
    (lambda: dqf.tinygemm_weight({"B": torch.ones(2, 64, dtype=torch.int8), "scale_and_zero": torch.ones(1, 2, 2)}),
     r"tinygemm_weight: B must hold tinygemm's packed uint8 codes, got torch.int8"),
    (lambda: i4f.int_operands({"A": torch.ones(2, 2)}), r"int_operands \(A_packed and B_packed, or A and B\) needs operand 'B'"),
    (lambda: VARIANTS["int4_mma"].to_real(torch.ones(2, 2), {}), r"int_to_real needs operand 'scale_a', 'scale_b'"),
    (lambda: FORMATS["int4_tensor"].quantize(_normal(M, K), _normal(N, K, seed=2)) and
     FORMATS["int4_tensor"].dequantize({"A_packed": torch.ones(2, 2, dtype=torch.int8)}),
     r"format int4_tensor's dequantize needs operand 'B_packed', 'scale_a', 'scale_b'"),
]


@pytest.mark.parametrize("i", range(len(HELPER_PROBES)))
def test_helpers_with_wrong_arguments_say_what_is_wrong(i):
    call, pattern = HELPER_PROBES[i]
    _refuses(call, pattern)


# ---- 5. a format's code imports no kernel --------------------------------------------------------

def _module_of(fn) -> str:  # as workflow/rules/common.smk's _format_modules: a partial's module is its .func's
    while hasattr(fn, "func"):
        fn = fn.func
    return fn.__module__


# the kernels, the library launches (kernels/peers.py) and the family modules that register them
KERNEL_MODULE_FILES = {f"kernels/{m}.py" for m in ("fp8_ws", "tn_gemm", "int4_ws", "blockscaled_sm90", "warp_specialized", "peers")} | {
    _module_of(v.kernel).replace(".", "/") + ".py" for v in VARIANTS.values() if v.kernel is not None} | {
    m.replace(".", "/") + ".py" for m in FAMILY_MODULES}


def test_the_kernel_module_list_is_real():
    assert {"kernels/fp8_pipelined.py", "kernels/int4_unpack_s8.py", "kernels/blockscaled_g128.py",
            "kernels/dequant_w4.py", "kernels/dequant.py", "kernels/peers.py"} <= KERNEL_MODULE_FILES
    assert all((REPO / f).is_file() for f in KERNEL_MODULE_FILES)


@pytest.mark.parametrize("fmt_name", FORMAT_NAMES)
def test_a_formats_import_closure_reaches_no_kernel_module(fmt_name):
    # the inputs job's code inputs: editing a kernel must not rerun the inputs (and with them every emulation)
    fmt = FORMATS[fmt_name]
    closure = import_closure(sorted({_module_of(fmt.quantize), _module_of(fmt.dequantize)}), Path(REPO))
    assert not set(closure) & KERNEL_MODULE_FILES, f"{fmt_name}: {sorted(set(closure) & KERNEL_MODULE_FILES)}"
