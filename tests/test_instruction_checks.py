"""Every instruction check names an instruction and its operand dtypes: each pattern matches its own
variant's generated CUDA and no source of another instruction class or dtype (a fallback fails). The
same for the SASS checks, on the real cubins of those kernels (sm_89, sm_90a, sm_100a): each matches
the tensor-core opcodes ptxas emitted for its own variant and target, and those of no other."""
import copy
import re

import pytest
from conftest import DEFAULT_CONFIG

from harness import sass
from harness.plan import Plan, validate
from kernels.registry import VARIANTS, load_all
from kernels.tiles import parse_shape

load_all()

TARGETS = ("sm_89", "sm_90a", "sm_100a")
# What is compiled (25 kernels): one source per variant and target, except for variants that share a
# kernel factory and its instructions with a compiled one (STAND_INS), to keep CI's two cores free
CORPUS = {
    "fp8_e4m3": TARGETS,
    "fp8_e5m2": TARGETS,
    "int4_mma": TARGETS,
    "int4_unpack_s8": ("sm_90a",),
    "int4_unpack_s8_ss": ("sm_90a",),
    "int4_ws": ("sm_90a",),  # wgmma only, like the fp8 warp-specialized kernels
    "int8_tilelang": TARGETS,
    "blockscaled_sm90": ("sm_90a",),  # warp-specialized by hand: wgmma only
    "blockscaled_g128": TARGETS,
    "blockscaled_sm100": ("sm_100a",),
    "dequant_w4_int4_sym_g128": TARGETS,
    "fp8_e4m3_ws": ("sm_90a",),  # wgmma only: sm_89 and sm_100a are declared unsupported
    "fp8_e5m2_ws": ("sm_90a",),
}
STAND_INS = {
    "fp8_e4m3_ws_promoted": "fp8_e4m3_ws",  # a second accumulator; the same fp8 wgmma
    "dequant_w4_uint4_zp_g128": "dequant_w4_int4_sym_g128",  # another weight decode; the same bf16 wgmma
    "dequant_w4_e2m1_g32": "dequant_w4_int4_sym_g128",
    "dequant_w4_mxfp4": "dequant_w4_int4_sym_g128",
}
TILELANG = sorted(n for n, v in VARIANTS.items() if v.kernel is not None)
CHECKS = [(n, t) for n in TILELANG for t in sorted(VARIANTS[n].instructions)]
SASS_CHECKS = [(n, t) for n in TILELANG for t in sorted(VARIANTS[n].sass)]


# TileLang's tensor-core calls: tl::<instruction><tl::DataType::<A>[, <B>, <C>] ...>; read independently
# of the patterns under test, so that "another instruction class or dtype" does not depend on them
_MMA_CALL = re.compile(r"tl::(\w+)<(tl::DataType::\w+(?:, tl::DataType::\w+)*)")


def instruction_signature(source: str) -> frozenset[tuple[str, str]]:
    return frozenset(_MMA_CALL.findall(source))


def _factory(name):
    k = VARIANTS[name].kernel
    return getattr(k, "func", k)


@pytest.fixture(scope="module")
def corpus(_kernel_builds) -> dict[tuple[str, str], object]:
    """Each variant's first tile for each target in config.yaml, at the compile-check shape: the kernels the
    main job's compile check builds too."""
    plan = Plan(validate(copy.deepcopy(DEFAULT_CONFIG), check_shapes=False))

    def first_check(name: str, arch: str):
        tile, shapes = next((tile, shapes) for t, tile, shapes in plan.check_compile_jobs(name) if t == arch)
        return _kernel_builds(name, tile, arch, parse_shape(shapes[0]))  # K raised for a split tile

    return {(name, arch): first_check(name, arch) for name, targets in CORPUS.items() for arch in targets}


@pytest.fixture(scope="module")
def sources(corpus) -> dict[tuple[str, str], str]:
    return {key: k.source for key, k in corpus.items()}


@pytest.fixture(scope="module")
def sass_ops(corpus) -> dict[tuple[str, str], dict[str, int]]:
    """The tensor-core opcodes of each kernel's real cubin (the one TileLang loads), as disassembled by
    the compile record."""
    return {key: sass.tensor_core_ops(sass.opcodes(k.sass)) for key, k in corpus.items()}


def test_corpus_covers_every_checked_target():
    assert set(CORPUS) | set(STAND_INS) == set(TILELANG)
    for name, stand_in in STAND_INS.items():
        assert _factory(name) is _factory(stand_in) and VARIANTS[name].instructions == VARIANTS[stand_in].instructions
        assert VARIANTS[name].sass == VARIANTS[stand_in].sass
    for name, targets in CORPUS.items():
        assert set(targets) == set(VARIANTS[name].instructions) == set(VARIANTS[name].sass), name
    for name in TILELANG:  # every target the config may name is either checked or declared unsupported
        assert set(TARGETS) <= set(VARIANTS[name].instructions) | set(VARIANTS[name].unsupported), name
        assert set(TARGETS) <= set(VARIANTS[name].sass) | set(VARIANTS[name].unsupported), name


@pytest.mark.compile
def test_every_source_has_one_tensor_core_instruction(sources):
    for key, src in sources.items():
        assert len(instruction_signature(src)) == 1, (key, instruction_signature(src))


@pytest.mark.compile
@pytest.mark.parametrize("name,arch", CHECKS)
def test_pattern_matches_its_own_source(sources, name, arch):
    pattern = VARIANTS[name].instructions[arch]
    assert re.search(pattern, sources[STAND_INS.get(name, name), arch]), f"{name} on {arch}: /{pattern}/"


@pytest.mark.compile
@pytest.mark.parametrize("name,arch", CHECKS)
def test_pattern_rejects_every_other_instruction_or_dtype(sources, name, arch):
    pattern = VARIANTS[name].instructions[arch]
    assert not re.search(pattern, "")
    own = instruction_signature(sources[STAND_INS.get(name, name), arch])
    wrongly = [key for key, src in sources.items() if instruction_signature(src) != own and re.search(pattern, src)]
    assert not wrongly, f"{name} on {arch}: /{pattern}/ also matches {wrongly}"


@pytest.mark.compile
def test_fallbacks_named_in_issue_9_fail(sources):
    fp8 = VARIANTS["fp8_e4m3"].instructions
    # wgmma expected on sm_90a: the sm_89 build of the same kernel (mma.sync) is refused
    assert not re.search(fp8["sm_90a"], sources["fp8_e4m3", "sm_89"])
    # fp8 mma.sync expected on sm_100a: bf16 (dequant), int8 and e5m2 mma.sync are refused
    for other in ("dequant_w4_int4_sym_g128", "int8_tilelang", "fp8_e5m2"):
        assert not re.search(fp8["sm_100a"], sources[other, "sm_100a"]), other
    # the block-scaled kernels' sm_89 check wants fp8 operands, not int8 ones
    assert not re.search(VARIANTS["blockscaled_g128"].instructions["sm_89"], sources["int8_tilelang", "sm_89"])


# ---- the SASS checks, on real cubins --------------------------------------------------------------


@pytest.mark.compile
def test_every_kernel_has_one_tensor_core_opcode(sass_ops):
    for key, ops in sass_ops.items():
        assert len(ops) == 1, (key, ops)


@pytest.mark.compile
@pytest.mark.parametrize("name,arch", SASS_CHECKS)
def test_sass_pattern_matches_its_own_cubin(sass_ops, name, arch):
    pattern = VARIANTS[name].sass[arch]
    assert not sass.check(pattern, sass_ops[STAND_INS.get(name, name), arch]), (name, arch, sass_ops)


@pytest.mark.compile
@pytest.mark.parametrize("name,arch", SASS_CHECKS)
def test_sass_pattern_rejects_every_other_opcode(sass_ops, name, arch):
    pattern = VARIANTS[name].sass[arch]
    def kinds(ops):  # the instruction and its types, whatever its tile shape (IGMMA.64x128x32 or 64x256x32)
        return {sass.short_name(op) for op in ops}

    own = kinds(sass_ops[STAND_INS.get(name, name), arch])
    wrongly = [key for key, ops in sass_ops.items() if kinds(ops) != own and not sass.check(pattern, ops)]
    assert not wrongly, f"{name} on {arch}: /{pattern}/ also matches {wrongly}"
    assert sass.check(pattern, {})  # no tensor-core instruction at all fails


@pytest.mark.compile
def test_sass_classes_per_target(sass_ops):
    """What ptxas makes of TileLang 0.1.15's kernels, class by class (seen; see kernels/*.py)."""
    def classes(key):
        return {op.split(".")[0] for op in sass_ops[key]}

    for kind in ("e4m3", "e5m2"):
        assert classes((f"fp8_{kind}", "sm_90a")) == classes((f"fp8_{kind}_ws", "sm_90a")) == {"QGMMA"}  # fp8 wgmma
        assert any(kind.upper() in op for op in sass_ops[f"fp8_{kind}", "sm_90a"])
        assert classes((f"fp8_{kind}", "sm_89")) == {"QMMA"}  # fp8 mma.sync
        assert sass_ops[f"fp8_{kind}", "sm_100a"].keys() == {"HMMA.16816.F32"}  # no fp8 mma.sync on sm_100a
    assert classes(("int8_tilelang", "sm_90a")) == classes(("int4_unpack_s8", "sm_90a")) == {"IGMMA"}
    assert classes(("dequant_w4_int4_sym_g128", "sm_90a")) == {"HGMMA"}
    assert classes(("blockscaled_sm90", "sm_90a")) == {"QGMMA"}
    assert classes(("blockscaled_sm100", "sm_100a")) == {"UTCQMMA"}  # tcgen05
    # Hopper and Blackwell have no int4 tensor cores: s4 mma.sync becomes s8 IMMA; Ada has s4 IMMA
    assert sass_ops["int4_mma", "sm_89"].keys() == {"IMMA.16864.S4.S4"}
    assert sass_ops["int4_mma", "sm_90a"].keys() == sass_ops["int4_mma", "sm_100a"].keys() == {"IMMA.16832.S8.S8"}
